"""Experiment harnesses on top of the simulator (the lab, not the product): the gated run mode
(`gated.py`: re-plan, shadow-gate, fall back) and live failure repair (`repair.py`)."""
