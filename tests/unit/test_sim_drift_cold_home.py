"""bench/peers.py's engine-bound (d) drift point in simulated time (experiments/bound_drift.py: the
live planner's loop, 16 wall req/s, seed 1): the cold-home rule is what keeps the bursts of
evicted tenants' cold prefills after each rank rotation from queueing on their homes. Without
it (cold_home=None) the same run loses ~5 points to evictions and has a higher p99 (docs/
experiments.md, "Drift in the engine-bound regime"). Simulated time, deterministic: ~10 s."""

from __future__ import annotations

from experiments.bound_drift import point


def run(knobs: dict) -> dict:
    return point((knobs, 16.0, 1, "live", False, "drift", {}, "cacheroute"))


def test_cold_home_rule_cuts_evictions_and_the_tail_on_drift():
    before, after = run({"cold_home": None}), run({})
    assert after["evicted"] < before["evicted"] - 3.0          # measured 5.7 vs 11.1 points
    assert after["hit"] > before["hit"] + 1.0                  # 85.9% vs 83.6%
    assert after["p99_ms"] < before["p99_ms"]                  # 858 vs 984 ms
    assert after["first_on_replica"] <= 0.2
