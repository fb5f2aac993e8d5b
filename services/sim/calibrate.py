"""Planner inputs from the engine profile and the workload: q_cap and W (SPEC sections 1, 5).

q_cap is measured on the simulated engine by the knee search in services/sim/knee.py (the
algorithm and its knobs are in that module's header); here it is bound to the simulator's
one-replica run (services.sim.simulator.p99_alone). W is the pure formula in
services/core/warm.py, re-exported. Callers keep `calibrate.q_cap_for(profile, requests, R)`.
"""

from __future__ import annotations

from typing import Sequence

from services.core.engine import EngineProfile
from services.core.request import Request
from services.core.warm import warm_slots
from services.sim import knee
from services.sim.knee import replica_slice
from services.sim.simulator import p99_alone

__all__ = ["calibrate_q_cap", "p99_at", "q_cap_for", "replica_slice", "warm_slots"]


def p99_at(profile: EngineProfile, stream: Sequence[Request], qps: float, **knobs) -> float:
    """knee.p99_at on the simulator: p99 TTFT of one replica fed `stream` at `qps`."""
    return knee.p99_at(profile, stream, qps, run=p99_alone, **knobs)


def calibrate_q_cap(profile: EngineProfile, requests: Sequence[Request], replicas: int, **knobs) -> float:
    """knee.calibrate_q_cap on the simulator (uncached)."""
    return knee.calibrate_q_cap(profile, requests, replicas, run=p99_alone, **knobs)


def q_cap_for(profile: EngineProfile, requests: Sequence[Request], replicas: int, **knobs) -> float:
    """knee.q_cap_for on the simulator: calibrated once per process and workload fingerprint."""
    return knee.q_cap_for(profile, requests, replicas, run=p99_alone, **knobs)
