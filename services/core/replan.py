"""Churn-aware re-planning and failure repair: change as little of the active plan as balance allows.

Rebuilding LPT from scratch after a small rate drift reassigns almost every key (the paper
measured 94.5% of key->replica assignments changed while 1.1% of keys changed k_b), and every
moved key costs a re-warm on its new replicas (SPEC section 2). The paper did not build a
churn-aware re-planner; this is ours.

`replan_incremental` (builder "incremental"), one control interval:
  1. size and admit by the new rates exactly like `build_plan` (same k_b, same admitted set);
  2. anchor: a surviving key keeps the replicas it had (by replica id) that still exist; if its
     k_b shrank it keeps the least-loaded of them; dropped keys leave the table;
  3. fill: newly admitted keys, and the extra replicas of keys whose k_b grew or whose replicas
     disappeared, go to the least-loaded distinct replicas (admission order, ties lowest index);
     with `homes` (key -> replica index), a newly admitted key's first replica is its home
     when the home's load stays within the home limit: the rebalancing limit below, or
     `home_rho` x q_cap if that is higher (default 0.5: below half its knee a replica's
     M/M/1 queue holds half a request on average, so locality beats balance there; the
     rebalancing step uses the same limit, else it would move the keys back). The planner passes the
     dispatchers' cold-tail ring home (`ring_homes`): a key the cold tail has served so far
     has its prefix cached there, so admitting it there costs no re-warm (issue 12: every
     tenant admitted after the first plan paid a second cold prefill on another replica);
  4. rebalance: while the most-loaded replica exceeds limit = mean load x the from-scratch LPT
     imbalance x (1 + tolerance), move one key share off it to the least-loaded replica the key
     does not use, never pushing that replica over the limit. Preferred move: one that clears
     the whole excess at the least churn (keys already moved or new this interval are free,
     others cost their rate); if none does, the largest share, free keys first.
Knob: `tolerance` (default 0.05: imbalance within 5% of from-scratch LPT), `max_moves`.

Speed (a control interval re-plans every admitted key): the steps run over columns of the
admitted keys, in admission order: rows as one int64 array (`_Rows`: the replica of a
one-replica row, -1 for none, -2 for a row of several kept beside it), loads summed with
np.add.at in the per-key loop's order (so every float is the loop's), the fill from a heap of
(load, replica) with stale entries skipped, each rebalancing move ranked over the top
replica's keys in arrays, churn from the columns. Results equal the per-key version
(tests/reference/replan_v1.py) key for key and bit for bit (tests/unit/test_replan_equivalence.py).
The keys are checked distinct by a key -> position dict over the window (the pass a set would
cost), the active plan's keys are found in it (the interval's one lookup pass), its rows are
taken by position, and the plan records where its rows and its parent's keys sit in the window
(`Plan.layout`), which the switching rule aligns by. With the store's key ids (a snapshot's
`key_ids`, distinct per key and stable between reads of one id space) and an active plan whose
layout recorded its rows' ids in the same space, no dict is built: distinct ids show the keys
distinct and the active keys' window positions are one gather by id. With `ordered` (a
snapshot's keys: rate desc, ties key asc) admission takes the keys in window order.

`build_at_home` (builder "home"): a first plan for a cluster whose cold tail has been serving
the traffic: `replan_incremental` from an empty plan, so every key starts on its home when
that stays within the limit, and rebalancing (every key is new, so every move is free) brings
the imbalance within `tolerance` of LPT's.

`repair_plan` (builder "repair"): the replicas in `dead_replica_ids` leave the plan; only keys
that lost a replica get new ones (least-loaded survivors), the cold tail is spread over the
survivors, and if the smaller cluster's slot budget C = R' x W is exceeded the lowest-rate keys
fall back to the cold tail. Nothing else moves, so the repair's churn is only what failed.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from itertools import chain, repeat
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import numpy as np

from services.core.plan import Plan, TableLayout
from services.core.planning import (RowColumns, admit, check_inputs, checked_key_ids, exact_sum, imbalance, place_lpt, size_keys,
                                    with_churn)
from services.core.ring import Ring
from services.core.table import ArrayRates

DEFAULT_TOLERANCE = 0.05
DEFAULT_HOME_RHO = 0.5


def ring_homes(replicas: int) -> Callable[[str], int]:
    """key -> the replica the dispatchers' CHWBL cold tail sends it to while loads are within its
    bound: the first owner on the same ring (services.core.policies.chwbl, 160 vnodes), by index
    into the replica list the dispatchers and the plan share."""
    return Ring(replicas, 160).first      # the first owner clockwise: what walk() yields first


def replan_incremental(active: Plan, keys: Sequence[str], rates: Sequence[float] | np.ndarray,
                       replica_ids: Sequence[str], q_cap: float, warm_slots: int, *, version: int,
                       created_at: float = 0.0, tolerance: float = DEFAULT_TOLERANCE, max_moves: int | None = None,
                       rates_snapshot_id: str = "", window_seconds: float = 0.0,
                       homes: Callable[[str], int] | None = None, home_rho: float = DEFAULT_HOME_RHO,
                       key_ids: np.ndarray | None = None, key_space: str = "", ordered: bool = False) -> Plan:
    """A plan for the new rates that keeps the active plan's assignments where balance allows.
    `key_ids`, `key_space`: the store's id of each key (RatesSnapshot.key_ids); with them the
    active plan's keys are found by id when its layout recorded ids of the same space.
    `ordered`: the keys are in a RatesSnapshot's order (rate desc, ties key asc): admission
    takes them in window order (planning.admit)."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not math.isfinite(home_rho) or home_rho < 0:
        raise ValueError(f"home_rho must be a finite number >= 0, got {home_rho!r}")
    window = keys
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    rate_arr = np.asarray(rates, dtype=np.float64)
    ids, a_pos = _match_window(active, keys, rate_arr, replica_ids, q_cap, warm_slots, key_ids, key_space)
    R = len(replica_ids)
    sizes = size_keys(rate_arr, q_cap, R)
    chosen = admit(keys, rate_arr, sizes, R * int(warm_slots), ordered=ordered)
    cold = np.ones(len(keys), dtype=bool)
    cold[chosen] = False
    cold_load = exact_sum(rate_arr[cold]) / R
    lam, k = rate_arr[chosen], sizes[chosen]
    # the balance yardstick: LPT from scratch over the same admitted keys (build_plan's loads)
    scratch_imbalance = imbalance(place_lpt(lam, k, R, cold_load, rows=False)[1])
    m = len(chosen)       # admitted in window order: the first m keys (a slice, no per-key gather)
    prefix = ordered and (m == 0 or (int(chosen[-1]) == m - 1 and bool((np.diff(chosen) > 0).all())))
    order = list(keys[:m]) if prefix else [keys[i] for i in chosen.tolist()]
    anchors = _anchor_at(active, replica_ids, a_pos, chosen, len(keys))
    admitted = exact_sum(lam)
    home_floor = home_rho * float(q_cap) if homes is not None else 0.0
    tolerance = max(tolerance, noise_tolerance(cold_load + admitted / R, window_seconds))
    home_limit = max(home_floor, (cold_load + admitted / R) * scratch_imbalance * (1.0 + tolerance))
    rows, loads, changed = _place_anchored(order, lam, k, anchors, R, cold_load, homes=homes, limit=home_limit)
    limit = max(home_floor, math.fsum(loads) / R * scratch_imbalance * (1.0 + tolerance))
    moves = _rebalance(order, rows, lam, loads, changed, limit,
                       max_moves if max_moves is not None else 4 * len(order) + R)

    total = float(rate_arr.sum())
    table = MappingProxyType(dict(zip(order, rows.tuples())))
    plan = Plan(
        version=version, parent_version=active.version, created_at=created_at,
        replica_ids=tuple(replica_ids), q_cap=float(q_cap), warm_slots=int(warm_slots),
        table=table, rates=ArrayRates(table, lam), expected_load=tuple(loads),
        predicted_imbalance=imbalance(loads), total_keys=len(keys), admitted_keys=len(order),
        admitted_rate_share=admitted / total if total > 0 else 0.0,
        builder="incremental", rates_snapshot_id=rates_snapshot_id, window_seconds=float(window_seconds),
        extra={"scratch_imbalance": scratch_imbalance, "tolerance": tolerance, "moves": moves},
        churn=_churn(anchors, rows, lam, admitted),
        layout=_layout(table, window, chosen, rows, active.table, a_pos, ids, key_space),
    )
    return plan


def _match_window(active: Plan, keys: Sequence[str], rate_arr: np.ndarray, replica_ids: Sequence[str],
                  q_cap: float, warm_slots: int, key_ids, key_space: str) -> tuple[np.ndarray | None, np.ndarray]:
    """Check the inputs and find the active plan's keys in this window: (the checked store ids
    or None, per active row its window position or -1). By store id when the active plan's
    layout recorded ids of the same space, else the one pass by dict of the interval."""
    ids = checked_key_ids(key_ids, len(keys)) if key_space else None
    lay = active.layout_of()
    by_id = ids is not None and lay is not None and lay.ids is not None and lay.key_space == key_space
    index = check_inputs(keys, rate_arr, replica_ids, q_cap, warm_slots, index=not by_id, distinct=by_id)
    if by_id:
        return ids, _positions_by_id(ids, lay.ids)
    return ids, np.fromiter(map(index.get, active.table, repeat(-1)), dtype=np.int64, count=len(active.table))


def _positions_by_id(ids: np.ndarray, row_ids: np.ndarray) -> np.ndarray:
    """Per active row (its key's id `row_ids`), the window position of the key with that id, -1
    for none: what the dict over the window finds for the same keys."""
    top = max(int(ids.max()) if len(ids) else -1, int(row_ids.max()) if len(row_ids) else -1)
    at = np.full(top + 2, -1, dtype=np.int64)
    at[ids] = np.arange(len(ids), dtype=np.int64)
    return at[row_ids]


def _layout(table, window, chosen: np.ndarray, rows: "_Rows", parent, a_pos: np.ndarray,
            ids: np.ndarray | None = None, key_space: str = "") -> TableLayout | None:
    """The builder's record of `table` (services.core.plan.TableLayout); None with an empty row."""
    if (rows.one == -1).any():
        return None
    arrays = (chosen.astype(np.int64), rows.one.copy(), a_pos) + ((ids[chosen],) if ids is not None else ())
    for a in arrays:
        a.flags.writeable = False
    return TableLayout(table, window, arrays[0], arrays[1], dict(rows.multi), parent, arrays[2],
                       ids=arrays[3] if ids is not None else None, key_space=key_space if ids is not None else "")


def served_homes(served_at: Mapping[str, int], fallback: Callable[[str], int]) -> Callable[[str], int]:
    """key -> the replica its latest request was served on (telemetry's record, issue 23: the
    cold tail balances first-sight keys, so admitting a key anywhere else moves its cache),
    else `fallback` (the ring home)."""
    get = served_at.get
    return lambda key: r if (r := get(key)) is not None else fallback(key)


def noise_tolerance(mean_rate: float, window_seconds: float) -> float:
    """Two standard errors of a replica's windowed load estimate: `mean_rate` req/s counted over
    `window_seconds` is a Poisson count of n = rate x window arrivals, so the estimate's relative
    error is 1/sqrt(n). A replica looking this much over the mean may not be over it at all, and
    moving keys off it for that (each move re-warms the key elsewhere) chases noise; 0 without a
    window (no estimate to doubt)."""
    n = mean_rate * window_seconds
    return 2.0 / math.sqrt(n) if n > 0 else 0.0


def build_at_home(keys: Sequence[str], rates: Sequence[float] | np.ndarray, replica_ids: Sequence[str],
                  q_cap: float, warm_slots: int, homes: Callable[[str], int], *, version: int,
                  created_at: float = 0.0, tolerance: float = DEFAULT_TOLERANCE, rates_snapshot_id: str = "",
                  window_seconds: float = 0.0) -> Plan:
    """A first plan with every key on its home where balance allows (module header)."""
    empty = Plan(version=1, parent_version=0, created_at=0.0, replica_ids=tuple(replica_ids), q_cap=float(q_cap),
                 warm_slots=int(warm_slots), table={}, rates={}, expected_load=(), predicted_imbalance=1.0,
                 total_keys=0, admitted_keys=0, admitted_rate_share=0.0)
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

    anchors = _anchor_rows(active, survivors, order)
    rows, loads, _ = _place_anchored(order, np.array([lam[key] for key in order], dtype=np.float64),
                                     np.array([k[key] for key in order], dtype=np.int64), anchors, R, cold_total / R)
    prefixes = _repair_prefixes(active, survivors, loads)
    plan = replace(
        active, prefixes=prefixes, version=version, parent_version=active.version, created_at=created_at,
        replica_ids=tuple(survivors), table=dict(zip(order, rows.tuples())),
        rates={key: lam[key] for key in order}, expected_load=tuple(loads), predicted_imbalance=imbalance(loads),
        admitted_keys=len(order), admitted_rate_share=math.fsum(lam[key] for key in order) / total if total > 0 else 0.0,
        builder="repair", decision=None, shadow=None, extra={"dead_replicas": sorted(dead)}, layout=None,
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


def _fit_budget(order: list[str], k: Mapping[str, int], budget: int) -> list[str]:
    """Drop the lowest-rate keys (end of `order`) until the sizes fit the slot budget."""
    used = sum(k[key] for key in order)
    keep = list(order)
    while keep and used > budget:
        used -= k[keep.pop()]
    return keep


class _Rows:
    """Replica rows of the admitted keys in columns, by position in admission order: `one[p]` is
    the replica of a one-replica row, -1 for an empty row, -2 for a row of several (`multi[p]`,
    ascending). Almost every key has one replica, so the common case is one int64 array."""

    __slots__ = ("one", "multi")

    def __init__(self, one: np.ndarray, multi: dict[int, tuple[int, ...]]) -> None:
        self.one = one
        self.multi = multi

    def row(self, p: int) -> tuple[int, ...]:
        r = int(self.one[p])
        return (r,) if r >= 0 else (self.multi[p] if r == -2 else ())

    def set(self, p: int, row: tuple[int, ...]) -> None:
        if len(row) == 1:
            self.one[p] = row[0]
            self.multi.pop(p, None)
        elif row:
            self.one[p] = -2
            self.multi[p] = row
        else:
            self.one[p] = -1
            self.multi.pop(p, None)

    def tuples(self) -> list[tuple[int, ...]]:
        # one shared (r,) per replica rather than one per key (a million keys: 0.17 s, 56 MB);
        # index -1 and -2 pick (-1,) and (-2,), what the per-key tuples held there
        hi = int(self.one.max()) if len(self.one) else -1
        single = [(r,) for r in range(hi + 1)] + [(-2,), (-1,)]
        out = list(map(single.__getitem__, self.one.tolist()))
        for p, row in self.multi.items():
            out[p] = row
        return out


@dataclass(frozen=True, slots=True)
class _Anchors:
    rows: _Rows            # each key's active replicas that still exist, as new indices
    known: np.ndarray      # bool: the key is in the active plan
    lost: np.ndarray       # bool: some of its active replicas are gone


def _anchor_rows(active: Plan, replica_ids: Sequence[str], keys: Sequence[str]) -> _Anchors:
    """Each key's active replicas that still exist, as indices into `replica_ids`."""
    index = {rid: i for i, rid in enumerate(replica_ids)}
    remap = np.array([index.get(rid, -1) for rid in active.replica_ids] + [-1], dtype=np.int64)
    gone = len(active.replica_ids)                      # remap[gone] == -1: no row
    old = list(map(active.table.get, keys, repeat(())))
    m = len(keys)
    lens = np.fromiter(map(len, old), dtype=np.int64, count=m)
    flat = np.fromiter(chain.from_iterable(old), dtype=np.int64, count=int(lens.sum()))
    first = np.full(m, gone, dtype=np.int64)
    has = lens > 0
    first[has] = flat[(np.cumsum(lens) - lens)[has]]
    one = remap[first]
    one[lens != 1] = -1
    lost = (lens == 1) & (one < 0)
    multi: dict[int, tuple[int, ...]] = {}
    rows = _Rows(one, multi)
    for p in np.flatnonzero(lens > 1).tolist():
        row = old[p]
        kept = tuple(sorted(int(remap[i]) for i in row if remap[i] >= 0))
        rows.set(p, kept)
        lost[p] = len(kept) < len(row)
    return _Anchors(rows, has, lost)


def _anchor_at(active: Plan, replica_ids: Sequence[str], a_pos: np.ndarray, chosen: np.ndarray,
               n_window: int) -> _Anchors:
    """`_anchor_rows` for the admitted keys `chosen` (window positions), the active plan's rows
    found by window position (`a_pos`: per active row, -1 outside the window) in columns
    (RowColumns) rather than by key: the same anchors."""
    index = {rid: i for i, rid in enumerate(replica_ids)}
    remap = np.array([index.get(rid, -1) for rid in active.replica_ids] + [-1], dtype=np.int64)
    cols = RowColumns.of(active)
    at = np.full(n_window + 1, -1, dtype=np.int64)
    inside = np.flatnonzero(a_pos >= 0)
    at[a_pos[inside]] = inside
    where = at[chosen]                                   # per admitted key: its active row, or -1
    found = where >= 0
    lens = np.zeros(len(chosen), dtype=np.int64)
    lens[found] = cols.lens[where[found]]
    single = lens == 1
    one = np.full(len(chosen), -1, dtype=np.int64)
    one[single] = remap[cols.one[where[single]]]
    lost = single & (one < 0)
    rows = _Rows(one, {})
    for p in np.flatnonzero(lens > 1).tolist():
        row = cols.multi[int(where[p])]
        kept = tuple(sorted(int(remap[i]) for i in row if remap[i] >= 0))
        rows.set(p, kept)
        lost[p] = len(kept) < len(row)
    return _Anchors(rows, lens > 0, lost)


def _churn(anchors: _Anchors, rows: _Rows, lam: np.ndarray, admitted: float) -> float:
    """plan_diff(active, plan).churn from the columns: the share of the admitted rate whose
    replica-id set differs from the active plan's (new keys included)."""
    a, b = anchors.rows, rows
    same = (a.one == b.one) & (b.one >= 0)
    for p in set(a.multi) | set(b.multi):
        same[p] = a.row(p) == b.row(p)
    same &= anchors.known & ~anchors.lost
    return exact_sum(lam[~same]) / admitted if admitted > 0 else 0.0


def _place_anchored(order: Sequence[str], lam: np.ndarray, k: np.ndarray, anchors: _Anchors, replicas: int,
                    cold_load: float, *, homes: Callable[[str], int] | None = None,
                    limit: float = math.inf) -> tuple[_Rows, list[float], np.ndarray]:
    """Keep anchored shares, trim keys that shrank, then fill missing shares least-loaded first
    (a new key's home first when it stays within `limit`); returns the rows, the loads and
    which keys changed (trimmed or filled).

    Loads are summed in the per-key order of the plain loop (np.add.at adds in index order),
    so every float is the one that loop computes; the fill keeps a heap of (load, replica)
    with stale entries skipped, which picks what sorting all replicas by (load, index) picks."""
    m = len(order)
    share = lam / k
    src = anchors.rows
    one = src.one.copy()
    rows = _Rows(one, {})
    shrunk: list[int] = []
    parts_p, parts_r = [np.flatnonzero(one >= 0)], []
    parts_r.append(one[parts_p[0]])
    multi_short: list[int] = []
    for p, kept in sorted(src.multi.items()):
        if len(kept) > k[p]:
            shrunk.append(p)
            one[p] = -1
            continue
        rows.set(p, kept)
        parts_p.append(np.full(len(kept), p, dtype=np.int64))
        parts_r.append(np.array(kept, dtype=np.int64))
        if len(kept) < k[p]:
            multi_short.append(p)
    pos, rep = np.concatenate(parts_p), np.concatenate(parts_r)
    if len(parts_p) > 1:
        by_pos = np.argsort(pos, kind="stable")
        pos, rep = pos[by_pos], rep[by_pos]
    acc = np.full(replicas, cold_load, dtype=np.float64)
    np.add.at(acc, rep, share[pos])
    loads = acc.tolist()
    short = np.flatnonzero((src.one == -1) | ((src.one >= 0) & (k > 1)))
    if multi_short:
        short = np.union1d(short, np.array(multi_short, dtype=np.int64))
    changed = np.zeros(m, dtype=bool)
    share_l = share.tolist()
    k_l = k.tolist()
    for p in shrunk:
        kept = tuple(sorted(sorted(src.multi[p], key=lambda r: (loads[r], r))[: k_l[p]]))
        for r in kept:
            loads[r] += share_l[p]
        rows.set(p, kept)
        changed[p] = True
    heap = [(load, r) for r, load in enumerate(loads)]
    heapq.heapify(heap)
    pop, push, swap = heapq.heappop, heapq.heappush, heapq.heapreplace
    bare = (src.one == -1) & (k == 1)            # new one-replica keys: the common case, inline
    for p, alone in zip(short.tolist(), bare[short].tolist()):
        s = share_l[p]
        if alone:
            if homes is not None:
                home = homes(order[p])
                if 0 <= home < replicas and loads[home] + s <= limit:
                    loads[home] += s
                    push(heap, (loads[home], home))
                    one[p] = home
                    changed[p] = True
                    continue
            while heap[0][0] != loads[heap[0][1]]:
                pop(heap)                     # stale
            r = heap[0][1]
            loads[r] += s
            swap(heap, (loads[r], r))
            one[p] = r
            changed[p] = True
            continue
        row = rows.row(p)
        have = set(row)
        if homes is not None and not row:
            home = homes(order[p])
            if 0 <= home < replicas and loads[home] + s <= limit:
                loads[home] += s
                push(heap, (loads[home], home))
                have.add(home)
        need = k_l[p] - len(have)
        picked: list[int] = []
        back: list[tuple[float, int]] = []
        seen: set[int] = set()
        while len(picked) < need:
            load, r = pop(heap)
            if load != loads[r] or r in seen:
                continue                      # stale, or a duplicate of an entry already taken
            seen.add(r)
            if r in have:
                back.append((load, r))
            else:
                picked.append(r)
        for entry in back:
            push(heap, entry)
        for r in picked:
            loads[r] += s
            push(heap, (loads[r], r))
            have.add(r)
        rows.set(p, tuple(sorted(have)))
        changed[p] = True
    return rows, loads, changed


def _rebalance(order: Sequence[str], rows: _Rows, lam: np.ndarray, loads: list[float], changed: np.ndarray,
               limit: float, max_moves: int) -> int:
    """Move key shares off the most-loaded replica until it is within `limit`; returns the move
    count. Each move ranks the top replica's keys in arrays: one that clears the whole excess
    at the least cost (keys already changed are free, others cost their rate), then the
    smallest share, then the key; else free keys first, the biggest share, then the key."""
    replicas = len(loads)
    members: list[set[int]] | None = None
    moves = 0
    slack = 1e-12 * max(limit, 1.0)
    while moves < max_moves:
        top = max(range(replicas), key=lambda r: (loads[r], -r))
        excess = loads[top] - limit
        if excess <= slack:
            break
        if members is None:
            members = [set() for _ in range(replicas)]
            singles = np.flatnonzero(rows.one >= 0)
            reps = rows.one[singles]
            by_rep = np.argsort(reps, kind="stable")
            singles, reps = singles[by_rep], reps[by_rep]
            bounds = np.searchsorted(reps, np.arange(replicas + 1))
            for r in range(replicas):
                members[r] = set(singles[bounds[r]:bounds[r + 1]].tolist())
            for p, row in rows.multi.items():
                for r in row:
                    members[r].add(p)
        by_load = sorted(range(replicas), key=lambda r: (loads[r], r))
        cand = np.fromiter(members[top], dtype=np.int64, count=len(members[top]))
        if not len(cand):
            break
        share = lam[cand].copy()
        d1 = next((r for r in by_load if r != top), -1)
        dest = np.full(len(cand), d1, dtype=np.int64)
        for j in np.flatnonzero(rows.one[cand] < 0).tolist():
            row = rows.multi[int(cand[j])]
            share[j] = lam[cand[j]] / len(row)
            dest[j] = next((r for r in by_load if r not in row), -1)
        load_arr = np.array(loads, dtype=np.float64)
        ok = (dest >= 0) & (load_arr[dest] + share <= limit + slack)
        if not ok.any():
            break
        cost = np.where(changed[cand], 0.0, lam[cand])
        clears = ok & (share >= excess)
        if clears.any():
            j = np.flatnonzero(clears)
            j = j[cost[j] == cost[j].min()]
            j = j[share[j] == share[j].min()]
        else:
            j = np.flatnonzero(ok)
            paid = cost[j] > 0
            if not paid.all():
                j = j[~paid]
            j = j[share[j] == share[j].max()]
        best = min(j.tolist(), key=lambda i: order[int(cand[i])])
        p, d, s = int(cand[best]), int(dest[best]), float(share[best])
        rows.set(p, tuple(sorted((set(rows.row(p)) - {top}) | {d})))
        members[top].discard(p)
        members[d].add(p)
        loads[top] -= s
        loads[d] += s
        changed[p] = True
        moves += 1
    return moves
