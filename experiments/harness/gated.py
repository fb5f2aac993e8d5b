"""Gated run mode: re-plan every interval, shadow-gate each candidate, fall back to Flat-LB.

Each control interval (the simulator's re-plan event) the gated simulator
  1. measures what a live system could: active keys and p99 TTFT over the last rate window,
     counting a request still waiting for its first token by its age so far (so an overloaded
     window shows up before its requests finish), and whether the window was planned throughout
     and settled (the first window after going planned still drains Flat-LB's queues);
  2. records `fallback_check(active plan's report, observed)` (services.core.shadow);
  3. builds a candidate (the config's plan_fn, default a fresh LPT plan) and replays the
     window's requests, in aggregate form, through `shadow_replay` against Flat-LB;
  4. passed: installs the candidate (with its ShadowReport) and routes planned;
     failed: switches the cacheroute policy to flat fallback (P2C for every request) and keeps
     it there until a later candidate passes.
Before the first gate the policy's cold path serves every key (P2C with the default cold tail,
i.e. Flat-LB). Knobs: the ShadowConfig (margin, SLO, replay bound) and FallbackConfig.
`result.extra["gates"]` lists each interval's decision.

Cost: one gate is ~2 x 2-5 replays of at most `max_requests` requests (a second or two at
the flagship size), so a gated run is slower than a plain one by about that per interval.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from services.core.plan import Plan
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.policy import Policy
from services.core.request import Request
from services.core.shadow import FallbackConfig, Observed, ShadowConfig, fallback_check, requests_to_records
from services.model import DEFAULT_COLD_TAIL
from services.sim.replay import shadow_replay
from services.sim.simulator import SimConfig, SimResult, Simulator, default_plan_fn


class GatedSimulator(Simulator):
    """`GatedSimulator(config, cacheroute_policy, requests, shadow=ShadowConfig(...)).run()`."""

    def __init__(self, config: SimConfig, policy: Policy, requests: Sequence[Request], *, shadow: ShadowConfig,
                 fallback: FallbackConfig = FallbackConfig()) -> None:
        if not hasattr(policy, "set_flat_fallback"):
            raise ValueError("the gated mode needs a policy with flat fallback (cacheroute)")
        self._inner_plan_fn = config.plan_fn or default_plan_fn
        super().__init__(replace(config, plan_fn=self._gated_plan), policy, requests)
        self.shadow = shadow
        self.fallback = fallback
        self.gates: list[dict] = []
        self._times = [q.arrival for q in requests]
        self._mode = "flat"   # the cold path before the first plan is P2C
        self._planned_since = math.inf

    def _gated_plan(self, *, now: float, window: float, active: Plan | None, **kw) -> Plan | None:
        lo = bisect.bisect_left(self._times, now - window)
        hi = bisect.bisect_left(self._times, now)
        observed = self._observe(lo, hi, now)
        check = fallback_check(active.shadow if active is not None else None, observed, self.fallback)
        candidate = self._inner_plan_fn(now=now, window=window, active=active, **kw)
        if candidate is None:
            candidate = active
        report = None
        if candidate is not None:
            report = shadow_replay(requests_to_records(self.requests[lo:hi]), candidate,
                                   replace(self.shadow, seed=self.shadow.seed + len(self.gates)))
        passed = report is not None and report.passed
        if passed and self._mode != "planned":
            self._planned_since = now
        elif not passed:
            self._planned_since = math.inf
        self._mode = "planned" if passed else "flat"
        self.policy.set_flat_fallback(not passed)
        self.gates.append({
            "t": now, "mode": self._mode, "observed_keys": observed.active_keys,
            "observed_p99": observed.ttft_p99, "check": check[0], "check_reason": check[1],
            "gate_passed": passed, "gate_reason": report.reason if report is not None else "no candidate",
            "candidate_p99": report.candidate_ttft_p99 if report else None,
            "flat_p99": report.flat_ttft_p99 if report else None,
        })
        if not passed or candidate is active:
            return None
        return replace(candidate, shadow=report)

    def _observe(self, lo: int, hi: int, now: float) -> Observed:
        if hi <= lo:
            return Observed(0, math.nan, self._mode)
        keys = {q.key for q in self.requests[lo:hi]}
        waits = []
        for i in range(lo, hi):
            if self._replica[i] < 0:
                continue
            t = self._ttft[i]
            waits.append(t if not math.isnan(t) else now - self._times[i])
        p99 = float(np.percentile(waits, 99)) if waits else math.nan
        # the first window after going planned still drains flat's queues: not the plan's p99
        settled = self._planned_since + (now - self._times[lo]) <= self._times[lo]
        return Observed(len(keys), p99, "planned" if self._mode == "planned" and settled else "flat")

    def run(self) -> SimResult:
        res = super().run()
        res.extra["gates"] = self.gates
        res.extra["planned_share"] = (sum(g["mode"] == "planned" for g in self.gates) / len(self.gates)
                                      if self.gates else 0.0)
        return res


def run_gated_spec(spec, *, slo_p99: float, margin: float = 0.10, max_requests: int = 2000,
                   requests: Sequence[Request] | None = None) -> dict:
    """One gated run of a services.sim.runs.RunSpec (policy must be cacheroute); the JSON summary."""
    from services.core.engine import get_profile
    from services.core.policies import make_policy
    from services.sim.runs import config_for, load_requests

    if spec.policy != "cacheroute":
        raise ValueError("the gated mode runs the cacheroute policy")
    reqs = requests if requests is not None else load_requests(spec)
    config = config_for(spec)
    shadow = ShadowConfig(get_profile(spec.profile), spec.replicas, kv_blocks=config.kv_blocks, slo_p99=slo_p99,
                          margin=margin, max_requests=max_requests,
                          cold=spec.policy_knobs.get("cold", DEFAULT_COLD_TAIL), seed=spec.seed,
                          balance_factor=spec.policy_knobs.get("balance_factor", BALANCE_FACTOR))
    policy = make_policy("cacheroute", spec.replicas, seed=spec.seed, **spec.policy_knobs)
    out = GatedSimulator(config, policy, reqs, shadow=shadow).run().as_dict()
    out["offered_qps"] = spec.qps
    out["policy"] = "cacheroute-gated"
    return out
