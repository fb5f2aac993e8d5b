"""The planner's control loop: lease, candidate build, keep-or-switch, activation.

Each interval the lease holder reads the telemetry window and runs the plan-candidate use case
(services/planner/candidate.py, shared with BuildPlan): it builds a candidate (churn-aware from
the active plan, or from scratch with the active plan as parent), asks
`services.core.switching.decide_switch` whether the candidate's gain outweighs its re-warm cost
(SPEC section 2), stores the candidate with that decision recorded on it, and activates it when
the decision says switch: a compare-and-set on the version it read, fenced by its lease token,
refused by the store when a version is pinned or the mode is flat. Its automatic mode changes (the gate's fallback and return) carry the same
token. A standby planner keeps trying to take the lease and takes over when it expires; a
deposed leader's activations and mode changes are refused by the fencing check.

With a shadow gate (services/planner/gate.py) every candidate is also replayed against
Flat-LB before it may go live, its report stored on the version, and the mode falls back to flat
(and returns) by the gate's mode rule. With a replica health view (services/planner/repair.py)
candidates are built over the replicas that are not down past the repair grace.

Knobs: interval, window, q_cap, W (warm slots), the replica set, the switching config, the
lease TTL (renewed every TTL/3), how many versions to keep, the incremental move bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from services.core.plan import Plan
from services.core.prefixes import samples_from_counts
from services.core.rates import nested_window_rates
from services.core.switching import SwitchConfig
from services.errors import FailedPrecondition, Unavailable
from services.model import ControlState, Mode, RatesSnapshot
from services.planner.candidate import BuildInputs, propose
from services.planner.gate import check_active, guard, validated_report
from services.rpc import kv, stop_tasks
from services.store import Fenced, FlatMode, Pinned, StaleVersion, Store

if TYPE_CHECKING:
    from services.planner.gate import Gate, Verdict


log = logging.getLogger("cacheroute.planner")


def switching_config(knobs: Mapping[str, float]) -> SwitchConfig:
    """The switching rule's config from NAME=VALUE knobs (ValueError for unknown names)."""
    cls = SwitchConfig
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(knobs) - names)
    if unknown:
        raise ValueError(f"unknown switching knob(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return cls(**knobs)


async def history_snapshot(store: Store, now: float, window: float, horizon: float, history: float) -> RatesSnapshot:
    """Per-key rates as an EWMA over the collector's buckets (services.core.rates.nested_window_rates):
    nested windows of `window`, 2x, 4x ... seconds up to `history`, slices weighted by e^(-age/horizon).
    Stateless, so a new lease holder computes the same rates. Keys, prompt and prefix means come from
    the longest window; the snapshot id names every window read."""
    spans = [window]
    while spans[-1] * 2 < history:
        spans.append(spans[-1] * 2)
    if history > spans[-1]:
        spans.append(history)
    snaps = [await store.window_rates(now, span) for span in spans]
    rates = nested_window_rates([(sn.window_seconds, {k: r * sn.window_seconds for k, r in zip(sn.keys, sn.rates)})
                                 for sn in snaps], horizon)
    longest = snaps[-1]
    prompt = dict(zip(longest.keys, longest.mean_prompt_tokens))
    prefix = longest.prefix_map()
    keys = tuple(sorted(rates, key=lambda k: (-rates[k], k)))
    return dataclasses.replace(longest, snapshot_id="ewma:" + "+".join(sn.snapshot_id for sn in snaps),
                               keys=keys, rates=tuple(rates[k] for k in keys),
                               mean_prompt_tokens=tuple(prompt.get(k, 0.0) for k in keys),
                               mean_prefix_tokens=tuple(prefix.get(k, 0.0) for k in keys))


@dataclass(frozen=True)
class LoopConfig:
    replica_ids: tuple[str, ...]
    q_cap: float
    warm_slots: int
    interval: float = 30.0
    window_seconds: float = 300.0
    incremental: bool = True
    switching: SwitchConfig | None = None
    planner_id: str = "planner"
    lease_ttl: float = 15.0
    keep_versions: int = 500
    min_arrivals: int = 1
    max_moves: int | None = None          # incremental rebalancing moves per loop (None: unbounded)
    rate_horizon: float | None = None     # EWMA horizon of per-key rates (None: the last window only)
    rate_history: float = 0.0             # longest telemetry span the EWMA reads (<= retention)
    prefix: bool = False                  # prefix-aware plans from the collector's prefix-node counts
    cold_homes: bool = True               # admit new keys on their cold-tail ring home (replan_incremental)


@dataclass
class LoopCounters:
    """Metric callbacks (no-ops by default)."""

    built: Callable[[Plan, float], None] = lambda plan, seconds: None
    decision: Callable[[str], None] = lambda outcome: None
    error: Callable[[], None] = lambda: None
    leader: Callable[[bool], None] = lambda is_leader: None


@dataclass
class LoopStatus:
    leader: bool = False
    token: int = 0
    last_loop_at: float = 0.0
    last_outcome: str = ""
    hit_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)   # available / achieved, last window


class ControlLoop:
    """Lease keeping and the periodic re-plan, as two background tasks."""

    def __init__(self, store: Store, config: LoopConfig, *, clock: Callable[[], float] = time.time,
                 counters: LoopCounters | None = None, enabled: bool = True, gate: "Gate | None" = None,
                 replicas: Callable[[], tuple[str, ...]] | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.counters = counters or LoopCounters()
        self.enabled = enabled
        self.gate = gate                       # shadow gate + fallback (None: activate on the decision alone)
        self.replicas = replicas or (lambda: config.replica_ids)   # the replica set to plan over
        self._token: int | None = None
        self._lease_valid_until = 0.0          # monotonic; renewals that fail past this depose us
        self._last_loop_at = 0.0
        self._hit_rates: dict[str, float] = {}
        self._last_outcome = "not run"
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    # ---- status

    @property
    def leader(self) -> bool:
        return self._token is not None and time.monotonic() < self._lease_valid_until

    def status(self) -> LoopStatus:
        return LoopStatus(self.leader, self._token or 0, self._last_loop_at, self._last_outcome, dict(self._hit_rates))

    # ---- lifecycle

    def start(self) -> None:
        if self.enabled:
            self._tasks = [asyncio.create_task(self._lease_task(), name="planner-lease"),
                           asyncio.create_task(self._loop_task(), name="planner-loop")]

    async def stop(self, *, release: bool = True) -> None:
        """Stop both tasks and give the lease up (release=False leaves it to expire, as a crash would)."""
        self._stopping = True
        self._wake.set()
        await stop_tasks(self._tasks)
        self._tasks = []
        if self._token is not None and release:
            try:
                await self.store.release_lease(self.config.planner_id, self._token)
            except Unavailable:
                pass
            self._set_token(None)

    def wake(self) -> None:
        """Run the next iteration now (tests, and a freshly acquired lease)."""
        self._wake.set()

    # ---- lease

    def _set_token(self, token: int | None) -> None:
        was = self.leader
        self._token = token
        self._lease_valid_until = time.monotonic() + self.config.lease_ttl if token is not None else 0.0
        if self.leader != was:
            log.info("leadership changed", extra=kv(planner=self.config.planner_id, leader=self.leader, token=token))
            self.counters.leader(self.leader)

    async def keep_lease(self) -> None:
        """One lease step: acquire when not holding it, renew when holding it."""
        cfg = self.config
        started = time.monotonic()
        if self._token is None:
            token = await self.store.acquire_lease(cfg.planner_id, cfg.lease_ttl)
            if token is not None:
                self._set_token(token)
                self._lease_valid_until = started + cfg.lease_ttl
                self.wake()
        elif await self.store.renew_lease(cfg.planner_id, self._token, cfg.lease_ttl):
            self._lease_valid_until = started + cfg.lease_ttl
        else:
            self._set_token(None)

    async def _lease_task(self) -> None:
        while not self._stopping:
            try:
                await self.keep_lease()
            except Unavailable as exc:
                log.warning("lease step failed", extra=kv(error=str(exc)))
                if self._token is not None and not self.leader:
                    self._set_token(None)
            await asyncio.sleep(self.config.lease_ttl / 3)

    # ---- the loop

    async def _loop_task(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if self._stopping or not self.leader:
                continue
            try:
                self._last_outcome = await self.run_once(self._token)
            except Unavailable as exc:
                self._last_outcome = f"error: {exc}"
                self.counters.error()
                log.warning("control loop failed", extra=kv(error=str(exc)))
            except Exception as exc:  # noqa: BLE001 - the loop must survive a bad interval
                self._last_outcome = f"error: {type(exc).__name__}: {exc}"
                self.counters.error()
                log.exception("control loop failed")
            self._last_loop_at = self.clock()

    async def run_once(self, token: int | None) -> str:
        """One interval; returns a one-line outcome."""
        cfg, store, now = self.config, self.store, self.clock()
        if cfg.rate_horizon is None:
            snap = await store.window_rates(now, cfg.window_seconds)
        else:
            snap = await history_snapshot(store, now, cfg.window_seconds, cfg.rate_horizon, cfg.rate_history)
        if snap.total_arrivals < cfg.min_arrivals:
            return f"skipped: {snap.total_arrivals} arrivals in the window"
        replicas = self.replicas()
        if not replicas:
            return "skipped: no active engines"
        inputs = BuildInputs.from_snapshot(snap, replicas, cfg.q_cap, cfg.warm_slots)
        if cfg.cold_homes:
            inputs = dataclasses.replace(inputs, served=await self.served(replicas, now))
        if cfg.prefix:
            inputs = await self.prefix_inputs(inputs, snap, now)

        async def gate(plan: Plan, state: ControlState, active: Plan | None) -> tuple[Plan, "Verdict"]:
            return await self.gate_candidate(plan, state, active, now)

        async def activate(plan: Plan, state: ControlState, verdict: "Verdict | None") -> str:
            return await self.settle(plan, state, verdict, token, now)

        done = await propose(store, inputs, now=now, incremental=cfg.incremental, max_moves=cfg.max_moves,
                             switching=cfg.switching, activate=activate, prefix=cfg.prefix,
                             review=gate if self.gate is not None else None, grow_in_dwell=True,
                             cold_homes=cfg.cold_homes)
        plan, outcome = done.plan, done.outcome
        self.counters.built(plan, done.build_seconds)
        self._hit_rates = {k: plan.extra[k] for k in ("available_hit_rate", "achieved_hit_rate") if k in plan.extra}
        self.counters.decision(outcome.split(":", 1)[0])
        if cfg.keep_versions > 0:
            await store.prune_plans(cfg.keep_versions)
        log.info("control loop", extra=kv(version=plan.version, outcome=outcome, keys=len(snap.keys),
                                          admitted=plan.admitted_keys, churn=plan.churn,
                                          imbalance=plan.predicted_imbalance, reason=plan.decision.reason))
        return outcome

    async def served(self, replicas: Sequence[str], now: float) -> dict[str, int]:
        """key -> index in `replicas` of the replica telemetry last saw it served on (within the
        window; replicas no longer in the set are left out)."""
        index = {rid: i for i, rid in enumerate(replicas)}
        homes = await self.store.served_homes(now, self.config.window_seconds)
        return {key: index[rid] for key, rid in homes.items() if rid in index}

    async def prefix_inputs(self, inputs: BuildInputs, snap, now: float) -> BuildInputs:
        """The window's prefix-node samples, prompt tokens and achieved hit rate, for a prefix plan."""
        window = self.config.window_seconds
        counts = await self.store.prefix_counts(now, window)
        stats = await self.store.cache_stats(now, window)
        prompt = sum(c.prompt_tokens for c in stats.values())
        achieved = sum(c.cached_tokens for c in stats.values()) / prompt if prompt else None
        arrived = math.fsum(r * m * snap.window_seconds for r, m in zip(snap.rates, snap.mean_prompt_tokens))
        return dataclasses.replace(inputs, nodes=tuple(samples_from_counts(counts)), prompt_tokens=arrived,
                                   achieved_hit_rate=achieved)

    async def settle(self, plan: Plan, state: ControlState, verdict: "Verdict | None", token: int | None,
                     now: float) -> str:
        """The loop's activation step for a stored candidate: the gate's fallback to flat, or the
        decision applied (and, when the gate returns from its own fallback, mode planned again)."""
        if verdict is not None and verdict.mode == Mode.FLAT:
            if await self.change_mode(Mode.FLAT, verdict.reason, token, now):
                return f"fallback: v{plan.version} stored, mode flat, {verdict.reason}"
            return f"refused: deposed, v{plan.version} stored, mode not changed"
        returning = verdict is not None and verdict.mode == Mode.PLANNED
        outcome = await self.apply_decision(plan, state.active_version, token, now, automatic=not returning)
        if returning and outcome.startswith("switched"):
            if await self.change_mode(Mode.PLANNED, verdict.reason, token, now):
                return f"returned: v{plan.version} active, mode planned, {verdict.reason}"
            return f"refused: deposed after activating v{plan.version}, mode not changed"
        return outcome

    async def gate_candidate(self, plan: Plan, state: ControlState, active: Plan | None,
                             now: float) -> tuple[Plan, "Verdict"]:
        """Replay the candidate (and the active plan) on the recent window; the candidate with its
        report and the gate's verdict folded into its decision, and the verdict."""
        result = await self.gate.run(self.store, now, plan, active)
        report = result.report
        check = None
        if active is not None:
            check = check_active(await validated_report(self.store, active), result.observed,
                                 self.gate.config.fallback)
        verdict = guard(passed=report.passed, gate_reason=report.reason, switch=plan.decision.switch,
                        switch_reason=plan.decision.reason, mode=state.mode, mode_reason=state.mode_reason,
                        has_active=active is not None, pinned=bool(state.pinned_version), check=check)
        decision = dataclasses.replace(plan.decision, switch=verdict.activate, reason=verdict.reason)
        observed = result.observed
        log.info("shadow gate", extra=kv(version=plan.version, passed=report.passed, reason=report.reason,
                                         observed_keys=observed.active_keys if observed else None,
                                         observed_p99=observed.ttft_p99 if observed else None,
                                         check=check[1] if check else None))
        return dataclasses.replace(plan, shadow=report, decision=decision), verdict

    async def change_mode(self, mode: Mode, reason: str, token: int | None, now: float) -> bool:
        """The loop's own fallback or return, fenced by `token` like its activations (operator
        SetMode calls are not fenced). False if this planner was deposed: nothing written."""
        try:
            await self.store.set_mode(mode, reason=reason, now=now, fencing_token=token)
        except Fenced:
            self._set_token(None)
            return False
        return True

    async def apply_decision(self, plan: Plan, expected: int, token: int | None, now: float, *,
                             automatic: bool = True) -> str:
        """Activate a stored candidate whose decision says switch (CAS on `expected`, fenced
        by `token`); a one-line outcome either way. `automatic` activations are refused in flat
        mode; the gate's return from its own fallback activates with automatic=False."""
        decision = plan.decision
        if not decision.switch:
            return f"kept: v{plan.version} stored, {decision.reason}"
        try:
            await self.store.activate(plan.version, expected=expected, now=now, reason=decision.reason,
                                      fencing_token=token, automatic=automatic)
        except Fenced:
            self._set_token(None)
            return f"refused: deposed, v{plan.version} not activated"
        except (Pinned, FlatMode, StaleVersion) as exc:
            return f"refused: v{plan.version} not activated, {exc}"
        except FailedPrecondition as exc:  # pragma: no cover - other refusals
            return f"refused: {exc}"
        return f"switched: v{plan.version} active, {decision.reason}"
