"""The per-key Python churn-aware re-planner as it was before vectorising (main at 9a5bbe9):
the reference `tests/unit/test_replan_equivalence.py` compares services.core.replan against key
for key. Not used by any service."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from services.core.plan import Plan
from services.core.planning import admit, build_plan, check_inputs, exact_sum, imbalance, size_keys, with_churn


DEFAULT_TOLERANCE = 0.05
DEFAULT_HOME_RHO = 0.5


def replan_incremental(active: Plan, keys: Sequence[str], rates: Sequence[float] | np.ndarray,
                       replica_ids: Sequence[str], q_cap: float, warm_slots: int, *, version: int,
                       created_at: float = 0.0, tolerance: float = DEFAULT_TOLERANCE, max_moves: int | None = None,
                       rates_snapshot_id: str = "", window_seconds: float = 0.0,
                       homes: Callable[[str], int] | None = None, home_rho: float = DEFAULT_HOME_RHO) -> Plan:
    """A plan for the new rates that keeps the active plan's assignments where balance allows."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not math.isfinite(home_rho) or home_rho < 0:
        raise ValueError(f"home_rho must be a finite number >= 0, got {home_rho!r}")
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    rate_arr = np.asarray(rates, dtype=np.float64)
    check_inputs(keys, rate_arr, replica_ids, q_cap, warm_slots)
    scratch = build_plan(keys, rate_arr, replica_ids, q_cap, warm_slots)  # the balance yardstick
    R = len(replica_ids)
    sizes = size_keys(rate_arr, q_cap, R)
    chosen = admit(keys, rate_arr, sizes, R * int(warm_slots))
    order = [keys[i] for i in chosen.tolist()]
    lam = dict(zip(order, rate_arr[chosen].tolist()))
    k = dict(zip(order, sizes[chosen].tolist()))
    cold = np.ones(len(keys), dtype=bool)
    cold[chosen] = False

    anchors = _anchors(active, replica_ids, order)
    cold_load = exact_sum(rate_arr[cold]) / R
    home_floor = home_rho * float(q_cap) if homes is not None else 0.0
    home_limit = max(home_floor,
                     (cold_load + math.fsum(lam.values()) / R) * scratch.predicted_imbalance * (1.0 + tolerance))
    rows, loads = _place_anchored(order, lam, k, anchors, R, cold_load, homes=homes, limit=home_limit)
    changed = {key for key in order if rows[key] != anchors.get(key)}
    limit = max(home_floor, math.fsum(loads) / R * scratch.predicted_imbalance * (1.0 + tolerance))
    moves = _rebalance(rows, lam, loads, changed, limit, max_moves if max_moves is not None else 4 * len(order) + R)

    total = float(rate_arr.sum())
    plan = Plan(
        version=version, parent_version=active.version, created_at=created_at,
        replica_ids=tuple(replica_ids), q_cap=float(q_cap), warm_slots=int(warm_slots),
        table={key: rows[key] for key in order}, rates=lam, expected_load=tuple(loads),
        predicted_imbalance=imbalance(loads), total_keys=len(keys), admitted_keys=len(order),
        admitted_rate_share=math.fsum(lam.values()) / total if total > 0 else 0.0,
        builder="incremental", rates_snapshot_id=rates_snapshot_id, window_seconds=float(window_seconds),
        extra={"scratch_imbalance": scratch.predicted_imbalance, "tolerance": tolerance, "moves": moves},
    )
    return with_churn(plan, active)


def build_at_home(keys: Sequence[str], rates: Sequence[float] | np.ndarray, replica_ids: Sequence[str],
                  q_cap: float, warm_slots: int, homes: Callable[[str], int], *, version: int,
                  created_at: float = 0.0, tolerance: float = DEFAULT_TOLERANCE, rates_snapshot_id: str = "",
                  window_seconds: float = 0.0) -> Plan:
    """A first plan with every key on its home where balance allows (module header)."""
    scratch = build_plan(keys, rates, replica_ids, q_cap, warm_slots)
    empty = replace(scratch, table={}, rates={}, admitted_keys=0)
    plan = replan_incremental(empty, keys, rates, replica_ids, q_cap, warm_slots, version=version,
                              created_at=created_at, tolerance=tolerance, rates_snapshot_id=rates_snapshot_id,
                              window_seconds=window_seconds, homes=homes)
    return replace(plan, parent_version=0, churn=None, builder="home")


def repair_plan(active: Plan, dead_replica_ids: Sequence[str], *, version: int, created_at: float = 0.0) -> Plan:
    """The active plan without the dead replicas; only keys that lost a replica are reassigned."""
    dead = set(dead_replica_ids)
    unknown = dead - set(active.replica_ids)
    if unknown:
        raise ValueError(f"unknown replica id {sorted(unknown)[0]!r}")
    survivors = [r for r in active.replica_ids if r not in dead]
    if not survivors:
        raise ValueError("no replica survives")
    R = len(survivors)
    order = sorted(active.table, key=lambda key: (-active.rates.get(key, 0.0), key))
    lam = {key: active.rates.get(key, 0.0) for key in order}
    k = {key: min(len(active.table[key]), R) for key in order}
    order = _fit_budget(order, k, R * active.warm_slots)
    total = math.fsum(active.expected_load)
    cold_total = max(0.0, total - math.fsum(lam[key] for key in order))

    anchors = _anchors(active, survivors, order)
    rows, loads = _place_anchored(order, lam, k, anchors, R, cold_total / R)
    prefixes = _repair_prefixes(active, survivors, loads)
    plan = replace(
        active, prefixes=prefixes, version=version, parent_version=active.version, created_at=created_at,
        replica_ids=tuple(survivors), table={key: rows[key] for key in order},
        rates={key: lam[key] for key in order}, expected_load=tuple(loads), predicted_imbalance=imbalance(loads),
        admitted_keys=len(order), admitted_rate_share=math.fsum(lam[key] for key in order) / total if total > 0 else 0.0,
        builder="repair", decision=None, shadow=None, extra={"dead_replicas": sorted(dead)},
    )
    return with_churn(plan, active)


# ---------------------------------------------------------------------------------------------
# steps


def _repair_prefixes(active: Plan, survivors: Sequence[str], loads: Sequence[float]) -> dict:
    """Prefix nodes of `active` re-indexed onto the survivors; a node that lost a member gets the
    least-loaded survivor it lacks (its load share is not re-added: a repair is a stopgap)."""
    if not active.prefixes:
        return {}
    index = {rid: i for i, rid in enumerate(survivors)}
    out = {}
    for name, entry in active.prefixes.items():
        kept = [index[active.replica_ids[i]] for i in entry.replicas if active.replica_ids[i] in index]
        want = min(len(entry.replicas), len(survivors))
        for r in sorted((r for r in range(len(survivors)) if r not in kept), key=lambda r: (loads[r], r)):
            if len(kept) >= want:
                break
            kept.append(r)
        out[name] = replace(entry, replicas=tuple(sorted(kept)))
    return out


def _anchors(active: Plan, replica_ids: Sequence[str], keys: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Each key's active replicas that still exist, as indices into `replica_ids`."""
    index = {rid: i for i, rid in enumerate(replica_ids)}
    old_ids = active.replica_ids
    out = {}
    for key in keys:
        row = active.table.get(key)
        if row is None:
            continue
        kept = tuple(sorted(index[old_ids[i]] for i in row if old_ids[i] in index))
        if kept:
            out[key] = kept
    return out


def _fit_budget(order: list[str], k: Mapping[str, int], budget: int) -> list[str]:
    """Drop the lowest-rate keys (end of `order`) until the sizes fit the slot budget."""
    used = sum(k[key] for key in order)
    keep = list(order)
    while keep and used > budget:
        used -= k[keep.pop()]
    return keep


def _place_anchored(order: Sequence[str], lam: Mapping[str, float], k: Mapping[str, int],
                    anchors: Mapping[str, tuple[int, ...]], replicas: int, cold_load: float, *,
                    homes: Callable[[str], int] | None = None,
                    limit: float = math.inf) -> tuple[dict[str, tuple[int, ...]], list[float]]:
    """Keep anchored shares, trim keys that shrank, then fill missing shares least-loaded first
    (a new key's home first when it stays within `limit`)."""
    loads = [cold_load] * replicas
    rows: dict[str, tuple[int, ...]] = {}
    shrunk, short = [], []
    for key in order:
        kept = anchors.get(key, ())
        if len(kept) > k[key]:
            shrunk.append(key)
            continue
        share = lam[key] / k[key]
        for r in kept:
            loads[r] += share
        rows[key] = kept
        if len(kept) < k[key]:
            short.append(key)
    for key in shrunk:
        share = lam[key] / k[key]
        kept = tuple(sorted(sorted(anchors[key], key=lambda r: (loads[r], r))[: k[key]]))
        for r in kept:
            loads[r] += share
        rows[key] = kept
    for key in short:
        share = lam[key] / k[key]
        row = set(rows[key])
        if homes is not None and not row:
            home = homes(key)
            if 0 <= home < replicas and loads[home] + share <= limit:
                loads[home] += share
                row.add(home)
        for r in sorted((r for r in range(replicas) if r not in row), key=lambda r: (loads[r], r))[: k[key] - len(row)]:
            loads[r] += share
            row.add(r)
        rows[key] = tuple(sorted(row))
    return rows, loads


def _rebalance(rows: dict[str, tuple[int, ...]], lam: Mapping[str, float], loads: list[float], changed: set[str],
               limit: float, max_moves: int) -> int:
    """Move key shares off the most-loaded replica until it is within `limit`; returns the move count."""
    replicas = len(loads)
    members: list[set[str]] = [set() for _ in range(replicas)]
    for key, row in rows.items():
        for r in row:
            members[r].add(key)
    moves = 0
    slack = 1e-12 * max(limit, 1.0)
    while moves < max_moves:
        top = max(range(replicas), key=lambda r: (loads[r], -r))
        excess = loads[top] - limit
        if excess <= slack:
            break
        by_load = sorted(range(replicas), key=lambda r: (loads[r], r))
        best, best_rank = None, None
        for key in members[top]:
            row = rows[key]
            share = lam[key] / len(row)
            dest = next((r for r in by_load if r not in row), None)
            if dest is None or loads[dest] + share > limit + slack:
                continue
            cost = 0.0 if key in changed else lam[key]
            if share >= excess:
                rank = (0, cost, share, key)           # clears the excess: cheapest, smallest
            else:
                rank = (1, cost > 0, -share, key)      # partial: free keys first, biggest share
            if best_rank is None or rank < best_rank:
                best, best_rank = (key, dest, share), rank
        if best is None:
            break
        key, dest, share = best
        rows[key] = tuple(sorted((set(rows[key]) - {top}) | {dest}))
        members[top].discard(key)
        members[dest].add(key)
        loads[top] -= share
        loads[dest] += share
        changed.add(key)
        moves += 1
    return moves
