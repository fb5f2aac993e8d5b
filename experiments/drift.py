"""Experiment (e): plan lifecycle under rate drift -- re-plan from scratch, keep a stale plan,
re-plan churn-aware, or run the planner's own keep-or-switch loop (SPEC section 2).

Setup (chosen once, the same for every mode): the `drift` workload (top-K keys of the paper's
log-normal population, each log-rate takes an N(0, 0.3^2) step every `interval` seconds, total
rate held at `qps`), 70B fp8 profile, 30 replicas, Poisson arrivals. The simulator re-plans every
`interval` seconds from the arrival counts of the last interval (so a plan is built from the
epoch that just ended and lives through the next one: the realistic one-interval lag; the first
plan is bootstrapped at 5 s and the second, at t = interval, is built from epoch 0), with one
q_cap calibrated on the workload and shared by every mode. Modes, as simulator `plan_fn`s:

  scratch      a fresh LPT plan every interval (services.core.planning.build_plan)
  stale        the plan built at t = interval, never replaced
  incremental  services.core.replan.replan_incremental from the active plan every interval
  planner      what the planner service does: an incremental candidate, installed only when
               services.core.switching.decide_switch says its staleness penalty exceeds the
               re-warm penalty (default SwitchConfig)

Readings, all from the simulator's per-request arrays (served requests, by arrival time):
  hit-rate time series in `bin_seconds` bins (token-weighted); per-epoch hit rate and p99
  TTFT; and for each plan install the hit rate in the `probe` seconds after it minus the
  `probe` seconds before it (the paper's "dip at install", -13.6 points for a from-scratch
  plan). Paper: 94.5% churn for from-scratch LPT; stale plan up to -3.0 points and +858 ms p99
  in the worst drift step, sigma = 0.3 over six intervals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from services.core.engine import get_profile
from services.core.metrics import hit_rate, imbalance, percentile
from services.core.plan import Plan
from services.core.planning import build_plan
from services.core.replan import replan_incremental
from services.core.switching import SwitchConfig, decide_switch
from services.core.policies import make_policy
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.workloads import Workload, make_workload
from services.sim import calibrate
from services.sim.simulator import SimConfig, SimResult, Simulator

MODES = ("scratch", "stale", "incremental", "planner")


def plan_fn_for(mode: str, prefix_tokens: dict[str, int] | float,
                switch_config: SwitchConfig = SwitchConfig()) -> Callable[..., Plan | None]:
    """The simulator plan_fn of a mode (module header). Returning the active plan keeps it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    last_switch = [-math.inf]
    decisions: list[dict] = []

    def plan_fn(*, now, keys, rates, healthy, active, q_cap, warm_slots, version, replicas, window):
        ids = [f"r{j}" for j in range(replicas)]
        # a bootstrap plan (version 1 built from less than a full window) is replaced in every mode
        bootstrap = active is not None and active.version == 1 and active.window_seconds < window
        if active is None or bootstrap or mode == "scratch":
            last_switch[0] = now
            return build_plan(keys, rates, ids, q_cap, warm_slots, version=version, parent=active,
                              created_at=now, window_seconds=window)
        if mode == "stale":
            return active
        candidate = replan_incremental(active, keys, rates, ids, q_cap, warm_slots, version=version,
                                       created_at=now, window_seconds=window)
        if mode == "incremental":
            return candidate
        decision = decide_switch(active, candidate, dict(zip(keys, rates)), prefix_tokens, now=now,
                                 last_switch_at=last_switch[0], config=switch_config)
        decisions.append({"at": now, "switch": decision.switch, "reason": decision.reason,
                          "staleness": decision.staleness_penalty, "rewarm": decision.rewarm_penalty,
                          "candidate_imbalance": candidate.predicted_imbalance})
        if not decision.switch:
            return active
        last_switch[0] = now
        return candidate

    plan_fn.decisions = decisions      # the planner mode's keep-or-switch verdicts, in order
    return plan_fn


def hit_series(result: SimResult, bin_seconds: float, end: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(bin start times, token-weighted hit rate of the served requests arriving in each bin);
    nan for a bin with nothing served."""
    end = result.end if end is None else end
    served = ~np.isnan(result.ttft)
    edges = np.arange(0.0, end + bin_seconds, bin_seconds)
    idx = np.digitize(result.arrival[served], edges) - 1
    nbins = len(edges) - 1
    ok = (idx >= 0) & (idx < nbins)
    cached = np.bincount(idx[ok], weights=result.cached[served][ok], minlength=nbins)
    prompt = np.bincount(idx[ok], weights=result.prompt[served][ok], minlength=nbins)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(prompt > 0, cached / prompt, np.nan)
    return edges[:-1], rate


def window_stats(result: SimResult, start: float, stop: float) -> dict:
    """Hit rate, p99 TTFT and request count of the requests arriving in [start, stop)."""
    mask = (result.arrival >= start) & (result.arrival < stop)
    served = mask & ~np.isnan(result.ttft)
    unfinished = int(np.count_nonzero(mask & ~result.failed & np.isnan(result.ttft)))
    p99 = math.inf if unfinished else percentile(result.ttft[served], 99)
    routed = result.replica[mask & (result.replica >= 0)]
    per_replica = np.bincount(routed, minlength=int(result.replica.max()) + 1) if routed.size else np.zeros(1)
    return {"start": start, "stop": stop, "requests": int(mask.sum()),
            "hit_rate": hit_rate(result.cached[served], result.prompt[served]), "ttft_p99": p99,
            "imbalance": imbalance(per_replica)}


def install_dips(result: SimResult, probe: float) -> list[dict]:
    """For each plan install after the first: hit rate in [at, at+probe) minus [at-probe, at)."""
    out = []
    for rec in result.plans[1:]:
        before = window_stats(result, rec.at - probe, rec.at)
        after = window_stats(result, rec.at, rec.at + probe)
        out.append({"version": rec.version, "at": rec.at, "churn": rec.churn,
                    "hit_before": before["hit_rate"], "hit_after": after["hit_rate"],
                    "dip_points": 100.0 * (after["hit_rate"] - before["hit_rate"])})
    return out


@dataclass(frozen=True)
class DriftSetup:
    qps: float = 150.0
    interval: float = 60.0
    epochs: int = 7                 # six drift steps after the first epoch
    active_set: int = 128
    replicas: int = 30
    profile: str = "llama3-70b-fp8-h100x2"
    seed: int = 0
    bin_seconds: float = 5.0
    probe: float = 10.0
    first_plan_at: float = 5.0      # bootstrap plan (SimConfig.first_plan_at)
    balance_factor: float | None = BALANCE_FACTOR   # the policy's overload guard (None: off)

    @property
    def duration(self) -> float:
        return self.interval * self.epochs


def workload(setup: DriftSetup) -> Workload:
    return make_workload("drift", qps=setup.qps, duration=setup.duration, seed=setup.seed,
                         interval=setup.interval, active_set=setup.active_set)


def run_mode(setup: DriftSetup, mode: str, wl: Workload, q_cap: float) -> tuple[SimResult, dict]:
    """Simulate one mode; the result and its JSON summary."""
    profile = get_profile(setup.profile)
    plan_fn = plan_fn_for(mode, dict(wl.prefix_tokens))
    config = SimConfig(profile, setup.replicas, warmup=setup.interval, end=setup.duration,
                       control_interval=setup.interval, first_plan_at=setup.first_plan_at, q_cap=q_cap,
                       plan_fn=plan_fn)
    policy = make_policy("cacheroute", setup.replicas, seed=setup.seed, balance_factor=setup.balance_factor)
    result = Simulator(config, policy, wl.requests).run()
    m = result.metrics
    times, series = hit_series(result, setup.bin_seconds)
    epochs = [window_stats(result, j * setup.interval, (j + 1) * setup.interval) for j in range(1, setup.epochs)]
    summary = {
        "mode": mode, "hit_rate": m.hit_rate, "ttft_p99": m.ttft_p99, "ttft_p50": m.ttft_p50,
        "imbalance": m.imbalance, "requests": m.requests,
        "installs": [{"version": p.version, "at": p.at, "churn": p.churn,
                      "predicted_imbalance": p.predicted_imbalance} for p in result.plans],
        "dips": install_dips(result, setup.probe),
        "decisions": plan_fn.decisions,
        "epochs": epochs,
        "series": {"t": times.tolist(), "hit_rate": [None if math.isnan(x) else x for x in series.tolist()]},
    }
    return result, summary


def run(setup: DriftSetup, modes=MODES) -> dict:
    wl = workload(setup)
    q_cap = calibrate.q_cap_for(get_profile(setup.profile), wl.requests, setup.replicas)
    out = {"setup": {**setup.__dict__, "duration": setup.duration, "q_cap": q_cap,
                     "requests": len(wl.requests)}, "modes": {}}
    for mode in modes:
        _, summary = run_mode(setup, mode, wl, q_cap)
        out["modes"][mode] = summary
    return out
