r"""The switching rule: keep the active plan until staleness costs more than re-warming.

SPEC section 2 (paper: installing a plan costs a transient hit-rate drop while new owners
warm up; keeping a stale plan costs slowly accumulating loss). Both sides are measured in
seconds per second of engine work or waiting: prefill seconds (the work a cache hit saves)
and, for load, seconds requests spend queued. Definitions (docs/architecture.md,
"Staleness vs re-warm"), with current rates lambda_b, prefix tokens P_b and per-token prefill
cost c:

  loads under current rates  L_r(plan) = cold / R + sum over keys b in T with r in T(b) of
                             lambda_b / |T(b)|, where cold = rates of keys outside T
  cache gap (per second)     sum_{b in T_C \ T_A} lambda_b P_b c  -  sum_{b in T_A \ T_C} lambda_b P_b c
                             (hot keys the active plan leaves cold, minus those the candidate would)
  queue gap (per second)     Q(L(A)) - Q(L(C)), Q(L) = sum_r min(rho_r^2 / (1 - rho_r), queue_cap),
                             rho_r = L_r / q_cap: the mean number of requests waiting at an M/M/1
                             server of rate q_cap (Little: seconds of waiting per second), which
                             grows smoothly with load long before L_r reaches q_cap
  overload gap (per second)  (O(L(A)) - O(L(C))) * P_mean * c, O(L) = sum_r max(0, L_r - q_cap):
                             requests past the latency knee are treated as spilled cold
  staleness penalty S        max(0, cache gap + queue_weight * queue gap + overload gap)   [s / s]
  re-warm penalty W          sum over keys b of the candidate with new owners N_b = T_C(b) \ T_A(b)
                             (by replica id) of P_b c (|N_b| + lambda_b |N_b| / |T_C(b)| * rewarm_seconds):
                             one cold prefill per new owner, plus the moved share of the key's
                             traffic running cold while the new owners warm up      [prefill s]
  rule                       switch  iff  S * horizon > W * (1 + hysteresis)
                             and at least min_dwell_seconds passed since the last switch,
                             unless the candidate only grows the active plan (below).
Overrides: no active plan -> switch; the replica set changed -> switch (the active plan
routes to replicas that are gone or misses new ones), dwell notwithstanding.

Growth within the dwell. The dwell bounds how often warm traffic is moved; a candidate that
moves none (`grows_only`: every key of the active plan stays in the candidate with all its
replicas, or a subset of them when its k_b shrank; keys are otherwise only added or given extra
owners) is judged by the cost rule alone, dwell or not. Dropping a key is a move (its traffic
goes from its owners to its cold-tail replica), so a swap of the hot set waits for the dwell. This is what lets a young plan catch up:
a plan built from the first seconds of telemetry holds only the keys seen so far, and holding
it for a whole dwell sends every key that appears later to the cold tail (issue 12: 102 of 400
tenants planned for the whole measured window). The planner's loop builds its candidate with
no rebalancing moves while the dwell runs (services.planner.candidate), so the candidates it
proposes then are growth by construction.

Knobs (SwitchConfig): horizon_seconds 300 (how long a kept plan would keep paying S),
hysteresis 1.0, min_dwell_seconds 120, prefill_seconds_per_token 78e-6 (the per-token term
`a` of the 70B fp8 TP2 profile, SPEC section 4), rewarm_seconds 60 (about one control
interval), default_prefix_tokens 2048 (for keys missing from a prefix-token mapping),
queue_weight 1.0 (a second of waiting counts as a second of prefill work: both are TTFT),
queue_cap 10 (per replica; reached at rho ~ 0.92, so a replica at or past its knee weighs
as ten requests waiting a full second each per second, and one badly placed plan cannot
make the penalty infinite). Why M/M/1 with service rate q_cap: q_cap is the measured
latency knee, below the replica's true throughput, so the curve is already steep where
the engine's p99 starts to climb; Poisson arrivals dominate the variability of a batched
engine's queue. Sources: Kleinrock, Queueing Systems vol. 1 (M/M/1 L_q = rho^2/(1-rho)).

Speed: the rule reads both tables in columns (`_View`, aligned once by `_Align`; a candidate
built by `replan_incremental` from the window the rule is given records its rows' and its
parent's keys' window positions, `Plan.layout`, so the loop's rule aligns by them with no
dict over the window's keys, a million keys: ~1 CPU s less): loads by
np.add.at in table order and the placed rate by a left-to-right cumsum (the per-key loop's
floats), the fsum terms by exact_sum (= math.fsum), per-key new-owner counts and grows_only
over index arrays, Python only for rows of several replicas. The figures equal the per-key
version's (tests/reference/switching_v1.py; tests/unit/test_replan_equivalence.py).

Why hysteresis 1.0: S is measured on the same noisy rates the candidate was built from, so
pure measurement noise already shows a gain (winner's curse). On 2,000 keys / R = 8 with
incremental candidates, S * horizon / W measured 0.7-1.2 for alternating log-rate noise of
sigma 0.1-0.15, 1.5-2.0 for sigma 0.3, 3.7-4.3 when 5-100 cold keys turn hot, and 1.4 -> 3.0
over six steps of a sigma-0.3 random walk; requiring 2x separates noise from shifts and lets
accumulated drift through after a few intervals (ad-hoc run on the fixtures of
tests/unit/test_switching.py; see docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import Mapping, Sequence

import numpy as np

from services.core.plan import Plan, SwitchDecision
from services.core.planning import RowColumns, exact_sum, plan_diff


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


class _View:
    """A plan's table in columns, built once per plan and decision: row lengths, the replica of
    one-replica rows (-1 for the others) and those rows (`RowColumns`: from the builder's
    record when the plan has one); the keys in table order only when asked (by dict paths)."""

    __slots__ = ("plan", "cols", "lens", "one", "_keys")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.cols = RowColumns.of(plan)
        self.lens, self.one = self.cols.lens, self.cols.one
        self._keys: list[str] | None = None

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = list(self.plan.table)
        return self._keys

    def row(self, p: int) -> tuple[int, ...]:
        return self.cols.row(p)

    def rates(self, rates: Mapping[str, float]) -> np.ndarray:
        return np.fromiter(map(rates.get, self.keys, repeat(0.0)), dtype=np.float64, count=len(self.lens))

    def tokens(self, prefix_tokens: Mapping[str, float] | float, config: "SwitchConfig") -> np.ndarray:
        if isinstance(prefix_tokens, Mapping):
            return np.fromiter(map(prefix_tokens.get, self.keys, repeat(config.default_prefix_tokens)),
                               dtype=np.float64, count=len(self.lens))
        return np.full(len(self.lens), float(prefix_tokens), dtype=np.float64)


@dataclass(slots=True)
class _Align:
    """Where each key of one table sits in the other (-1: absent), from one dict lookup pass."""

    c_in_a: np.ndarray      # per candidate key: its position in the active table, or -1
    a_in_c: np.ndarray      # per active key: its position in the candidate table, or -1

    @classmethod
    def of(cls, a: _View, c: _View) -> "_Align":
        index = dict(zip(a.keys, range(len(a.keys))))
        c_in_a = np.fromiter(map(index.get, c.keys, repeat(-1)), dtype=np.int64, count=len(c.keys))
        a_in_c = np.full(len(a.keys), -1, dtype=np.int64)
        hit = np.flatnonzero(c_in_a >= 0)
        a_in_c[c_in_a[hit]] = hit
        return cls(c_in_a, a_in_c)

    @classmethod
    def by_window(cls, a_pos: np.ndarray, c_pos: np.ndarray, n_window: int) -> "_Align":
        """From both tables' window positions, every candidate key inside the window (a key in
        both tables has one window position)."""
        at = np.full(n_window + 1, -1, dtype=np.int64)     # active keys outside the window land in at[-1]
        at[a_pos] = np.arange(len(a_pos), dtype=np.int64)
        c_in_a = at[c_pos]
        a_in_c = np.full(len(a_pos), -1, dtype=np.int64)
        hit = np.flatnonzero(c_in_a >= 0)
        a_in_c[c_in_a[hit]] = hit
        return cls(c_in_a, a_in_c)


def _fsum(values: np.ndarray) -> float:
    """math.fsum of an array (exact_sum, vectorised; fsum itself for non-finite values)."""
    return exact_sum(values) if np.isfinite(values).all() else math.fsum(values.tolist())


def _remap(src: Plan, dst: Plan) -> np.ndarray:
    """src's replica indices -> dst's (by id), -1 for a replica dst lacks; one extra -1 entry."""
    if src.replica_ids == dst.replica_ids:
        return np.append(np.arange(src.replicas, dtype=np.int64), -1)
    index = {rid: i for i, rid in enumerate(dst.replica_ids)}
    return np.array([index.get(rid, -1) for rid in src.replica_ids] + [-1], dtype=np.int64)


def _loads(view: _View, lam: np.ndarray, total: float) -> list[float]:
    """loads_under from columns: each replica's shares added in table order (np.add.at adds in
    index order) and `placed` summed left to right (cumsum), as the plain loop does."""
    plan = view.plan
    share = lam / view.lens if len(lam) else lam
    single = view.one >= 0
    if single.all():
        rep, val = view.one, share
    else:
        pos = np.repeat(np.arange(len(view.lens)), view.lens)
        rep = view.cols.flat()
        val = share[pos]
    acc = np.zeros(plan.replicas, dtype=np.float64)
    np.add.at(acc, rep, val)
    placed = float(np.cumsum(lam)[-1]) if len(lam) else 0.0
    cold = max(0.0, total - placed) / plan.replicas
    return (acc + cold).tolist()


def loads_under(plan: Plan, rates: Mapping[str, float], total: float | None = None) -> list[float]:
    """Per-replica load of `plan` if traffic arrives at `rates` (cold tail spread evenly)."""
    view = _View(plan)
    if total is None:
        total = _fsum(np.fromiter(rates.values(), dtype=np.float64, count=len(rates)))
    return _loads(view, view.rates(rates), total)


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


@dataclass(frozen=True, slots=True)
class WindowColumns:
    """The window's rates and prefix tokens in columns, aligned with `keys` (distinct): what
    `decide_switch_window` reads for the keys of both tables through one key -> position dict
    (a dict of rates and one of tokens cost one build and one lookup pass each). A key outside
    the window has rate 0 and the default prefix tokens, as with mappings."""

    keys: Sequence[str]
    rates: np.ndarray          # float64
    tokens: np.ndarray         # float64

    def positions(self, keys: Sequence[str], index: dict[str, int]) -> np.ndarray:
        return np.fromiter(map(index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))


@dataclass(slots=True)
class _Pair:
    """The two plans of one decision in columns, with the current rates and prefix tokens."""

    active: _View
    candidate: _View
    align: _Align
    lam_a: np.ndarray
    lam_c: np.ndarray
    tok_a: np.ndarray
    tok_c: np.ndarray
    total: float

    @classmethod
    def of(cls, active: Plan, candidate: Plan, rates: Mapping[str, float],
           prefix_tokens: Mapping[str, float] | float, config: "SwitchConfig") -> "_Pair":
        a, c = _View(active), _View(candidate)
        total = _fsum(np.fromiter(rates.values(), dtype=np.float64, count=len(rates)))
        align = _Align.of(a, c)
        lam_c, tok_c = c.rates(rates), c.tokens(prefix_tokens, config)
        # the active plan's keys mostly are the candidate's: take their values from its columns,
        # look up only the rest (one dict pass fewer per mapping)
        where = align.a_in_c
        if not len(c.keys):
            return cls(a, c, align, a.rates(rates), lam_c, a.tokens(prefix_tokens, config), tok_c, total)
        rest = np.flatnonzero(where < 0).tolist()
        lam_a, tok_a = lam_c[where], tok_c[where]          # where == -1 rows are overwritten below
        if rest:
            keys = [a.keys[i] for i in rest]
            lam_a[rest] = [rates.get(k, 0.0) for k in keys]
            if isinstance(prefix_tokens, Mapping):
                tok_a[rest] = [prefix_tokens.get(k, config.default_prefix_tokens) for k in keys]
            else:
                tok_a[rest] = float(prefix_tokens)
        return cls(a, c, align, lam_a, lam_c, tok_a, tok_c, total)

    @classmethod
    def of_window(cls, active: Plan, candidate: Plan, window: WindowColumns, config: "SwitchConfig") -> "_Pair":
        """The same pair from window columns: both tables' keys looked up once in one index, the
        alignment through window positions (a candidate key outside the window: by dict)."""
        a, c = _View(active), _View(candidate)
        rates = np.asarray(window.rates, dtype=np.float64)
        tokens = np.asarray(window.tokens, dtype=np.float64)
        if rates.shape != (len(window.keys),) or tokens.shape != rates.shape:
            raise ValueError(f"window of {len(window.keys)} keys has {rates.size} rates, {tokens.size} prefix tokens")
        lay = candidate.layout_of()
        if (lay is not None and lay.window is window.keys and lay.parent is active.table
                and lay.parent_positions is not None):
            # recorded by the build from this window: the same positions a lookup would give
            c_pos, a_pos = lay.positions, lay.parent_positions
            align = _Align.by_window(a_pos, c_pos, len(window.keys))
        else:
            index = dict(zip(window.keys, range(len(window.keys))))
            c_pos, a_pos = window.positions(c.keys, index), window.positions(a.keys, index)
            if (c_pos < 0).any():
                align = _Align.of(a, c)
            else:
                align = _Align.by_window(a_pos, c_pos, len(window.keys))

        def column(values: np.ndarray, pos: np.ndarray, missing: float) -> np.ndarray:
            return np.where(pos >= 0, values[pos], missing) if len(values) else np.full(len(pos), missing)

        total = _fsum(rates)
        return cls(a, c, align, column(rates, a_pos, 0.0), column(rates, c_pos, 0.0),
                   column(tokens, a_pos, config.default_prefix_tokens),
                   column(tokens, c_pos, config.default_prefix_tokens), total)


def _staleness(pair: _Pair, prefix_tokens: Mapping[str, float] | float, config: SwitchConfig) -> Staleness:
    a, cv = pair.active, pair.candidate
    c = config.prefill_seconds_per_token
    c_in_a = pair.align.c_in_a >= 0
    a_in_c = pair.align.a_in_c >= 0
    gained = _fsum(pair.lam_c[~c_in_a] * pair.tok_c[~c_in_a])
    lost = _fsum(pair.lam_a[~a_in_c] * pair.tok_a[~a_in_c])
    cache = (gained - lost) * c

    loads_a, loads_c = _loads(a, pair.lam_a, pair.total), _loads(cv, pair.lam_c, pair.total)
    q_cap = cv.plan.q_cap
    spill = overload(loads_a, q_cap) - overload(loads_c, q_cap)
    queue = queueing(loads_a, q_cap, config.queue_cap) - queueing(loads_c, q_cap, config.queue_cap)
    only_a = ~a_in_c
    hot_rate = _fsum(np.concatenate((pair.lam_c, pair.lam_a[only_a])))
    mean_tokens = (_fsum(np.concatenate((pair.lam_c * pair.tok_c, pair.lam_a[only_a] * pair.tok_a[only_a])))
                   / hot_rate if hot_rate > 0
                   else (config.default_prefix_tokens if isinstance(prefix_tokens, Mapping) else float(prefix_tokens)))
    over = spill * mean_tokens * c
    return Staleness(cache=cache, overload=over, total=max(0.0, cache + config.queue_weight * queue + over),
                     queue=queue)


def staleness_penalty(active: Plan, candidate: Plan, rates: Mapping[str, float],
                      prefix_tokens: Mapping[str, float] | float, config: SwitchConfig) -> Staleness:
    return _staleness(_Pair.of(active, candidate, rates, prefix_tokens, config), prefix_tokens, config)


def _new_owners(pair: _Pair) -> np.ndarray:
    """Per candidate key: how many of its replicas (by id) did not serve it in the active plan."""
    a, cv = pair.active, pair.candidate
    remap = _remap(a.plan, cv.plan)
    where = pair.align.c_in_a
    found = where >= 0
    if len(a.keys):
        b_len = np.where(found, a.lens[where], 0)
        b_one = np.where(found, a.one[where], -1)
    else:                                           # no active rows to look at
        b_len, b_one = np.zeros(len(where), dtype=np.int64), np.full(len(where), -1, dtype=np.int64)
    mapped = remap[b_one]                           # b_one == -1 -> remap[-1] == -1
    out = np.where((b_len == 1) & (mapped == cv.one), 0, 1).astype(np.int64)
    for p in np.flatnonzero((cv.one < 0) | (b_len > 1)).tolist():
        old = {int(remap[i]) for i in a.row(int(where[p]))} if found[p] else set()
        out[p] = len(set(cv.row(p)) - old)
    return out


def _rewarm(pair: _Pair, config: SwitchConfig) -> float:
    new_owners = _new_owners(pair)
    hit = new_owners > 0
    no = new_owners[hit].astype(np.float64)
    moved_rate = pair.lam_c[hit] * no / pair.candidate.lens[hit]
    parts = pair.tok_c[hit] * (no + moved_rate * config.rewarm_seconds)
    return _fsum(parts) * config.prefill_seconds_per_token


def rewarm_penalty(active: Plan, candidate: Plan, rates: Mapping[str, float],
                   prefix_tokens: Mapping[str, float] | float, config: SwitchConfig) -> float:
    """Prefill seconds spent once warming the candidate's new key owners."""
    return _rewarm(_Pair.of(active, candidate, rates, prefix_tokens, config), config)


def _grows_only(a: _View, cv: _View, align: _Align) -> bool:
    where = align.a_in_c
    if (where < 0).any():               # a key of the active plan dropped
        return False
    c_one = cv.one[where]
    remap = _remap(a.plan, cv.plan)
    single = (a.one >= 0) & (c_one >= 0)
    if not (remap[a.one[single]] == c_one[single]).all():   # one replica each: subset means equal
        return False
    for p in np.flatnonzero(~single).tolist():
        old, new = {int(remap[i]) for i in a.row(p)}, set(cv.row(int(where[p])))
        if -1 in old:                # a replica the candidate lacks: only new <= old can hold
            if not new <= old - {-1}:
                return False
        elif not (old <= new or new <= old):
            return False
    return True


def grows_only(active: Plan, candidate: Plan) -> bool:
    """True when `candidate` moves no traffic of `active` to a replica that did not serve it:
    every key of `active` keeps all its replicas or a subset of them (by replica id)."""
    a, c = _View(active), _View(candidate)
    return _grows_only(a, c, _Align.of(a, c))


def decide_switch(active: Plan | None, candidate: Plan, rates: Mapping[str, float],
                  prefix_tokens: Mapping[str, float] | float, *, now: float, last_switch_at: float,
                  config: SwitchConfig = SwitchConfig()) -> SwitchDecision:
    """Keep or switch (module header); the figures and a one-line reason go into the decision."""
    if active is None:
        return SwitchDecision(True, "no active plan", churn=1.0)
    return _decide(active, candidate, _Pair.of(active, candidate, rates, prefix_tokens, config), prefix_tokens,
                   now=now, last_switch_at=last_switch_at, config=config)


def decide_switch_window(active: Plan | None, candidate: Plan, window: WindowColumns, *, now: float,
                         last_switch_at: float, config: SwitchConfig = SwitchConfig()) -> SwitchDecision:
    """`decide_switch` with the window's rates and prefix tokens in columns (`WindowColumns`):
    the same decision as with dict(zip(keys, rates)) and dict(zip(keys, tokens)), for fewer
    passes over the keys."""
    if active is None:
        return SwitchDecision(True, "no active plan", churn=1.0)
    return _decide(active, candidate, _Pair.of_window(active, candidate, window, config), {},
                   now=now, last_switch_at=last_switch_at, config=config)


def _decide(active: Plan, candidate: Plan, pair: _Pair, prefix_tokens: Mapping[str, float] | float, *,
            now: float, last_switch_at: float, config: SwitchConfig) -> SwitchDecision:
    # a candidate built from `active` already carries plan_diff(active, candidate).churn
    churn = (candidate.churn if candidate.churn is not None and candidate.parent_version == active.version
             else plan_diff(active, candidate).churn)
    stale = _staleness(pair, prefix_tokens, config)
    rewarm = _rewarm(pair, config)

    def decision(switch: bool, reason: str) -> SwitchDecision:
        return SwitchDecision(switch, reason, staleness_penalty=stale.total, rewarm_penalty=rewarm, churn=churn)

    if set(active.replica_ids) != set(candidate.replica_ids):
        gone = sorted(set(active.replica_ids) - set(candidate.replica_ids))
        new = sorted(set(candidate.replica_ids) - set(active.replica_ids))
        return decision(True, f"replica set changed (gone {gone}, new {new})")
    dwell = now - last_switch_at
    growth = ""
    if dwell < config.min_dwell_seconds:
        if not _grows_only(pair.active, pair.candidate, pair.align):
            return decision(False, f"dwell {dwell:.0f} s < {config.min_dwell_seconds:.0f} s since the last switch")
        growth = f" (growth only, within the {config.min_dwell_seconds:.0f} s dwell)"
    cost_of_keeping = stale.total * config.horizon_seconds
    bar = rewarm * (1.0 + config.hysteresis)
    figures = (f"staleness {stale.total:.4g} s/s x {config.horizon_seconds:.0f} s = {cost_of_keeping:.4g} s "
               f"{{}} re-warm {rewarm:.4g} s x {1.0 + config.hysteresis:.2f}")
    if cost_of_keeping > bar:
        return decision(True, "switch" + growth + ": " + figures.format(">"))
    return decision(False, "keep" + growth + ": " + figures.format("<="))
