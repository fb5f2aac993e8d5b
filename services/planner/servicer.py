"""Planner RPCs: decode, call the store, the control logic or the shadow gate, encode."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Awaitable, Callable

import grpc

import numpy as np

from cacheroute.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from services.wire import codec, planwire
from services.core.plan import Plan
from services.core.planning import plan_diff
from services.core.engines import EngineConflict, EngineNotFound, EngineSet
from services.errors import FailedPrecondition, InvalidArgument, NotFound, ServiceError
from services.model import ControlState, Mode
from services.planner.candidate import BuildInputs, propose
from services.planner.control import ControlLoop
from services.planner.gate import Gate
from services.planner.watch import WatchHub
from services.rpc import kv
from services.store import Pinned, StaleVersion, Store, summary_of

if TYPE_CHECKING:
    from services.planner.advisor import RecommendedReplicas
    from services.planner.engines import EngineControl
    from services.planner.repair import ReplicaHealth

MAX_MOVES = 10_000          # DiffPlans moves per answer, whatever max_moves asks
MAX_EXPLICIT_KEYS = 4_000_000   # explicit rates one BuildPlanStream may carry (a million-key plan, with room)
MAX_REASON_BYTES = 512      # operator reasons (SetMode, ActivatePlan, Rollback): stored, shown by GetStatus
_MODE_TO_PB = {Mode.PLANNED: common_pb2.MODE_PLANNED, Mode.FLAT: common_pb2.MODE_FLAT}
_MODE_FROM_PB = {v: k for k, v in _MODE_TO_PB.items()}
log = logging.getLogger("cacheroute.planner")


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


def _engine_error(exc: Exception) -> ServiceError:
    """The core's engine-set refusals as status codes (NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION)."""
    if isinstance(exc, EngineNotFound):
        return NotFound(str(exc))
    if isinstance(exc, EngineConflict) and exc.exists:
        return AlreadyExists(str(exc))
    return FailedPrecondition(str(exc))


def _engine_set(engines: EngineSet, keys: dict[str, int] | None = None,
                down: set[str] | frozenset = frozenset()) -> planner_pb2.EngineSet:
    return planner_pb2.EngineSet(version=engines.version, engines=[
        _engine_info(e, keys, down) for e in engines.engines])


def _engine_info(e, keys: dict[str, int] | None = None, down: set[str] | frozenset = frozenset()) -> planner_pb2.EngineInfo:
    return planner_pb2.EngineInfo(slot=e.slot, id=e.id, address=e.address, state=e.state, source=e.source,
                                  changed_at=e.changed_at, planned_keys=(keys or {}).get(e.id, 0),
                                  healthy=e.id not in down)


def _keys_per_replica(plan: Plan) -> dict[str, int]:
    ids = plan.replica_ids
    return dict(collections.Counter(ids[m] for members in plan.table.values() for m in members))


def _control(state: ControlState, previous: int = 0) -> planner_pb2.ControlResponse:
    return planner_pb2.ControlResponse(active_version=state.active_version, previous_version=previous,
                                       mode=_MODE_TO_PB[state.mode], pinned_version=state.pinned_version)


def _reason(text: str, default: str) -> str:
    size = len(text.encode("utf-8"))
    if size > MAX_REASON_BYTES:
        raise InvalidArgument(f"reason is {size} bytes (max {MAX_REASON_BYTES})")
    return text or default


def _explicit_inputs(parts: list, replica_ids, q_cap, warm_slots) -> BuildInputs:
    """BuildInputs from the request's KeyRate slices (one for BuildPlan, one per message of BuildPlanStream)."""
    rows = list(itertools.chain.from_iterable(parts))
    rates = [r.rate for r in rows]
    values = np.array(rates, dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        r = rows[int(np.argmax(bad))]
        raise InvalidArgument(f"rate for key {r.key!r} must be finite and >= 0, got {r.rate}")
    prefix = {r.key: float(r.prefix_tokens) for r in rows if r.prefix_tokens}
    return BuildInputs([r.key for r in rows], rates, prefix, replica_ids, q_cap, warm_slots)


def advice_pb(advisor: "RecommendedReplicas") -> planner_pb2.CapacityAdvice:
    a = advisor.last
    return planner_pb2.CapacityAdvice(
        recommended=a.recommended or 0, gauge=int(advisor.gauge_value), slo_p99=advisor.config.slo_p99,
        replicas=advisor.last_replicas, qps=a.qps, requests=a.requests, output_tokens=a.output_tokens,
        output_measured=a.output_measured, arrival_cv=a.cv, computed_at=advisor.last_at,
        points=[planner_pb2.AdvicePoint(replicas=p.replicas, hit_rate=p.hit_rate, ttft_p99=p.ttft_p99,
                                        meets_slo=p.meets_slo) for p in a.points])


MAX_ENGINE_WAIT = 30.0      # seconds a ListEngines long poll is held at most


class PlannerServicer(planner_pb2_grpc.PlannerServicer):
    def __init__(self, store: Store, loop: ControlLoop, hub: WatchHub, *, planner_id: str,
                 clock: Callable[[], float], gate: Gate | None = None,
                 max_message_bytes: int = 8 * 1024 * 1024, engines: "EngineControl | None" = None,
                 health: "ReplicaHealth | None" = None, advisor: "RecommendedReplicas | None" = None) -> None:
        self.store = store
        self.advisor = advisor
        self.engines = engines
        self.health = health
        self.loop = loop
        self.hub = hub
        self.gate = gate
        self.planner_id = planner_id
        self.clock = clock
        self.max_message_bytes = max_message_bytes
        self._plans: OrderedDict[int, Plan] = OrderedDict()   # small cache of decoded plans
        self._chunks: OrderedDict[tuple[int, int, bool], list] = OrderedDict()   # (version, budget, columnar)
        self._columns: OrderedDict[int, codec.Columns | None] = OrderedDict()   # version -> its table in columns
        self._inflight: dict[tuple, asyncio.Future] = {}    # what is being read or cut now, by what it is

    async def _once(self, key: tuple, make: Callable[[], Awaitable[object]]) -> object:
        """`make()`, run by one caller per `key` at a time: every dispatcher worker watching
        gets a new version at once, and each reading and decoding the plan for itself was
        one decode per watcher, in series on this loop (at a million keys several seconds
        each). The others await the same result; a caller cancelled leaves it running."""
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.ensure_future(make())
            task.add_done_callback(lambda t: self._settled(key, t))
        return await asyncio.shield(task)

    def _settled(self, key: tuple, task: asyncio.Future) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()      # retrieved here, raised to every caller still waiting

    async def _plan(self, version: int) -> Plan:
        if version in self._plans:
            self._plans.move_to_end(version)
            return self._plans[version]

        async def read() -> Plan:
            plan = await self.store.get_plan(version)
            self._remember(plan)
            return plan
        return await self._once(("plan", version), read)

    def _remember(self, plan: Plan) -> None:
        self._plans[plan.version] = plan
        while len(self._plans) > 4:
            self._plans.popitem(last=False)

    def forget_plans(self) -> None:
        """Drop cached plans (the store lost its state, so they may no longer exist)."""
        self._plans.clear()
        self._chunks.clear()
        self._columns.clear()

    async def _plan_columns(self, version: int, plan: Plan) -> codec.Columns | None:
        """A version's table in columns, computed once (in a thread) for every page and watcher;
        None for a plan the column widths cannot hold (a key on more than 255 replicas, more
        than 65,535 replicas): it is sent one entry per key, which every reader decodes too."""
        if version in self._columns:
            self._columns.move_to_end(version)
            return self._columns[version]

        async def cut() -> codec.Columns | None:
            try:
                cols = await asyncio.to_thread(codec.table_columns, plan)
            except ValueError:
                cols = None
            self._columns[version] = cols
            while len(self._columns) > 2:
                self._columns.popitem(last=False)
            return cols
        return await self._once(("columns", version), cut)

    async def _plan_chunks(self, version: int, budget: int, columnar: bool = False) -> list:
        """The active plan's messages for WatchPlans (one when it fits), cut once per version:
        every dispatcher watching gets the same ones."""
        key = (version, budget, columnar)
        if key in self._chunks:
            return self._chunks[key]

        async def cut() -> list:
            t0 = time.perf_counter()
            plan = await self._plan(version)
            t1 = time.perf_counter()
            cols = await self._plan_columns(version, plan) if columnar else None
            t2 = time.perf_counter()
            chunks = self._chunks[key] = await asyncio.to_thread(planwire.plan_chunks, plan, budget, cols)
            while len(self._chunks) > 2:
                self._chunks.popitem(last=False)
            log.info("plan cut for watchers", extra=kv(version=version, keys=len(plan.table), chunks=len(chunks),
                     columnar=columnar, read_s=round(t1 - t0, 3), columns_s=round(t2 - t1, 3),
                     cut_s=round(time.perf_counter() - t2, 3)))
            return chunks
        return await self._once(("chunks",) + key, cut)

    async def _active_version(self) -> int:
        active = (await self.store.get_control()).active_version
        if not active:
            raise NotFound("no plan is active")
        return active

    # ---- reads

    async def GetPlan(self, request, context):
        plan = await self._plan(request.version or await self._active_version())
        if request.summary_only:
            return codec.plan_to_proto(summary_of(plan))
        budget = planwire.budget_for(self.max_message_bytes, request.max_bytes)
        cols = await self._plan_columns(plan.version, plan) if request.columnar else None
        return await asyncio.to_thread(planwire.plan_page, plan, budget, request.table_offset, cols)

    async def ListPlans(self, request, context):
        limit = min(request.limit or 20, 1000)
        state = await self.store.get_control()
        plans = await self.store.list_plans(limit, request.before_version)
        return planner_pb2.ListPlansResponse(
            plans=[codec.plan_summary(p, p.version == state.active_version, p.version == state.pinned_version)
                   for p in plans],
            active_version=state.active_version, mode=_MODE_TO_PB[state.mode], pinned_version=state.pinned_version)

    async def WatchPlans(self, request, context):
        budget = planwire.budget_for(self.max_message_bytes, request.max_chunk_bytes)
        async with self.hub.listen() as updates:
            state = await self.store.get_control()
            if not (request.known_version and request.known_version == state.active_version):
                for update in await self._updates(state, "initial", request, budget):
                    yield update
            seen = (state.active_version, state.mode)
            while True:
                state, event = await updates.get()
                if (state.active_version, state.mode) == seen:   # the hub catching up on what this
                    continue                                     # stream started from: no change
                seen = (state.active_version, state.mode)
                for update in await self._updates(state, event, request, budget):
                    yield update

    async def _updates(self, state: ControlState, event: str, request: planner_pb2.WatchPlansRequest,
                       budget: int) -> list[planner_pb2.PlanUpdate]:
        """One PlanUpdate, or the consecutive chunks of one when the table is too big."""
        head = dict(active_version=state.active_version, mode=_MODE_TO_PB[state.mode], event=event)
        if not state.active_version:
            return [planner_pb2.PlanUpdate(**head)]
        if not request.include_table:
            plan = await self._plan(state.active_version)
            return [planner_pb2.PlanUpdate(**head, plan=codec.plan_to_proto(summary_of(plan)))]
        return [planner_pb2.PlanUpdate(**head, plan=chunk)
                for chunk in await self._plan_chunks(state.active_version, budget, request.columnar)]

    async def DiffPlans(self, request, context):
        old = await self._plan(request.from_version)
        new = await self._plan(request.to_version or await self._active_version())
        diff = await asyncio.to_thread(plan_diff, old, new)
        cap = min(request.max_moves or 100, MAX_MOVES)
        moves = [planner_pb2.KeyMove(key=m.key, from_replicas=m.old, to_replicas=m.new, rate=m.rate)
                 for m in diff.moves[:cap]]
        prefix_moves = [planner_pb2.KeyMove(key=m.key, from_replicas=m.old, to_replicas=m.new, rate=m.rate)
                        for m in diff.prefix_moves[:cap]]
        return planner_pb2.DiffPlansResponse(
            churn=diff.churn, keys_moved=diff.keys_moved, keys_added=diff.keys_added, keys_removed=diff.keys_removed,
            moves=moves, prefixes_kept=diff.prefixes_kept, prefixes_moved=sum(1 for m in diff.prefix_moves if m.old),
            prefixes_added=sum(1 for m in diff.prefix_moves if not m.old),
            prefixes_removed=len(diff.prefixes_removed), prefix_moves=prefix_moves)

    async def GetStatus(self, request, context):
        state, loop = await self.store.get_control(), self.loop.status()
        return planner_pb2.PlannerStatus(
            planner_id=self.planner_id, leader=loop.leader, lease_fencing_token=loop.token,
            active_version=state.active_version, mode=_MODE_TO_PB[state.mode], pinned_version=state.pinned_version,
            mode_reason=state.mode_reason, last_loop_at=loop.last_loop_at, last_loop_outcome=loop.last_outcome,
            latest_version=state.latest_version, **loop.hit_rates)

    async def GetAdvice(self, request, context):
        if self.advisor is None:
            raise FailedPrecondition("the capacity advisor is off: start the planner with --advise-slo-p99")
        if self.advisor.last is None:
            raise NotFound("no advice yet: the advisor has not seen a telemetry window with traffic")
        return advice_pb(self.advisor)

    # ---- control (bearer token when configured)

    async def BuildPlan(self, request, context):
        return await self._build(request, [request.rates])

    async def BuildPlanStream(self, request_iterator, context):
        """BuildPlan with its rates in slices: every field in the first message, only `rates` after."""
        head, parts, count = None, [], 0
        async for msg in request_iterator:
            if head is None:
                head = msg
            elif [f.name for f, _ in msg.ListFields()] not in ([], ["rates"]):
                raise InvalidArgument("BuildPlanStream: only the first message may carry fields other than rates")
            count += len(msg.rates)
            if count > MAX_EXPLICIT_KEYS:
                raise InvalidArgument(f"BuildPlanStream: more than {MAX_EXPLICIT_KEYS} explicit rates")
            parts.append(msg.rates)
        if head is None:
            raise InvalidArgument("BuildPlanStream: no request message")
        return await self._build(head, parts)

    async def _build(self, request: planner_pb2.BuildPlanRequest, parts: list) -> planner_pb2.BuildPlanResponse:
        if request.shadow and self.gate is None:
            raise FailedPrecondition("the shadow gate is not available on this planner")
        now = self.clock()
        explicit = any(len(p) for p in parts)
        inputs = await self._build_inputs(request, parts, now)
        if self.loop.config.cold_homes and not explicit:
            inputs = dataclasses.replace(inputs, served=await self.loop.served(inputs.replica_ids, now))

        def check(state: ControlState) -> None:   # refusals the activation would meet
            if request.activate and state.active_version != request.expected_active_version:
                raise StaleVersion(f"stale expected version: active is {state.active_version}")
            if request.activate and state.pinned_version:
                raise Pinned(f"version {state.pinned_version} is pinned; unpin it first")

        async def review(plan: Plan, state: ControlState, active: Plan | None) -> tuple[Plan, tuple]:
            passed = True
            if request.shadow:   # gated: activate only if the replay passes
                report = (await self.gate.run(self.store, now, plan, None)).report
                plan, passed = dataclasses.replace(plan, shadow=report), report.passed
            # the answer is encoded before anything is stored: one that cannot be sent changes
            # nothing (a table above the limit is answered with its first slice; GetPlan pages on)
            answer = await asyncio.to_thread(planwire.plan_page, plan, planwire.budget_for(self.max_message_bytes))
            return plan, (passed, answer)

        async def activate(plan: Plan, state: ControlState, verdict: tuple) -> planner_pb2.BuildPlanResponse:
            passed, answer = verdict
            activated = request.activate and passed
            # stored: keep the plan we have rather than decode it back from the store when it is
            # activated or paged (a million keys: seconds of JSON), and its columns when it waits
            self._remember(plan)
            if not activated:
                await self._plan_columns(plan.version, plan)
            if activated:
                await self.store.activate(plan.version, expected=request.expected_active_version, now=now,
                                          reason="BuildPlan (shadow gate passed)" if request.shadow else "BuildPlan")
            return planner_pb2.BuildPlanResponse(plan=answer, activated=activated)

        done = await propose(self.store, inputs, now=now, incremental=request.incremental, max_moves=None,
                             switching=self.loop.config.switching, check=check, review=review, activate=activate,
                             cold_homes=self.loop.config.cold_homes and not explicit)
        return done.outcome

    async def _build_inputs(self, request: planner_pb2.BuildPlanRequest, parts: list, now: float) -> BuildInputs:
        """BuildPlan's inputs: the request's rates, else the telemetry window; the loop's
        replicas, q_cap and W unless the request names its own."""
        cfg = self.loop.config
        if request.q_cap < 0 or not math.isfinite(request.q_cap):
            raise InvalidArgument("q_cap must be finite and > 0")
        if any(not rid for rid in request.replica_ids):
            raise InvalidArgument("replica ids must be non-empty")
        replicas = tuple(request.replica_ids) or cfg.replica_ids
        q_cap, warm = request.q_cap or cfg.q_cap, request.warm_slots or cfg.warm_slots
        if any(len(p) for p in parts):
            return await asyncio.to_thread(_explicit_inputs, parts, replicas, q_cap, warm)
        snap = await self.store.window_rates(now, cfg.window_seconds)
        if not snap.keys:
            raise FailedPrecondition(f"no telemetry in the last {cfg.window_seconds:g}s and no explicit rates")
        return BuildInputs.from_snapshot(snap, replicas, q_cap, warm)

    async def ShadowPlan(self, request, context):
        if self.gate is None:
            raise FailedPrecondition("the shadow gate is not available on this planner")
        window = request.window_seconds
        if not (math.isfinite(window) and window >= 0):
            raise InvalidArgument("window_seconds must be finite and >= 0")
        plan = await self._plan(request.version or await self._active_version())
        result = await self.gate.run(self.store, self.clock(), plan, None, window_seconds=window or None)
        return codec.shadow_to_proto(result.report)

    async def ActivatePlan(self, request, context):
        done = await self.store.activate(request.version, expected=request.expected_active_version,
                                         now=self.clock(), reason=_reason(request.reason, "ActivatePlan"))
        return _control(await self.store.get_control(), done.previous_version)

    async def Rollback(self, request, context):
        done = await self.store.rollback(expected=request.expected_active_version, to_version=request.to_version,
                                         now=self.clock(), reason=_reason(request.reason, "Rollback"))
        return _control(await self.store.get_control(), done.previous_version)

    async def SetMode(self, request, context):
        if request.mode not in _MODE_FROM_PB:
            raise InvalidArgument("mode must be MODE_PLANNED or MODE_FLAT")
        return _control(await self.store.set_mode(_MODE_FROM_PB[request.mode],
                                                  reason=_reason(request.reason, "SetMode"), now=self.clock()))

    async def PinPlan(self, request, context):
        return _control(await self.store.pin(request.version or await self._active_version()))

    async def UnpinPlan(self, request, context):
        return _control(await self.store.unpin())

    # ---- the engine set (services/planner/engines.py)

    def _engine_control(self) -> "EngineControl":
        if self.engines is None:
            raise FailedPrecondition("this planner does not manage an engine set")
        return self.engines

    def _down(self) -> set[str]:
        return set(self.health.down_for()) if self.health is not None else set()

    async def ListEngines(self, request, context):
        engines = await self.store.get_engine_set()
        if request.known_version and request.known_version == engines.version:
            wait = min(request.wait_seconds, MAX_ENGINE_WAIT) if request.wait_seconds > 0 else 0.0
            if not wait or self.engines is None:
                return planner_pb2.EngineSet(version=engines.version, unchanged=True)
            await self.engines.registry.wait_change(engines.version, wait)     # the long poll (planner.proto)
            engines = await self.store.get_engine_set()
            if request.known_version == engines.version:
                return planner_pb2.EngineSet(version=engines.version, unchanged=True)
        keys = None
        if request.planned_keys:
            active = (await self.store.get_control()).active_version
            keys = await asyncio.to_thread(_keys_per_replica, await self._plan(active)) if active else {}
        return _engine_set(engines, keys, self._down())

    async def AddEngine(self, request, context):
        control = self._engine_control()
        try:
            after, engine_id, outcome = await control.add(request.address, request.id)
        except (EngineConflict, EngineNotFound) as exc:
            raise _engine_error(exc) from None
        active = (await self.store.get_control()).active_version
        return self._change(after, engine_id, active, outcome)

    async def DrainEngine(self, request, context):
        try:
            after, engine_id, active, outcome = await self._engine_control().drain(_ref(request.engine))
        except (EngineConflict, EngineNotFound) as exc:
            raise _engine_error(exc) from None
        return self._change(after, engine_id, active, outcome)

    async def RemoveEngine(self, request, context):
        try:
            after, engine_id, active, outcome = await self._engine_control().remove(_ref(request.engine),
                                                                                 request.force)
        except (EngineConflict, EngineNotFound) as exc:
            raise _engine_error(exc) from None
        return self._change(after, engine_id, active, outcome)

    def _change(self, after: EngineSet, engine_id: str, active: int, outcome: str) -> planner_pb2.EngineChange:
        down = self._down()
        return planner_pb2.EngineChange(engines=_engine_set(after, None, down),
                                        engine=_engine_info(after.by_id(engine_id), None, down),
                                        active_version=active, outcome=outcome)


def _ref(text: str) -> str:
    if not text.strip():
        raise InvalidArgument("engine: give an engine id or address")
    return text.strip()
