"""The discrete-event simulator, its calibration, the shadow gate's replays and trace files."""
