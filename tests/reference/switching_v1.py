"""The per-key Python switching rule as it was before vectorising (main at 9a5bbe9): the
reference tests/unit/test_replan_equivalence.py compares services.core.switching against.
Not used by any service."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from services.core.plan import Plan, SwitchDecision
from services.core.planning import plan_diff, replica_names


@dataclass(frozen=True, slots=True)
class SwitchConfig:
    horizon_seconds: float = 300.0
    hysteresis: float = 1.0
    min_dwell_seconds: float = 120.0
    prefill_seconds_per_token: float = 78e-6
    rewarm_seconds: float = 60.0
    default_prefix_tokens: float = 2048.0
    queue_weight: float = 1.0
    queue_cap: float = 10.0

    def __post_init__(self) -> None:
        for name in ("horizon_seconds", "hysteresis", "min_dwell_seconds", "prefill_seconds_per_token",
                     "rewarm_seconds", "default_prefix_tokens", "queue_weight", "queue_cap"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Staleness:
    cache: float      # prefill s/s: hot keys the active plan leaves cold, net
    overload: float   # prefill s/s: requests past the knee under the active plan, net of the candidate's
    total: float      # max(0, cache + queue_weight * queue + overload)
    queue: float = 0.0   # waiting s/s: queueing under the active plan, net of the candidate's


def _tokens(prefix_tokens: Mapping[str, float] | float, config: SwitchConfig):
    if isinstance(prefix_tokens, Mapping):
        default = config.default_prefix_tokens
        return lambda key: prefix_tokens.get(key, default)
    value = float(prefix_tokens)
    return lambda key: value


def loads_under(plan: Plan, rates: Mapping[str, float], total: float | None = None) -> list[float]:
    """Per-replica load of `plan` if traffic arrives at `rates` (cold tail spread evenly)."""
    loads = [0.0] * plan.replicas
    placed = 0.0
    for key, row in plan.table.items():
        lam = rates.get(key, 0.0)
        placed += lam
        share = lam / len(row)
        for r in row:
            loads[r] += share
    if total is None:
        total = math.fsum(rates.values())
    cold = max(0.0, total - placed) / plan.replicas
    return [load + cold for load in loads]


def overload(loads: list[float], q_cap: float) -> float:
    """Requests per second past the latency knee, summed over replicas."""
    return math.fsum(max(0.0, load - q_cap) for load in loads)


def queueing(loads: list[float], q_cap: float, cap: float) -> float:
    """Requests waiting on average (= seconds of waiting per second), summed over replicas:
    M/M/1 L_q = rho^2 / (1 - rho) at rho = load / q_cap, each replica capped at `cap`."""
    if q_cap <= 0:
        return 0.0
    parts = []
    for load in loads:
        rho = load / q_cap
        parts.append(cap if rho >= 1.0 else min(cap, rho * rho / (1.0 - rho)))
    return math.fsum(parts)


def staleness_penalty(active: Plan, candidate: Plan, rates: Mapping[str, float],
                      prefix_tokens: Mapping[str, float] | float, config: SwitchConfig) -> Staleness:
    tokens = _tokens(prefix_tokens, config)
    c = config.prefill_seconds_per_token
    gained = math.fsum(rates.get(b, 0.0) * tokens(b) for b in candidate.table if b not in active.table)
    lost = math.fsum(rates.get(b, 0.0) * tokens(b) for b in active.table if b not in candidate.table)
    cache = (gained - lost) * c

    total = math.fsum(rates.values())
    loads_a, loads_c = loads_under(active, rates, total), loads_under(candidate, rates, total)
    q_cap = candidate.q_cap
    spill = overload(loads_a, q_cap) - overload(loads_c, q_cap)
    queue = queueing(loads_a, q_cap, config.queue_cap) - queueing(loads_c, q_cap, config.queue_cap)
    hot = set(active.table) | set(candidate.table)
    hot_rate = math.fsum(rates.get(b, 0.0) for b in hot)
    mean_tokens = (math.fsum(rates.get(b, 0.0) * tokens(b) for b in hot) / hot_rate if hot_rate > 0
                   else (config.default_prefix_tokens if isinstance(prefix_tokens, Mapping) else float(prefix_tokens)))
    over = spill * mean_tokens * c
    return Staleness(cache=cache, overload=over, total=max(0.0, cache + config.queue_weight * queue + over),
                     queue=queue)


def rewarm_penalty(active: Plan, candidate: Plan, rates: Mapping[str, float],
                   prefix_tokens: Mapping[str, float] | float, config: SwitchConfig) -> float:
    """Prefill seconds spent once warming the candidate's new key owners."""
    tokens = _tokens(prefix_tokens, config)
    parts = []
    same_ids = active.replica_ids == candidate.replica_ids
    before_table = active.table
    for key, row in candidate.table.items():
        if same_ids:   # indices name the same replicas: compare rows directly
            before = before_table.get(key)
            if before is not None and (before == row or set(row) <= set(before)):
                continue
            new_owners = len(set(row) - set(before or ()))
        else:
            new_owners = len(set(replica_names(candidate, key)) - set(replica_names(active, key)))
        if new_owners:
            moved_rate = rates.get(key, 0.0) * new_owners / len(row)
            parts.append(tokens(key) * (new_owners + moved_rate * config.rewarm_seconds))
    return math.fsum(parts) * config.prefill_seconds_per_token


def grows_only(active: Plan, candidate: Plan) -> bool:
    """True when `candidate` moves no traffic of `active` to a replica that did not serve it:
    every key of `active` keeps all its replicas or a subset of them (by replica id)."""
    same_ids = active.replica_ids == candidate.replica_ids
    after_table = candidate.table
    for key, before in active.table.items():
        row = after_table.get(key)
        if row is None:
            return False
        if before == row:
            continue
        if same_ids:
            old, new = set(before), set(row)
        else:
            old, new = set(replica_names(active, key)), set(replica_names(candidate, key))
        if not (old <= new or new <= old):
            return False
    return True


def decide_switch(active: Plan | None, candidate: Plan, rates: Mapping[str, float],
                  prefix_tokens: Mapping[str, float] | float, *, now: float, last_switch_at: float,
                  config: SwitchConfig = SwitchConfig()) -> SwitchDecision:
    """Keep or switch (module header); the figures and a one-line reason go into the decision."""
    if active is None:
        return SwitchDecision(True, "no active plan", churn=1.0)
    # a candidate built from `active` already carries plan_diff(active, candidate).churn
    churn = (candidate.churn if candidate.churn is not None and candidate.parent_version == active.version
             else plan_diff(active, candidate).churn)
    stale = staleness_penalty(active, candidate, rates, prefix_tokens, config)
    rewarm = rewarm_penalty(active, candidate, rates, prefix_tokens, config)

    def decision(switch: bool, reason: str) -> SwitchDecision:
        return SwitchDecision(switch, reason, staleness_penalty=stale.total, rewarm_penalty=rewarm, churn=churn)

    if set(active.replica_ids) != set(candidate.replica_ids):
        gone = sorted(set(active.replica_ids) - set(candidate.replica_ids))
        new = sorted(set(candidate.replica_ids) - set(active.replica_ids))
        return decision(True, f"replica set changed (gone {gone}, new {new})")
    dwell = now - last_switch_at
    growth = ""
    if dwell < config.min_dwell_seconds:
        if not grows_only(active, candidate):
            return decision(False, f"dwell {dwell:.0f} s < {config.min_dwell_seconds:.0f} s since the last switch")
        growth = f" (growth only, within the {config.min_dwell_seconds:.0f} s dwell)"
    cost_of_keeping = stale.total * config.horizon_seconds
    bar = rewarm * (1.0 + config.hysteresis)
    figures = (f"staleness {stale.total:.4g} s/s x {config.horizon_seconds:.0f} s = {cost_of_keeping:.4g} s "
               f"{{}} re-warm {rewarm:.4g} s x {1.0 + config.hysteresis:.2f}")
    if cost_of_keeping > bar:
        return decision(True, "switch" + growth + ": " + figures.format(">"))
    return decision(False, "keep" + growth + ": " + figures.format("<="))
