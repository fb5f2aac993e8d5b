"""Failure handling in the simulator: what the planner does when a replica dies mid-interval, and
how a returning replica is brought back without a re-warm storm.

On failure (`RepairSimulator(on_failure=...)`), at the moment the replica goes down:
  "none"    keep the active plan until the next control interval; keys whose only replica died
            go P2C (Reason.FALLBACK), keys with surviving members use those.
  "replan"  a full from-scratch LPT build over the survivors from the rates measured since the
            last plan (moves most keys: re-warm everywhere).
  "repair"  services.core.replan.repair_plan: only keys that lost a replica move.
Between failures every interval re-plans with `plan_fn`; `incremental_plan_fn(max_moves)` is
churn-aware re-planning over the healthy replicas (replan_incremental). A returning replica
joins empty; with bounded `max_moves` the rebalancer hands it at most that many key shares per
interval, so it warms up gradually instead of taking a whole share of cold keys at once.

Plans built over a subset of replicas index that subset; `cluster_plan` re-indexes them onto
the simulator's replicas (ids "r0".."r{R-1}", the ids default_plan_fn uses).
`window_summary` and `timeline` give the hit-rate dip, p99 and losses around an event.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from services.core.metrics import hit_rate, percentile
from services.core.plan import Plan
from services.core.planning import build_plan
from services.core.policy import Policy
from services.core.replan import repair_plan, replan_incremental
from services.core.request import Request
from services.sim.simulator import PlanRecord, SimConfig, SimResult, Simulator

ON_FAILURE = ("none", "replan", "repair")


def cluster_ids(replicas: int) -> list[str]:
    return [f"r{j}" for j in range(replicas)]


def cluster_plan(plan: Plan, replicas: int) -> Plan:
    """`plan` with its table and loads re-indexed onto replicas r0..r{R-1} (absent ones carry 0)."""
    ids = cluster_ids(replicas)
    where = {rid: j for j, rid in enumerate(ids)}
    missing = [rid for rid in plan.replica_ids if rid not in where]
    if missing:
        raise ValueError(f"plan names replica {missing[0]!r}, not one of r0..r{replicas - 1}")
    if tuple(ids) == plan.replica_ids:
        return plan
    to = [where[rid] for rid in plan.replica_ids]
    loads = [0.0] * replicas
    for i, load in enumerate(plan.expected_load):
        loads[to[i]] = load
    table = {key: tuple(sorted(to[i] for i in row)) for key, row in plan.table.items()}
    return replace(plan, replica_ids=tuple(ids), table=table, expected_load=tuple(loads))


def incremental_plan_fn(max_moves: int | None = None, tolerance: float = 0.05):
    """plan_fn: LPT first, then replan_incremental over the healthy replicas (module header)."""

    def plan_fn(*, now: float, keys: list[str], rates: list[float], healthy: list[bool], active: Plan | None,
                q_cap: float, warm_slots: int, version: int, replicas: int, window: float) -> Plan:
        ids = [rid for rid, ok in zip(cluster_ids(replicas), healthy) if ok]
        if active is None:
            plan = build_plan(keys, rates, ids, q_cap, warm_slots, version=version, created_at=now,
                              window_seconds=window)
        else:
            plan = replan_incremental(active, keys, rates, ids, q_cap, warm_slots, version=version, created_at=now,
                                      tolerance=tolerance, max_moves=max_moves, window_seconds=window)
        return cluster_plan(plan, replicas)

    return plan_fn


class RepairSimulator(Simulator):
    """A simulator that reacts to a replica failure at once (module header)."""

    def __init__(self, config: SimConfig, policy: Policy, requests: Sequence[Request], *,
                 on_failure: str = "repair") -> None:
        if on_failure not in ON_FAILURE:
            raise ValueError(f"unknown on_failure {on_failure!r}; valid: {', '.join(ON_FAILURE)}")
        super().__init__(config, policy, requests)
        self.on_failure = on_failure
        self.failure_plans: list[dict] = []
        self._last_plan_at = 0.0

    def _replan(self, t: float) -> None:
        super()._replan(t)
        self._last_plan_at = t

    def _on_control(self, t: float, what: tuple) -> None:
        super()._on_control(t, what)
        if what[0] != "down" or self.on_failure == "none" or self._plan is None:
            return
        active, R = self._plan, self.config.replicas
        dead = [f"r{j}" for j in range(R) if not self.state.healthy[j]]
        if self.on_failure == "repair":
            plan = repair_plan(active, [d for d in dead if d in active.replica_ids], version=active.version + 1,
                               created_at=t)
        else:
            plan = build_plan(*self._current_rates(t, active), [f"r{j}" for j in range(R) if self.state.healthy[j]],
                              active.q_cap, active.warm_slots, version=active.version + 1, parent=active,
                              created_at=t)
        self._install(cluster_plan(plan, R), t)

    def _current_rates(self, t: float, active: Plan) -> tuple[list[str], list[float]]:
        elapsed = t - self._last_plan_at
        if elapsed <= 1.0 or not self._counts:
            return list(active.rates), list(active.rates.values())
        keys = list(self._counts)
        return keys, [self._counts[k] / elapsed for k in keys]

    def _install(self, plan: Plan, t: float) -> None:
        from services.core.planning import plan_diff

        churn = plan_diff(self._plan, plan).churn if self._plan is not None else None
        self._plan = plan
        self.policy.set_plan(plan)
        self._plans.append(PlanRecord(plan.version, t, plan.admitted_keys, plan.total_keys, plan.admitted_rate_share,
                                      plan.predicted_imbalance, churn, plan.q_cap, plan.warm_slots))
        self.failure_plans.append({"t": t, "builder": plan.builder, "churn": churn, "version": plan.version})

    def run(self) -> SimResult:
        res = super().run()
        res.extra["failure_plans"] = self.failure_plans
        return res


# ---------------------------------------------------------------------------------------------
# measuring around an event


def window_summary(res: SimResult, start: float, end: float) -> dict:
    """Hit rate, p99 TTFT, requests and losses of the requests arriving in [start, end)."""
    m = (res.arrival >= start) & (res.arrival < end)
    served = m & ~np.isnan(res.ttft)
    return {"start": start, "end": end, "requests": int(m.sum()), "failed": int((m & res.failed).sum()),
            "hit_rate": hit_rate(res.cached[served], res.prompt[served]),
            "ttft_p99": percentile(res.ttft[served], 99) if served.any() else math.nan}


def timeline(res: SimResult, bin_seconds: float, start: float = 0.0, end: float | None = None) -> list[dict]:
    """window_summary per bin from `start` to `end` (default: the run's end)."""
    stop = res.end if end is None else end
    edges = np.arange(start, stop + 1e-9, bin_seconds)
    return [window_summary(res, float(a), float(b)) for a, b in zip(edges[:-1], edges[1:])]
