"""Settings shared with the paper experiments (experiments/run.py), so figures are comparable."""

from __future__ import annotations

import os
from dataclasses import replace

import orjson

from experiments import run
from services.sim.runs import RunSpec, capacity_report, run_spec, sweep

ROOT = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(ROOT), "results", "beyond")

TRACE_GRID = [4, 8, 12, 16, 20, 24, 32]
# (name, base RunSpec, grid, slo): experiments/run.py's settings (bootstrap plan at 5 s, grids,
# SLOs), chosen there once for all policies
SOURCES = {
    "flagship-k128": (RunSpec(policy="flat", qps=None, workload="paper", duration=150, warmup=60, first_plan_at=5,
                              workload_knobs={"active_set": 128}), [20, 50, 100, 150, 200, 250, 300], 3.5),
    "low-reuse": (RunSpec(policy="flat", qps=None, workload="low-reuse", duration=150, warmup=60, first_plan_at=5),
                  [20, 40, 60, 80, 100, 120, 160], 3.5),
    "burst": (RunSpec(policy="flat", qps=None, workload="paper", duration=150, warmup=60, first_plan_at=5,
                      workload_knobs={"cv": 1.9}), [20, 50, 100, 150, 200, 250, 300], 3.5),
    "mooncake-conversation": (RunSpec(policy="flat", qps=None, workload=None, duration=None, replicas=8,
                                      profile="llama3-8b-h100", first_plan_at=5,
                                      trace=run.MOONCAKE_CONVERSATION),
                              TRACE_GRID, 20.0),
    "mooncake-synthetic": (RunSpec(policy="flat", qps=None, workload=None, duration=None, replicas=8,
                                   profile="llama3-8b-h100", first_plan_at=5,
                                   trace=run.MOONCAKE_SYNTHETIC),
                           TRACE_GRID, 10.0),
}


def source(name: str) -> tuple[RunSpec, list, float]:
    """SOURCES[name] ready to run: a trace source's path under $CACHEROUTE_DATA (run.data_path)."""
    base, grid, slo = SOURCES[name]
    return (replace(base, trace=run.data_path(base.trace)) if base.trace else base), grid, slo


def capacity(spec: RunSpec, grid, slo: float, run=None) -> dict:
    return capacity_report(sweep(spec, grid, run=run), slo)


def variant(base: RunSpec, policy: str, **knobs) -> RunSpec:
    return replace(base, policy=policy, policy_knobs=knobs)


def load(name: str) -> dict:
    """A stored result ({} when absent), so a script can add sources to an earlier run's file."""
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        return orjson.loads(f.read())


def save(name: str, obj) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "wb") as f:
        f.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return path


def slim(report: dict) -> dict:
    """A capacity report without per-point bulk (plans, per-replica counts)."""
    keep = ("offered_qps", "hit_rate", "ttft_p50", "ttft_p99", "imbalance", "requests", "failed", "q_cap")
    return {**{k: v for k, v in report.items() if k != "points"},
            "points": [{k: p.get(k) for k in keep} for p in report["points"]]}


__all__ = ["SOURCES", "RESULTS", "source", "capacity", "variant", "load", "save", "slim", "run_spec"]
