"""Simulation runs by name: build the requests (workload or trace), the policy and the
config, simulate, and sweep offered QPS for SLO capacity. Shared by the CLI and benchmarks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from services.core.engine import PROFILES, get_profile
from services.core.metrics import slo_capacity
from services.core.policies import POLICIES, make_policy
from services.core.request import Request
from services.core.workloads import history_rates, make_workload
from services.sim import calibrate, tracefiles
from services.sim.simulator import PLANNED, SimConfig, Simulator, scratch_plan_fn
from services.sim.tier import Tier

# planned policies' re-plan every interval: "churn" is the simulator's default (the planner's
# churn-aware lifecycle; prefix-aware plans keep their own sticky builder), "scratch" the paper's
# fresh LPT plan (services.sim.simulator.scratch_plan_fn)
LIFECYCLES = {"churn": None, "scratch": scratch_plan_fn}


@dataclass(frozen=True)
class RunSpec:
    """Everything one simulation needs, picklable (runs may go to worker processes)."""

    policy: str
    qps: float | None                       # None: a trace replayed as recorded
    replicas: int = 30
    profile: str = "llama3-70b-fp8-h100x2"
    duration: float | None = 300.0          # None: the whole trace
    seed: int = 0
    workload: str | None = "paper"
    trace: str | None = None
    workload_knobs: dict[str, Any] = field(default_factory=dict)
    policy_knobs: dict[str, Any] = field(default_factory=dict)
    q_cap: float | None = None
    warm_slots: int | None = None
    warmup: float | None = None
    control_interval: float = 30.0
    first_plan_at: float | None = None      # bootstrap plan time (SimConfig.first_plan_at)
    rate_horizon: float | None = None       # EWMA horizon of planned rates (SimConfig.rate_horizon)
    rate_history: float | None = None       # seconds of aggregated history known before t = 0
    arrival_trace: str | None = None        # synthetic workloads: replay this Azure CSV's arrival times
    lifecycle: str = "churn"                # planned policies' re-plan: "churn" (the planner's) or "scratch" (fresh LPT)
    kv_blocks: int | None = None            # KV blocks per replica; None: the profile's
    tier: int = 1                           # router instances, round-robin (services.sim.tier)
    record_delay: float | None = None       # the tier's record bus delay, virtual seconds; None: off
    record_memory: bool = True              # the bus also feeds the cold tail's key memory


def load_requests(spec: RunSpec) -> list[Request]:
    """The spec's requests, sorted by arrival. ValueError with the valid choices if unknown."""
    if spec.trace is not None:
        if not os.path.isfile(spec.trace) or not os.access(spec.trace, os.R_OK):
            raise ValueError(f"cannot read trace {spec.trace!r}")
        if spec.trace.endswith((".jsonl", ".json")):
            wl = tracefiles.load_mooncake(spec.trace, qps=spec.qps, **spec.workload_knobs)
        elif spec.trace.endswith(".csv"):
            wl = tracefiles.load_azure(spec.trace, qps=spec.qps, seed=spec.seed, **spec.workload_knobs)
        else:
            raise ValueError(f"unknown trace format {spec.trace!r}; use Mooncake .jsonl or Azure .csv")
        reqs = wl.requests
        if spec.duration is not None:
            reqs = [q for q in reqs if q.arrival < spec.duration]
        return reqs

    if spec.qps is None or spec.duration is None:
        raise ValueError("a synthetic workload needs --qps and --duration")
    knobs = dict(spec.workload_knobs)
    if spec.arrival_trace is not None:
        knobs["arrivals"] = tracefiles.replayed_arrivals(spec.arrival_trace, qps=spec.qps, duration=spec.duration)
    return make_workload(spec.workload, qps=spec.qps, duration=spec.duration, seed=spec.seed, **knobs).requests


def check_names(policy: str | Iterable[str], profile: str) -> None:
    for name in [policy] if isinstance(policy, str) else policy:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    get_profile(profile)


def config_for(spec: RunSpec) -> SimConfig:
    prior, prior_seconds = (), 0.0
    if spec.rate_history:
        if spec.trace is not None or spec.qps is None:
            raise ValueError("--rate-history needs a synthetic workload and --qps")
        prior = tuple(history_rates(spec.workload, qps=spec.qps, seconds=spec.rate_history, seed=spec.seed,
                                    history_seed=spec.seed + 1_000_003, **spec.workload_knobs))
        prior_seconds = spec.rate_history
    horizon = spec.rate_horizon
    if spec.rate_history and horizon is None:
        horizon = spec.rate_history       # a history without a horizon: weigh it as its own length
    if spec.lifecycle not in LIFECYCLES:
        raise ValueError(f"unknown lifecycle {spec.lifecycle!r}; valid: {', '.join(LIFECYCLES)}")
    if spec.kv_blocks is not None and spec.kv_blocks < 1:
        raise ValueError(f"kv_blocks must be a positive number of blocks, got {spec.kv_blocks}")
    return SimConfig(get_profile(spec.profile), spec.replicas, kv_blocks=spec.kv_blocks, q_cap=spec.q_cap,
                     warm_slots=spec.warm_slots,
                     warmup=spec.warmup, end=spec.duration if spec.trace is None else None,
                     control_interval=spec.control_interval, first_plan_at=spec.first_plan_at,
                     rate_horizon=horizon, rate_prior=prior, rate_prior_seconds=prior_seconds,
                     plan_fn=LIFECYCLES[spec.lifecycle])


def run_spec(spec: RunSpec, requests: Sequence[Request] | None = None) -> dict:
    """Simulate one spec; the JSON summary (SimResult.as_dict) plus the offered qps."""
    check_names(spec.policy, spec.profile)
    reqs = requests if requests is not None else load_requests(spec)
    if not reqs:
        raise ValueError("no requests to simulate")
    if spec.tier == 1:
        policy = make_policy(spec.policy, spec.replicas, seed=spec.seed, **spec.policy_knobs)
    else:
        policy = Tier(lambda i: make_policy(spec.policy, spec.replicas, seed=spec.seed + i, **spec.policy_knobs),
                      spec.tier, record_delay=spec.record_delay, record_memory=spec.record_memory)
    out = Simulator(config_for(spec), policy, reqs).run().as_dict()
    out["offered_qps"] = spec.qps
    return out


def calibrated_q_cap(spec: RunSpec, requests: Sequence[Request] | None = None) -> float:
    reqs = requests if requests is not None else load_requests(spec)
    return calibrate.q_cap_for(get_profile(spec.profile), reqs, spec.replicas, kv_blocks=spec.kv_blocks)


def sweep(spec: RunSpec, grid: Sequence[float], *, run: Callable[[list[RunSpec]], list[dict]] | None = None
          ) -> list[dict]:
    """One run per grid QPS (planned policies share one calibrated q_cap)."""
    specs = [replace(spec, qps=q) for q in sorted(grid)]
    if spec.policy in PLANNED and spec.q_cap is None:
        q_cap = calibrated_q_cap(specs[0])
        specs = [replace(s, q_cap=q_cap) for s in specs]
    return (run or (lambda ss: [run_spec(s) for s in ss]))(specs)


def capacity_report(points: list[dict], slo: float) -> dict:
    cap = slo_capacity([(p["offered_qps"], p["ttft_p99"]) for p in points], slo)
    return {"capacity": cap.capacity, "censored": cap.censored, "monotone": cap.monotone, "slo_p99": slo,
            "points": points}


PROFILE_NAMES = tuple(PROFILES)
