"""Discrete-event simulator: R engine replicas (services.core.engine) behind one router that
runs any routing policy, on a virtual clock.

Events
  Arrivals come from the request list (sorted by arrival), steps from a heapq of per-replica
  "step ends", control events (re-plan, replica failure/return) from a short sorted list.
  At equal times a step end goes first (so its finishes are visible to the next routing
  decision), then control, then arrivals. A replica runs steps back to back while it has
  work; a step's results (first tokens, finishes) take effect at its end.

Decode fast-forward
  When a replica has nothing waiting and every running request is decoding, its next steps
  are determined until a request finishes or free blocks run out (EngineModel.decode_horizon),
  so the run of k steps is one event. An arrival routed to the replica in the middle of such
  a run splits it at the first step boundary at or after the arrival (engine.steps_until),
  where the newcomer joins, exactly as plain stepping would. Load signals of a replica in a
  run (kv_usage, active_blocks, the prefix oracle) are those of the run's start: they lag by
  at most one run, like scraped engine metrics do.

Router view (ClusterState)
  in_flight      routed and not finished (or lost)
  prefill_tokens the engine's prefill backlog (waiting prompts in full, running prefills' rest)
  active_blocks, kv_usage   blocks referenced by running requests
  healthy        False while a replica is down
  prefix_match   exact oracle over the engines' caches (what Dynamo's KV events give a router)

Planned policies (PLANNED) are re-planned every `control_interval` virtual seconds from
arrival counts per key over the last `rate_window` seconds measured inside the run (no
oracle rates; a window longer than the interval slides over the last intervals' counts, as
the planner service reads the collector's buckets), through `plan_fn` (default: the planner's churn-aware re-plan, `default_plan_fn`;
`scratch_plan_fn` is the paper's fresh LPT plan every interval).
Rate history (`rate_horizon`): instead of the last window alone, per-key rates are an
exponentially weighted average over that horizon (services.core.rates.RateHistory, folded
once per re-plan with the window's counts). `rate_prior` seeds it with rates known before
the run (aggregated history, as the paper's planner has), weighted as `rate_prior_seconds`
of observation; it needs a horizon (a prior without one is ignored). Until
the first plan they run their cold path; `first_plan_at` (if earlier than the first interval)
bootstraps a plan from the arrivals so far, the way a planner seeds a new cluster from its
first telemetry, so a cold-path backlog built before the first plan does not leak into the
measured window. q_cap comes from services.sim.knee (run on p99_alone below), W from services.core.warm
unless given.

Holds: a policy that answers Reason.HOLD (services.core.policies.cacheroute: the chosen
replica's KV is full and no acceptable other has room) leaves the request in a dispatcher-side
FIFO, one per replica it was held for (one global FIFO would let a head waiting for one full
replica block requests for every other). After each step end of replica r (it freed KV or
prefill budget) the head of r's queue is routed again with a fresh pick (the plan may have
changed, or another replica have room), and the next, until one is held again; a head held
`hold_limit` seconds (the SLO's worth) goes to its pick anyway, so nothing waits forever. Time held counts
in TTFT (measured from the request's arrival). SimResult.extra["holds"] counts requests held
at least once, forced sends and the mean and max hold.

Failures: `Failure(replica, at, back)` takes a replica down at `at` (its queued and running
requests are lost and counted as failed, its cache is gone) and, if `back` is set, returns
it empty at `back`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from services.core.engine import EngineModel, EngineProfile, StepResult, steps_until
from services.core.metrics import RunMetrics, miss_accounting, summarize
from services.core.plan import Plan
from services.core.policy import ClusterState, NoHealthyReplica, Policy, Reason
from services.core.request import Request
from services.core.traces import ideal_hits
from services.core.warm import warm_slots
from services.sim import knee

PLANNED = frozenset({"cacheroute", "cacheroute-prefix", "affinity", "affinity-replication"})

# plan_fn(now, keys, rates, healthy, active_plan, q_cap, warm_slots, version) -> Plan | None
PlanFn = Callable[..., Plan | None]


@dataclass(frozen=True, slots=True)
class Failure:
    replica: int
    at: float
    back: float | None = None


@dataclass(frozen=True, slots=True)
class SimConfig:
    profile: EngineProfile
    replicas: int
    kv_blocks: int | None = None          # override the profile's pool size
    warmup: float | None = None           # None: min(2 control intervals, 25% of the run)
    end: float | None = None              # end of the measured window; None: last arrival
    drain_limit: float = 600.0            # keep simulating this long after `end` to finish requests
    control_interval: float = 30.0        # re-plan period (planned policies)
    first_plan_at: float | None = None    # bootstrap plan from the arrivals so far; None: no bootstrap
    rate_window: float | None = None      # rate window; None: the control interval
    rate_horizon: float | None = None     # EWMA horizon of per-key rates; None: the last window only
    rate_prior: tuple[tuple[str, float, int], ...] = ()   # (key, req/s, prefix tokens) known before t = 0
    rate_prior_seconds: float = 0.0       # how much history rate_prior summarises (its EWMA weight)
    q_cap: float | None = None            # req/s per replica at the knee; None: calibrate
    warm_slots: int | None = None         # W; None: derived each interval (services/core/warm.py)
    w_safety: float = 0.5                 # share of the KV cache W may fill with prefixes
    prefix_oracle: bool = True            # expose ClusterState.prefix_match
    fast_forward: bool = True             # collapse decode-only stretches (off: one event per step)
    failures: tuple[Failure, ...] = ()
    plan_fn: PlanFn | None = None
    miss_accounting: bool = True          # split the gap to the infinite-cache bound (SimResult.extra["misses"])
    hold_limit: float = 3.5               # seconds a HOLD may keep a request (the SLO's worth: the p99 SLO of every run)

    def warmup_for(self, end: float) -> float:
        if self.warmup is not None:
            return self.warmup
        return min(2 * self.control_interval, 0.25 * end)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    version: int
    at: float
    admitted_keys: int
    total_keys: int
    admitted_rate_share: float
    predicted_imbalance: float
    churn: float | None
    q_cap: float
    warm_slots: int


@dataclass
class SimResult:
    policy: str
    metrics: RunMetrics
    replicas: int
    profile: str
    warmup: float
    end: float
    q_cap: float | None
    plans: list[PlanRecord]
    preemptions: int
    wall_seconds: float                      # the simulation itself (q_cap calibration excluded)
    events: int
    # per request, in input order
    arrival: np.ndarray
    replica: np.ndarray
    ttft: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    failed: np.ndarray
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The JSON summary (no per-request arrays)."""
        m = self.metrics
        out = {
            "policy": self.policy,
            "hit_rate": m.hit_rate,
            "ttft_p50": m.ttft_p50,
            "ttft_p99": m.ttft_p99,
            "ttft_mean": m.ttft_mean,
            "imbalance": m.imbalance,
            "requests": m.requests,
            "served": m.served,
            "failed": m.failed,
            "unfinished": m.unfinished,
            "qps": m.qps,
            "served_per_replica": list(m.served_per_replica),
            "replicas": self.replicas,
            "profile": self.profile,
            "warmup": self.warmup,
            "end": self.end,
            "q_cap": self.q_cap,
            "plan_versions": len(self.plans),
            "plans": [_record(p) for p in self.plans],
            "preemptions": self.preemptions,
            "wall_seconds": self.wall_seconds,
            "sim_requests_per_second": len(self.arrival) / self.wall_seconds if self.wall_seconds > 0 else None,
            "events": self.events,
        }
        out.update(self.extra)
        return out


def _record(p: PlanRecord) -> dict:
    return {name: getattr(p, name) for name in p.__slots__}


_FF = 1        # pending: an uncommitted decode run (start, k, first, growth)
_STEP = 2      # pending: a step whose results apply at its end
_BOUNDARY = 3  # pending: nothing to apply; the next step starts here


class Simulator:
    """One run: `Simulator(config, policy, requests).run()`."""

    def __init__(self, config: SimConfig, policy: Policy, requests: Sequence[Request]) -> None:
        if config.replicas < 1:
            raise ValueError("need at least one replica")
        self.config = config
        self.policy = policy
        self.requests = requests
        self.planned = getattr(policy, "name", "") in PLANNED
        R = config.replicas
        self.engines = [EngineModel(config.profile, config.kv_blocks) for _ in range(R)]
        self.state = ClusterState.empty(R)
        self.state.kv_blocks[:] = [e.kv_blocks for e in self.engines]
        if config.prefix_oracle:
            engines = self.engines
            self.state.prefix_match = lambda r, blocks: engines[r].match(blocks)
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._gen = [0] * R
        self._busy = [False] * R
        self._pending: list[tuple] = [()] * R
        n = len(requests)
        self._index = {q.rid: i for i, q in enumerate(requests)}
        if len(self._index) != n:
            raise ValueError("request ids must be unique")
        self._replica = [-1] * n
        self._served_at: dict[str, int] = {}   # key -> replica of its latest request (telemetry's homes)
        self._ttft = [math.nan] * n
        self._cached = [0] * n
        self._failed = [False] * n
        self._spilled = [False] * n              # a FALLBACK pick: sent off the key's home
        self._counts: Counter[str] = Counter()
        self._counted_since = 0.0
        self._slices: deque[tuple[float, Counter[str]]] = deque()   # (start, counts) per interval, sliding window
        self._prefix: dict[str, int] = {k: p for k, _, p in config.rate_prior}
        self._history = None
        if config.rate_horizon is not None:
            from services.core.rates import RateHistory

            self._history = RateHistory.seeded(config.rate_horizon, {k: r for k, r, _ in config.rate_prior},
                                               config.rate_prior_seconds)
        self._nodes = None
        if self.planned and getattr(policy, "prefix", False):
            from services.core.prefixes import PrefixCounter, key_hash
            self._nodes = PrefixCounter()
            self._key_hash: dict[str, int] = {}
            self._hash_fn = key_hash
        self._plan: Plan | None = None
        self._plans: list[PlanRecord] = []
        self.q_cap = config.q_cap
        self.events = 0
        self._lost_preemptions = 0
        self._held = [deque() for _ in range(R)]  # per replica: request indices held for it (Reason.HOLD)
        self._hold_count = 0                     # requests held at least once
        self._hold_forced = 0                    # sent to their pick after hold_limit
        self._hold_seconds: list[float] = []     # per released held request

    # -- replica events ---------------------------------------------------------------------

    def _push(self, r: int, t: float) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, r, self._gen[r]))

    def _start(self, r: int, t: float) -> None:
        """Begin replica r's next step (or decode run) at t."""
        eng = self.engines[r]
        if eng.decode_only and self.config.fast_forward:
            k = eng.decode_horizon()
            if k > 0:
                first, growth = eng.decode_step_params()
                self._pending[r] = (_FF, t, k, first, growth)
                self._push(r, t + k * first + growth * k * (k - 1) / 2)
                return
        res = eng.step(t)
        if res is None:
            self._busy[r] = False
            self._pending[r] = ()
            return
        self._pending[r] = (_STEP, res)
        self._push(r, t + res.duration)

    def _on_step_end(self, r: int, t: float) -> None:
        pending = self._pending[r]
        kind = pending[0]
        if kind == _STEP:
            self._apply(r, t, pending[1])
        elif kind == _FF:
            self._apply(r, t, self.engines[r].advance_decode(pending[2]))
        self._start(r, t)
        self._signal(r)
        if self._held[r]:
            self._release_held(r, t)

    def _apply(self, r: int, t: float, res: StepResult) -> None:
        index = self._index
        if res.first_tokens:
            arrival = self._arrival_at
            ttft = self._ttft
            cached = self._cached
            for rid, c in res.first_tokens:
                i = index[rid]
                ttft[i] = t - arrival[i]
                cached[i] = c
        if res.finished:
            self.state.in_flight[r] -= len(res.finished)

    def _signal(self, r: int) -> None:
        eng = self.engines[r]
        st = self.state
        st.prefill_tokens[r] = eng.prefill_backlog
        used = eng.active_blocks
        st.active_blocks[r] = used
        st.kv_usage[r] = used / eng.kv_blocks
        st.waiting[r] = eng.waiting

    # -- arrivals ---------------------------------------------------------------------------

    def _on_arrival(self, i: int, q: Request, t: float) -> None:
        self._counts[q.key] += 1
        if q.key not in self._prefix:
            self._prefix[q.key] = q.prefix_tokens
        if self._nodes is not None:
            self._observe_nodes(q)
        self._route(i, q, t, held=False)

    def _route(self, i: int, q: Request, t: float, *, held: bool) -> bool:
        """Pick a replica for request i at t and hand it over; False if the policy holds it (a
        newcomer joins the hold queue; a held request past `hold_limit` is sent to its pick)."""
        try:
            r, reason = self.policy.pick(q, self.state)
        except NoHealthyReplica:
            self._failed[i] = True
            return True
        if reason == Reason.HOLD:
            if not held:
                self._held[r].append(i)
                self._hold_count += 1
                return False
            if t - q.arrival < self.config.hold_limit:
                return False
            self._hold_forced += 1
        if held:
            self._hold_seconds.append(t - q.arrival)
        self._send(i, q, t, r, reason)
        return True

    def _release_held(self, r: int, t: float) -> None:
        """Route the head of replica r's hold queue again, and the next, until one is held again
        (it stays in r's queue, whichever replica it was held for this time)."""
        held, reqs = self._held[r], self.requests
        while held:
            i = held[0]
            if not self._route(i, reqs[i], t, held=True):
                return
            held.popleft()

    def _send(self, i: int, q: Request, t: float, r: int, reason: Reason) -> None:
        eng = self.engines[r]
        try:
            eng.add(q, t)
        except ValueError:
            self._failed[i] = True   # larger than the replica's whole KV pool
            return
        self._replica[i] = r
        self._served_at[q.key] = r
        self._spilled[i] = reason == Reason.FALLBACK
        self.state.in_flight[r] += 1
        if not self._busy[r]:
            self._busy[r] = True
            self._start(r, t)
        else:
            pending = self._pending[r]
            if pending[0] == _FF:
                _, s, k, first, growth = pending
                j = steps_until(first, growth, t - s, k)
                if j < k:
                    # split the run: j steps done, the newcomer joins the next step
                    eng.advance_decode(j)
                    self._gen[r] += 1
                    self._pending[r] = (_BOUNDARY,)
                    self._push(r, s + j * first + growth * j * (j - 1) / 2)
        self._signal(r)

    def _observe_nodes(self, q: Request) -> None:
        from services.core.prefixes import chain_ids
        kh = self._key_hash.get(q.key)
        if kh is None:
            kh = self._key_hash[q.key] = self._hash_fn(q.key)
        self._nodes.observe(kh, chain_ids(q.blocks), q.prompt_tokens)

    # -- control ----------------------------------------------------------------------------

    def _control_events(self, end: float) -> list[tuple[float, int, object]]:
        events: list[tuple[float, int, object]] = []
        cfg = self.config
        for f in cfg.failures:
            if not 0 <= f.replica < cfg.replicas:
                raise ValueError(f"failure names replica {f.replica}, have {cfg.replicas}")
            events.append((f.at, 0, ("down", f.replica)))
            if f.back is not None:
                events.append((f.back, 0, ("up", f.replica)))
        if self.planned:
            first = cfg.first_plan_at
            if first is not None and 0 < first < cfg.control_interval and first <= end:
                events.append((first, 1, ("plan",)))
            k = 1
            while k * cfg.control_interval <= end:
                events.append((k * cfg.control_interval, 1, ("plan",)))
                k += 1
        events.sort(key=lambda e: (e[0], e[1]))
        return events

    def _on_control(self, t: float, what: tuple) -> None:
        if what[0] == "down":
            self._fail(what[1], t)
        elif what[0] == "up":
            self.state.healthy[what[1]] = True
        else:
            self._replan(t)

    def _fail(self, r: int, t: float) -> None:
        eng = self.engines[r]
        for rid in eng.rids():
            self._failed[self._index[rid]] = True
        self._lost_preemptions += eng.preemptions
        self.engines[r] = EngineModel(self.config.profile, self.config.kv_blocks)
        self._gen[r] += 1
        self._busy[r] = False
        self._pending[r] = ()
        st = self.state
        st.healthy[r] = False
        st.in_flight[r] = 0
        self._signal(r)

    def _replan(self, t: float) -> None:
        cfg = self.config
        window = cfg.rate_window or cfg.control_interval
        if 0 < t - self._counted_since < window:
            window = t - self._counted_since    # after a bootstrap plan: the counts cover less
        counts, self._counts = self._counts, Counter()
        if self._history is None and cfg.rate_window is not None and cfg.rate_window > t - self._counted_since:
            # a sliding window over the last intervals' counts (the planner's window of buckets)
            self._slices.append((self._counted_since, counts))
            while self._slices and self._slices[0][0] < t - cfg.rate_window - 1e-9:
                self._slices.popleft()
            window, counts = t - self._slices[0][0], sum((c for _, c in self._slices), Counter())
        self._counted_since = t
        if self._history is not None:
            self._history = self._history.fold(counts, window)
            counts, window = dict(self._history.counts), self._history.seconds
        if not counts:
            return
        keys = list(counts)
        rates = [counts[k] / window for k in keys]
        total = sum(counts.values())
        mean_prefix = sum(self._prefix[k] * c for k, c in counts.items()) / total
        w = cfg.warm_slots or warm_slots(cfg.profile, mean_prefix, cfg.w_safety, cfg.kv_blocks)
        version = (self._plan.version + 1) if self._plan is not None else 1
        plan_fn = cfg.plan_fn or (prefix_plan_fn if self._nodes is not None else default_plan_fn)
        more = {}
        if plan_fn is default_plan_fn or getattr(plan_fn, "wants_served", False):
            more = {"served_at": dict(self._served_at)}
        if self._nodes is not None:
            more = {"nodes": self._nodes.samples(), "prompt_tokens": self._nodes.prompt_tokens,
                    "prefix_tokens": [self._prefix[k] for k in keys]}
            self._nodes.clear()
        plan = plan_fn(now=t, keys=keys, rates=rates, healthy=list(self.state.healthy), active=self._plan,
                       q_cap=self.q_cap, warm_slots=w, version=version, replicas=cfg.replicas,
                       window=window, **more)
        if plan is None or plan is self._plan:
            return
        self._plan = plan
        self.policy.set_plan(plan)
        self._plans.append(PlanRecord(plan.version, t, plan.admitted_keys, plan.total_keys,
                                      plan.admitted_rate_share, plan.predicted_imbalance, plan.churn,
                                      plan.q_cap, plan.warm_slots))

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> SimResult:
        cfg = self.config
        reqs = self.requests
        n = len(reqs)
        calibration = time.perf_counter()
        if self.planned and self.q_cap is None:
            self.q_cap = knee.q_cap_for(cfg.profile, reqs, cfg.replicas, run=p99_alone, kv_blocks=cfg.kv_blocks)
        wall0 = time.perf_counter()
        calibration = wall0 - calibration
        self._arrival_at = [q.arrival for q in reqs]
        last_arrival = reqs[-1].arrival if n else 0.0
        end = cfg.end if cfg.end is not None else last_arrival + 1e-9
        warmup = cfg.warmup_for(end)
        control = self._control_events(min(end, last_arrival))
        ci = 0
        heap = self._heap
        gen = self._gen
        stop = end + cfg.drain_limit
        inf = math.inf
        i = 0
        events = 0
        while True:
            t_arr = reqs[i].arrival if i < n else inf
            t_ev = heap[0][0] if heap else inf
            t_ctl = control[ci][0] if ci < len(control) else inf
            t = min(t_arr, t_ev, t_ctl)
            if t == inf or t > stop:
                break
            events += 1
            if t_ev == t:
                _, _, r, g = heapq.heappop(heap)
                if g == gen[r]:
                    self._on_step_end(r, t)
            elif t_ctl == t:
                self._on_control(t, control[ci][2])
                ci += 1
            else:
                self._on_arrival(i, reqs[i], t)
                i += 1
        self.events = events
        arrival = np.fromiter((q.arrival for q in reqs), dtype=np.float64, count=n)
        replica = np.asarray(self._replica, dtype=np.int64)
        ttft = np.asarray(self._ttft, dtype=np.float64)
        cached = np.asarray(self._cached, dtype=np.int64)
        prompt = np.fromiter((q.prompt_tokens for q in reqs), dtype=np.int64, count=n)
        failed = np.asarray(self._failed, dtype=bool)
        metrics = summarize(arrival, replica, ttft, cached, prompt, failed, replicas=cfg.replicas,
                            warmup=warmup, end=end)
        extra = {"calibration_seconds": calibration, "holds": self._hold_summary()}
        if cfg.miss_accounting:
            measured = (arrival >= warmup) & (arrival < end) & ~np.isnan(ttft)
            extra["misses"] = miss_accounting([q.key for q in reqs], self._replica, self._spilled, self._cached,
                                              ideal_hits(reqs), prompt, measured)
        return SimResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            metrics=metrics, replicas=cfg.replicas, profile=cfg.profile.name, warmup=warmup, end=end,
            q_cap=self.q_cap, plans=self._plans,
            preemptions=self._lost_preemptions + sum(e.preemptions for e in self.engines),
            wall_seconds=time.perf_counter() - wall0, events=events,
            arrival=arrival, replica=replica, ttft=ttft, cached=cached, prompt=prompt, failed=failed,
            extra=extra,
        )


    def _hold_summary(self) -> dict:
        waited = self._hold_seconds
        return {"held": self._hold_count, "forced": self._hold_forced, "still_held": sum(map(len, self._held)),
                "mean_seconds": sum(waited) / len(waited) if waited else 0.0,
                "max_seconds": max(waited) if waited else 0.0}


def default_plan_fn(*, now: float, keys: list[str], rates: list[float], healthy: list[bool],
                    active: Plan | None, q_cap: float, warm_slots: int, version: int, replicas: int,
                    window: float, served_at: Mapping[str, int] | None = None) -> Plan:
    """The planner's churn-aware lifecycle (services.planner.candidate with its defaults): the
    first plan admits each key on its cold-tail ring home where balance allows (`build_at_home`),
    every later one re-plans from the active plan (`replan_incremental`), so a key keeps its
    replicas unless moving it pays. A newly admitted key's home is the replica its latest request
    was served on (`served_at`, what the planner reads from telemetry), else its ring home: the
    cold tail balances first-sight keys live, so the ring alone would move many of them at
    admission. Every interval's plan is installed (the planner's switching
    rule and shadow gate are experiments/harness's). Over all replicas (policies skip unhealthy
    ones). `scratch_plan_fn` is the paper's fresh LPT plan every interval."""
    from services.core.replan import build_at_home, replan_incremental, ring_homes, served_homes

    ids = [f"r{j}" for j in range(replicas)]
    homes = served_homes(served_at or {}, ring_homes(replicas))
    if active is None:
        return build_at_home(keys, rates, ids, q_cap, warm_slots, homes, version=version,
                             created_at=now, window_seconds=window)
    return replan_incremental(active, keys, rates, ids, q_cap, warm_slots, version=version, created_at=now,
                              window_seconds=window, homes=homes)


def scratch_plan_fn(*, now: float, keys: list[str], rates: list[float], healthy: list[bool],
                    active: Plan | None, q_cap: float, warm_slots: int, version: int, replicas: int,
                    window: float) -> Plan:
    """A fresh LPT plan every interval over all replicas (the paper's lifecycle)."""
    from services.core.planning import build_plan

    return build_plan(keys, rates, [f"r{j}" for j in range(replicas)], q_cap, warm_slots, version=version,
                      parent=active, created_at=now, window_seconds=window)


def prefix_plan_fn(*, now: float, keys: list[str], rates: list[float], healthy: list[bool],
                   active: Plan | None, q_cap: float, warm_slots: int, version: int, replicas: int,
                   window: float, nodes=(), prompt_tokens: float = 0.0, prefix_tokens=None) -> Plan:
    """The prefix-aware, sticky plan (services.core.prefixes.build_prefix_plan) every interval."""
    from services.core.prefixes import build_prefix_plan

    return build_prefix_plan(keys, rates, [f"r{j}" for j in range(replicas)], q_cap, warm_slots,
                             prefix_tokens=prefix_tokens, nodes=nodes, window_seconds=window, active=active,
                             version=version, created_at=now, healthy=healthy, prompt_tokens=prompt_tokens)


def simulate(config: SimConfig, policy: Policy, requests: Sequence[Request]) -> SimResult:
    return Simulator(config, policy, requests).run()



def p99_alone(profile: EngineProfile, requests: Sequence[Request], options: dict) -> float:
    """p99 TTFT of one replica serving `requests` under knee.Single (the knee search's `run`)."""
    return Simulator(SimConfig(profile, 1, **options), knee.Single(), requests).run().metrics.ttft_p99
