"""Planning core: sizing, admission and LPT placement for one control interval.

The rule (SPEC section 1; CacheRoute paper, arXiv 2608.19677, section 3):

  sizing     k_b = max(1, ceil(lambda_b / q_cap)), the distinct replicas key b needs so that
             none carries more than q_cap of it. We also cap k_b at R: a key cannot use more
             distinct replicas than exist, so a key hotter than R * q_cap gets all R (and the
             overload shows in the predicted imbalance instead of an impossible table row).
  admission  keys by lambda desc (ties: key ascending, so a build is deterministic); admit
             greedily while sum k_b <= C = R * W. A key that does not fit is skipped and the
             scan continues (the paper's variant). Zero-rate keys are never admitted.
             Everything not admitted is the cold tail.
  placement  LPT: every replica starts at the cold-tail load sum_cold lambda / R; each admitted
             key, in admission order, gets the k_b least-loaded distinct replicas (ties: lowest
             index) and adds lambda_b / k_b to each.

Knobs: the replica set (R), q_cap (req/s one replica carries at the latency knee), W (warm
slots per replica), `admission`:
  "rate"     (default) the paper's rule above.
  "density"  byte-aware admission (ours): rank keys by value density lambda_b * P_b / k_b, the
             prefill tokens per second a warm slot saves (P_b = reusable prefix tokens, passed as
             `prefix_tokens`), ties rate desc then key asc; same skip-and-continue budget scan. A
             hot key with a short prefix saves little per slot, so it no longer crowds out a
             slightly cooler key with a long one. Placement still runs LPT over the admitted keys
             in rate order, so balance is unchanged. Output: a `Plan` with the table, per-replica expected load (sums to the
total rate) and predicted imbalance max/mean.

Speed (the control path rebuilds every interval): admission is vectorised. Sizes are
non-increasing along the admission order, so after the first key that does not fit only keys
with k_b <= the remaining budget can fit, and they form a suffix found by binary search; each
skip strictly lowers the k_b level, so the scan is a few cumsum/searchsorted passes. Rate ties
only need key order inside tie groups that reach the admitted region (equal rates mean equal
k_b, so how many of a group are admitted does not depend on their order). Placement is a
binary heap over R replicas, touched only by admitted keys, except long runs of equal-rate
one-replica keys, placed by one merge (services/core/lpt.py). The result equals the plain heapq
transcription of the paper's pseudocode in bench/plan_build.py bit for bit: the cold-tail sum
is correctly rounded (`exact_sum`, equal to math.fsum there, so independent of summation order)
and every replica load is accumulated in the same order as there.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from itertools import chain
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from services.core.lpt import place_lpt
from services.core.plan import Plan, TableLayout


# ---------------------------------------------------------------------------------------------
# validation


def check_inputs(keys: Sequence[str], rates: np.ndarray, replica_ids: Sequence[str], q_cap: float,
                 warm_slots: int, *, index: bool = False, distinct: bool = False) -> dict[str, int] | None:
    """Raise ValueError (one line) for inputs the planner cannot use. `index`: return
    key -> position, the dict that checks the keys are distinct (the same pass as a set).
    `distinct`: the caller has shown the keys distinct (distinct store ids), so no set is built."""
    if len(replica_ids) < 1:
        raise ValueError("need at least one replica (R >= 1)")
    if len(set(replica_ids)) != len(replica_ids):
        raise ValueError(f"duplicate replica id {_first_duplicate(replica_ids)!r}")
    if not _is_real(q_cap) or not math.isfinite(q_cap) or q_cap <= 0:
        raise ValueError(f"q_cap must be a finite number > 0, got {q_cap!r}")
    if not _is_real(warm_slots) or not math.isfinite(warm_slots) or int(warm_slots) != warm_slots \
            or warm_slots < 1:
        raise ValueError(f"warm_slots must be an integer >= 1, got {warm_slots!r}")
    if rates.ndim != 1 or len(rates) != len(keys):
        raise ValueError(f"got {len(keys)} keys but {rates.size} rates")
    bad = ~np.isfinite(rates) | (rates < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"rate of key {keys[i]!r} must be finite and >= 0, got {rates[i]!r}")
    if distinct and not index:
        if "" in keys:
            raise ValueError("empty key")
        return None
    unique = dict(zip(keys, range(len(keys)))) if index else set(keys)
    if len(unique) != len(keys):
        raise ValueError(f"duplicate key {_first_duplicate(keys)!r}")
    if "" in unique:
        raise ValueError("empty key")
    return unique if index else None


def checked_key_ids(key_ids, n: int) -> np.ndarray:
    """The window's store ids as int64, checked: one per key, >= 0 and distinct (so the keys are)."""
    ids = np.asarray(key_ids, dtype=np.int64) if key_ids is not None else None
    if ids is None or ids.ndim != 1 or len(ids) != n:
        raise ValueError(f"key_ids: need one id per key ({n}), got {None if ids is None else ids.shape}")
    if n and int(ids.min()) < 0:
        raise ValueError("key_ids must be >= 0")
    if n and int(ids.max()) <= 4 * n + 1024:          # a store's ids: dense, so a bitmap
        seen = np.zeros(int(ids.max()) + 1, dtype=bool)
        seen[ids] = True
        repeat_id = int(np.count_nonzero(seen)) != n
    else:
        s = np.sort(ids)
        repeat_id = bool((s[1:] == s[:-1]).any())
    if repeat_id:
        raise ValueError("key_ids repeat an id")
    return ids


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _first_duplicate(items: Sequence[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    raise AssertionError("no duplicate")


# ---------------------------------------------------------------------------------------------
# the three steps


def size_keys(rates: np.ndarray, q_cap: float, replicas: int) -> np.ndarray:
    """k_b = min(R, max(1, ceil(lambda_b / q_cap))) as int64 (zero-rate keys get 1)."""
    with np.errstate(over="ignore"):  # a ratio that overflows to inf is capped at R anyway
        k = np.ceil(np.asarray(rates, dtype=np.float64) / q_cap)
    return np.clip(k, 1, replicas).astype(np.int64)


def admit(keys: Sequence[str], rates: np.ndarray, sizes: np.ndarray, budget: int, *,
          ordered: bool = False) -> np.ndarray:
    """Indices of the admitted keys, in admission (= placement) order: rate desc, key asc.
    `ordered`: the caller's keys already are in that order (a RatesSnapshot's: hottest first,
    ties by key), so when the rates are non-increasing the order is the index order, no sort."""
    positive = int(np.count_nonzero(rates > 0))
    if ordered and positive and bool((rates[1:positive] <= rates[:positive - 1]).all()) \
            and not rates[positive:].any():
        mask, _ = _scan_budget(sizes[:positive], budget)
        return np.flatnonzero(mask)
    head = min(positive, 2 * budget + 64)  # the scan almost always ends this early
    while True:
        order = _top_order(rates, head, positive)
        sorted_rates = rates[order]
        mask, used = _scan_budget(sizes[order], budget)
        if not mask.any():
            return order[:0]
        last = int(np.flatnonzero(mask)[-1])
        # a partial sort is enough once the budget is spent and the last admitted key's tie
        # group lies wholly inside the head (keys outside it rate <= sorted_rates[-1])
        if head == positive or (used == budget and sorted_rates[last] > sorted_rates[-1]):
            break
        head = positive
    _order_ties_by_key(order, sorted_rates, last, keys)
    return order[mask]


def _top_order(rates: np.ndarray, head: int, positive: int) -> np.ndarray:
    """Indices of the `head` largest rates, rate desc (tie order arbitrary)."""
    neg = -rates
    if head < positive:
        top = np.argpartition(neg, head - 1)[:head]
        return top[np.argsort(neg[top])]
    return np.argsort(neg)[:positive]


def _scan_budget(k: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """Greedy skip-and-continue admission over non-increasing sizes `k`: (mask, slots used)."""
    n = len(k)
    mask = np.zeros(n, dtype=bool)
    csum = np.cumsum(k)
    neg_k = -k  # non-decreasing, for binary search of the first k <= x
    start, used = 0, 0
    while start < n and used < budget:
        base = int(csum[start - 1]) if start else 0
        end = int(np.searchsorted(csum, budget - used + base, side="right"))
        mask[start:end] = True
        if end > start:
            used += int(csum[end - 1]) - base
        remaining = budget - used
        if end >= n or remaining <= 0:
            break
        # key `end` did not fit; the next one that can is the first with k <= remaining
        start = max(end + 1, int(np.searchsorted(neg_k, -remaining, side="left")))
    return mask, used


def _order_ties_by_key(order: np.ndarray, sorted_rates: np.ndarray, last: int, keys: Sequence[str]) -> None:
    """Sort, in place, each run of equal rates in `order` that starts at or before `last` by key."""
    span = sorted_rates[: last + 2]
    ties = span[1:] == span[:-1]
    if not ties.any():
        return
    n = len(sorted_rates)
    boundaries = np.flatnonzero(sorted_rates[1:] != sorted_rates[:-1]) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [n]))
    wanted = (starts <= last) & (ends - starts > 1)
    for s, e in zip(starts[wanted].tolist(), ends[wanted].tolist()):
        order[s:e] = sorted(order[s:e].tolist(), key=keys.__getitem__)


def imbalance(loads: Sequence[float]) -> float:
    """max/mean of per-replica load; 1.0 when there is no load at all."""
    total = math.fsum(loads)
    if total <= 0:
        return 1.0
    return max(loads) * len(loads) / total


@dataclass(frozen=True, slots=True)
class RowColumns:
    """A plan's rows in table order as columns: each row's length, the replica of one-replica
    rows (-1 elsewhere), and the other rows (empty or of several) by position. From the
    builder's record (`Plan.layout_of`) when the plan has one, else one pass over the rows."""

    lens: np.ndarray                       # int64
    one: np.ndarray                        # int64
    multi: Mapping[int, tuple[int, ...]]

    @classmethod
    def of(cls, plan: Plan) -> "RowColumns":
        lay = plan.layout_of()
        if lay is not None:
            lens, one = np.ones(len(lay.one), dtype=np.int64), lay.one.copy()
            for p, row in lay.multi.items():
                lens[p] = len(row)
                one[p] = -1
            return cls(lens, one, lay.multi)
        rows = list(plan.table.values())
        n = len(rows)
        lens = np.fromiter(map(len, rows), dtype=np.int64, count=n)
        flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lens.sum()))
        one = np.full(n, -1, dtype=np.int64)
        single = lens == 1
        one[single] = flat[(np.cumsum(lens) - lens)[single]]
        return cls(lens, one, {p: tuple(rows[p]) for p in np.flatnonzero(~single).tolist()})

    def row(self, p: int) -> tuple[int, ...]:
        r = int(self.one[p])
        return (r,) if r >= 0 else self.multi[p]

    def flat(self) -> np.ndarray:
        """Every row's replicas back to back, in table order."""
        starts = np.cumsum(self.lens) - self.lens
        out = np.empty(int(self.lens.sum()), dtype=np.int64)
        single = self.one >= 0
        out[starts[single]] = self.one[single]
        for p, row in self.multi.items():
            out[starts[p]:starts[p] + len(row)] = row
        return out


# ---------------------------------------------------------------------------------------------
# the builder


def build_plan(keys: Sequence[str], rates: Sequence[float] | np.ndarray, replica_ids: Sequence[str],
               q_cap: float, warm_slots: int, *, version: int = 1, parent: Plan | None = None,
               created_at: float = 0.0, rates_snapshot_id: str = "", window_seconds: float = 0.0,
               admission: str = "rate", prefix_tokens: Sequence[float] | np.ndarray | None = None,
               key_ids: np.ndarray | None = None, key_space: str = "") -> Plan:
    """Size, admit and place (module header). `churn` is filled in when `parent` is given.
    `prefix_tokens` (per key, aligned with `keys`) is needed by admission="density" only.
    `key_ids`, `key_space` (a RatesSnapshot's): the plan records where its rows sit in the
    window and their keys' ids (`Plan.layout`), so the next churn-aware re-plan finds them by id."""
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    rate_arr = np.asarray(rates, dtype=np.float64)
    check_inputs(keys, rate_arr, replica_ids, q_cap, warm_slots)
    replicas = len(replica_ids)
    sizes = size_keys(rate_arr, q_cap, replicas)
    if admission == "rate":
        chosen = admit(keys, rate_arr, sizes, replicas * int(warm_slots))
    elif admission == "density":
        chosen = admit_by_density(keys, rate_arr, sizes, _prefix_array(prefix_tokens, len(keys)),
                                  replicas * int(warm_slots))
    else:
        raise ValueError(f"unknown admission {admission!r}; valid: {', '.join(ADMISSIONS)}")
    chosen_rates = rate_arr[chosen]
    total = float(rate_arr.sum())
    admitted_rate = float(chosen_rates.sum())
    cold_load = _cold_load(rate_arr, chosen, replicas)
    rows, loads = place_lpt(chosen_rates, sizes[chosen], replicas, cold_load)
    chosen_keys = [keys[i] for i in chosen.tolist()]
    table = MappingProxyType(dict(zip(chosen_keys, rows)))      # as Plan freezes it (no second copy)
    layout = _window_layout(table, keys, chosen, rows, checked_key_ids(key_ids, len(keys)), key_space) \
        if key_space else None
    plan = Plan(
        version=version,
        parent_version=parent.version if parent is not None else 0,
        created_at=created_at,
        replica_ids=tuple(replica_ids),
        q_cap=float(q_cap),
        warm_slots=int(warm_slots),
        table=table,
        rates=dict(zip(chosen_keys, chosen_rates.tolist())),
        expected_load=tuple(loads),
        predicted_imbalance=imbalance(loads),
        total_keys=len(keys),
        admitted_keys=len(chosen_keys),
        admitted_rate_share=admitted_rate / total if total > 0 else 0.0,
        builder="lpt",
        rates_snapshot_id=rates_snapshot_id,
        window_seconds=float(window_seconds),
        extra={"admission": admission} if admission != "rate" else {},
        layout=layout,
    )
    return with_churn(plan, parent)


def _window_layout(table: Mapping, window: Sequence[str], chosen: np.ndarray, rows: list[tuple[int, ...]],
                   ids: np.ndarray, key_space: str) -> TableLayout:
    """build_plan's record of `table` (services.core.plan.TableLayout): no parent positions."""
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    one = np.full(len(rows), -2, dtype=np.int64)
    single = np.flatnonzero(lens == 1)
    one[single] = np.fromiter((rows[p][0] for p in single.tolist()), dtype=np.int64, count=len(single))
    multi = {p: rows[p] for p in np.flatnonzero(lens != 1).tolist()}
    arrays = (chosen.astype(np.int64), one, ids[chosen])
    for a in arrays:
        a.flags.writeable = False
    return TableLayout(table, window, arrays[0], arrays[1], multi, None, None, ids=arrays[2], key_space=key_space)


ADMISSIONS = ("rate", "density")


def _prefix_array(prefix_tokens: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray:
    if prefix_tokens is None:
        raise ValueError("admission 'density' needs prefix_tokens per key")
    arr = np.asarray(prefix_tokens, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"got {n} keys but {arr.size} prefix token counts")
    if (~np.isfinite(arr) | (arr < 0)).any():
        raise ValueError("prefix token counts must be finite and >= 0")
    return arr


def admit_by_density(keys: Sequence[str], rates: np.ndarray, sizes: np.ndarray, prefix: np.ndarray,
                     budget: int) -> np.ndarray:
    """Admitted key indices for byte-aware admission, in placement order (rate desc, key asc).

    Rank by lambda_b * P_b / k_b desc (ties: rate desc, key asc), skip-and-continue while sum
    k_b <= budget. Keys with zero rate or zero reusable prefix save nothing and are never admitted.
    """
    density = rates * prefix / sizes
    useful = np.flatnonzero(density > 0)
    ranked = sorted(useful.tolist(), key=lambda i: (-density[i], -rates[i], keys[i]))
    chosen, used = [], 0
    for i in ranked:
        k = int(sizes[i])
        if used + k <= budget:
            chosen.append(i)
            used += k
            if used == budget:
                break
    chosen.sort(key=lambda i: (-rates[i], keys[i]))
    return np.asarray(chosen, dtype=np.int64)


def _cold_load(rates: np.ndarray, chosen: np.ndarray, replicas: int) -> float:
    cold = np.ones(len(rates), dtype=bool)
    cold[chosen] = False
    return exact_sum(rates[cold]) / replicas


_MANTISSA = 2.0**53
_HALF = 26


def exact_sum(values: np.ndarray) -> float:
    """The correctly rounded sum of finite float64 values, i.e. exactly `math.fsum`, vectorised.

    Each x is m * 2**(e - 53) with an integer |m| < 2**53 (frexp). Splitting m into 27- and
    26-bit halves lets per-exponent float bincounts stay exact (sums < 2**53 for up to 2**26
    values); Python ints then add the buckets exactly and int / int rounds correctly once.
    """
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return 0.0
    if len(x) > 2**_HALF:
        return math.fsum(x.tolist())
    frac, exp = np.frexp(x)
    low_exp = int(exp.min())
    bucket = exp - low_exp
    frac *= _MANTISSA                           # now an integer-valued float below 2**53
    hi = np.floor(frac * 2.0**-_HALF)           # exact: scaling by powers of two
    frac -= hi * 2.0**_HALF                     # the low 26 bits, exact
    hi_sum = np.bincount(bucket, weights=hi)
    lo_sum = np.bincount(bucket, weights=frac)
    total = 0
    for shift in np.flatnonzero((hi_sum != 0) | (lo_sum != 0)).tolist():
        total += ((int(hi_sum[shift]) << _HALF) + int(lo_sum[shift])) << shift
    scale = low_exp - 53
    if scale >= 0:
        return float(total << scale)
    return total / (1 << -scale)


def with_churn(plan: Plan, parent: Plan | None) -> Plan:
    """`plan` with churn (and parent_version) set against `parent`; unchanged without one."""
    if parent is None:
        return plan
    from dataclasses import replace

    return replace(plan, parent_version=parent.version, churn=plan_diff(parent, plan).churn)


# ---------------------------------------------------------------------------------------------
# comparing plans


@dataclass(frozen=True, slots=True)
class KeyMove:
    """One key of the new plan whose replica-id set differs from the old plan's."""

    key: str
    rate: float                      # lambda_b in the new plan
    old: tuple[str, ...]             # replica ids before (empty: newly admitted)
    new: tuple[str, ...]             # replica ids after


@dataclass(frozen=True, slots=True)
class PlanDiff:
    """Churn between two plans, compared by replica id (SPEC section 6).

    churn = moved_rate / admitted_rate, where admitted_rate is the new plan's admitted rate and
    moved_rate the part of it whose replica-id set differs from the old plan's (a newly admitted
    key counts as moved: its replicas must warm up).
    """

    churn: float
    moved_rate: float
    admitted_rate: float
    keys_kept: int                   # in both, same replica-id set
    keys_moved: int                  # in both, different set
    keys_added: int                  # admitted now, not before
    keys_removed: int                # admitted before, not now
    moves: tuple[KeyMove, ...]       # moved and added keys, rate desc then key
    removed: tuple[str, ...]         # sorted
    # prefix nodes (services.core.prefixes), by node id; same rules as keys, not part of `churn`
    prefix_moves: tuple[KeyMove, ...] = ()
    prefixes_kept: int = 0
    prefixes_removed: tuple[str, ...] = ()

    def summary(self, top: int = 10) -> dict[str, object]:
        """JSON-safe figures plus the `top` heaviest moves."""
        return {
            "churn": self.churn,
            "moved_rate": self.moved_rate,
            "admitted_rate": self.admitted_rate,
            "keys_kept": self.keys_kept,
            "keys_moved": self.keys_moved,
            "keys_added": self.keys_added,
            "keys_removed": self.keys_removed,
            "top_moves": [{"key": m.key, "rate": m.rate, "old": list(m.old), "new": list(m.new)}
                          for m in self.moves[:top]],
            "prefixes_kept": self.prefixes_kept,
            "prefixes_moved": sum(1 for m in self.prefix_moves if m.old),
            "prefixes_added": sum(1 for m in self.prefix_moves if not m.old),
            "prefixes_removed": len(self.prefixes_removed),
            "top_prefix_moves": [{"prefix": m.key, "rate": m.rate, "old": list(m.old), "new": list(m.new)}
                                 for m in self.prefix_moves[:top]],
        }


def replica_names(plan: Plan, key: str) -> tuple[str, ...]:
    """The replica ids serving `key` in `plan`, sorted; empty when the key is cold."""
    row = plan.table.get(key)
    if row is None:
        return ()
    return tuple(sorted(plan.replica_ids[i] for i in row))


def plan_diff(old: Plan, new: Plan) -> PlanDiff:
    moves: list[KeyMove] = []
    kept = moved = added = 0
    moved_parts: list[float] = []
    # same replica list (the normal case): rows of indices compare directly, names only for
    # the keys that differ (a million-key plan is mostly kept keys)
    same_ids = old.replica_ids == new.replica_ids
    old_table, new_table = old.table, new.table
    for key, rate in new.rates.items():
        if same_ids:
            a, b = old_table.get(key), new_table.get(key)
            if a is not None and b is not None and (a == b or sorted(a) == sorted(b)):
                kept += 1
                continue
        before = replica_names(old, key)
        after = replica_names(new, key)
        if before == after:
            kept += 1
            continue
        if before:
            moved += 1
        else:
            added += 1
        moved_parts.append(rate)
        moves.append(KeyMove(key, rate, before, after))
    moves.sort(key=lambda m: (-m.rate, m.key))
    removed = tuple(sorted(k for k in old.table if k not in new.table))
    admitted_rate = math.fsum(new.rates.values())
    moved_rate = math.fsum(moved_parts)
    prefix_moves: list[KeyMove] = []
    prefixes_kept = 0
    for name, entry in new.prefixes.items():
        after = tuple(sorted(new.replica_ids[i] for i in entry.replicas))
        old_entry = old.prefixes.get(name)
        before = tuple(sorted(old.replica_ids[i] for i in old_entry.replicas)) if old_entry is not None else ()
        if before == after:
            prefixes_kept += 1
        else:
            prefix_moves.append(KeyMove(name, entry.rate, before, after))
    prefix_moves.sort(key=lambda m: (-m.rate, m.key))
    return PlanDiff(
        prefix_moves=tuple(prefix_moves),
        prefixes_kept=prefixes_kept,
        prefixes_removed=tuple(sorted(n for n in old.prefixes if n not in new.prefixes)),
        churn=moved_rate / admitted_rate if admitted_rate > 0 else 0.0,
        moved_rate=moved_rate,
        admitted_rate=admitted_rate,
        keys_kept=kept,
        keys_moved=moved,
        keys_added=added,
        keys_removed=len(removed),
        moves=tuple(moves),
        removed=removed,
    )
