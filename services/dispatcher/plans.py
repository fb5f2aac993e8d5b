"""Where the dispatcher's active plan comes from.

1. The planner's WatchPlans stream (include_table): an initial push, then every
   activation, rollback or mode change. Source "watch". A plan above the message limit
   arrives as consecutive chunks (services.wire.planwire); it is installed once complete.
2. When the planner is unreachable (or none is configured): the active plan and mode read
   from Redis through the store, re-read on every retry round. Source "redis".
3. When both are down: keep routing with the last good plan and mode.
The planner is retried with exponential backoff and jitter (`backoff_min` .. `backoff_max`);
a watch that ends normally (its long deadline, a planner restart) reconnects at once.

The event loop never decodes or indexes a plan: the watch asks for tables in columns
(WatchPlansRequest.columnar: a key blob and packed arrays), collects the chunks of one
update as they are, and decodes, indexes and prepares them in one worker thread
(codec.plan_from_slices + Router.prepare); the loop then swaps the result in at once
(Router.install). The same holds for a plan read from the store. An update naming the
version already installed changes only the mode (plans are immutable per version).

The engine set (services/core/engines.py) is followed the same way by `EngineFeed`: it asks the
planner's ListEngines with the version it holds and `wait_seconds` LONG_POLL (10 s): the planner
holds the call until its set changes or the wait passes (a long poll: one call per change or per
10 s, where a poll every 0.5 s cost an idle dispatcher 3.5-4 ms of CPU a second: bench/dispatcher_idle.py,
docs/benchmarks.md). The first read,
an older planner (it answers at once), an error, or the store when the planner does not answer:
the next read `interval` (0.5 s) later. The drain gate below runs every `interval` on its own.
An engine the dispatcher does not know gets the next slot (ReplicaMonitor.add: polled at
once) and the installed plan is prepared again for the grown slot count before the slot can
route; a draining engine stays in rotation until the plan the dispatcher runs names it no
more (the planner's drain step activates one that does not), or the mode is flat, and is
then out of rotation while its in-flight requests finish; a removed engine's slot is retired.
Slots follow the set's order, so dispatchers started with the same `--replicas` agree on
them (and on the cold tail's ring) as engines come and go.

After a large install the replaced plan's memory is handed back to the OS (glibc
`malloc_trim`, in the worker thread): glibc raises its mmap threshold after freeing large
blocks, so without it the next plans' arrays come from the heap and a replaced plan stays
resident (measured: +20 MiB per 128,824-key plan change without the trim). And a serving process
keeps to 2 malloc arenas (`limit_arenas`, `--malloc-arenas`): glibc gives each thread that
allocates under contention an arena of its own, up to 8 per core, and the install thread's arena
kept its pages after the trim: a first 128,824-key plan grew the RSS by 171-186 bytes a key with
glibc's default and 112-122 with 2 arenas (or 1), probes unchanged (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import random
import time

import grpc

from cacheroute.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from services.wire import codec
from services.core.engines import ACTIVE, DRAINING, REMOVED, Engine, EngineSet
from services.dispatcher.monitor import ReplicaMonitor
from services.dispatcher.router import Prepared, Router
from services.errors import ServiceError
from services.model import Mode, Replica
from services.wire.planwire import SliceAssembler
from services.rpc import Backoff, TLSFiles, aio_channel, kv, stop_tasks
from services.store import Store

log = logging.getLogger("cacheroute.dispatcher.plans")
TRIM_KEYS = 10_000          # trim the heap after installing a plan of at least this many keys


def _libc(name: str):
    """The C library's function `name` (glibc's malloc_trim, mallopt), or None where there is
    none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_TRIM = _libc("malloc_trim")
M_ARENA_MAX = -8            # glibc's mallopt parameter (malloc.h)


def limit_arenas(n: int) -> bool:
    """At most `n` glibc malloc arenas for this process from now on (module header); whether
    it was set. 0, a MALLOC_ARENA_MAX in the environment (the operator's own) or no glibc
    (musl, macOS) leave the allocator as it is."""
    mallopt = _libc("mallopt") if n > 0 and "MALLOC_ARENA_MAX" not in os.environ else None
    return mallopt is not None and mallopt(M_ARENA_MAX, n) == 1


class PlanFeed:
    def __init__(self, router: Router, *, planner: str = "", store: Store | None = None,
                 backoff_min: float = 0.1, backoff_max: float = 5.0, watch_seconds: float = 600.0,
                 tls: TLSFiles | None = None, max_message_bytes: int = 64 * 1024 * 1024,
                 seed: int | None = None) -> None:
        self.router = router
        self.planner = planner
        self.store = store
        self.watch_seconds = watch_seconds
        self.updates = 0
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._backoff = Backoff(backoff_min, backoff_max, random.Random(seed))
        self._first = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task | None = None

    async def start(self, wait: float = 1.0) -> None:
        """Start following plans; wait up to `wait` seconds for the first one (or a miss)."""
        if self.planner:
            self._channel = aio_channel(self.planner, self._tls, self._max_message_bytes)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="plan-feed")
        try:
            await asyncio.wait_for(self._first.wait(), wait)
        except asyncio.TimeoutError:
            log.warning("no plan source answered yet", extra=kv(planner=self.planner, wait=wait))

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _run(self) -> None:
        while True:
            if self._channel is not None and await self._watch():
                self._backoff.reset()
                continue
            await self._read_store()
            self._first.set()           # the first attempt is over, whatever it found
            await asyncio.sleep(next(self._backoff))

    async def _watch(self) -> bool:
        """Follow the planner until the stream ends. True if it delivered at least one update."""
        assert self._channel is not None
        stub = planner_pb2_grpc.PlannerStub(self._channel)
        got = False
        slices = SliceAssembler()
        call = stub.WatchPlans(planner_pb2.WatchPlansRequest(include_table=True, columnar=True,
                                                             max_chunk_bytes=self._max_message_bytes),
                               timeout=self.watch_seconds)
        try:
            async for update in call:
                parts = None
                if update.active_version:
                    parts = slices.add_slices(update.plan)
                    if parts is None:
                        continue          # more chunks of this update follow
                await self._apply_update(update, parts)
                installed = parts is not None and len(parts) > 0
                parts = update = None     # the slices (tens of MB at a million keys) go now, not at the next update
                if installed:
                    await self._trim()
                got = True
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED or not got:
                log.warning("planner watch failed", extra=kv(planner=self.planner, code=err.code().name,
                                                             detail=err.details()))
        except ValueError as exc:   # an undecodable plan: keep the last good one
            log.error("bad plan from the planner", extra=kv(planner=self.planner, error=str(exc)))
        finally:
            call.cancel()
        return got

    async def _apply_update(self, update: planner_pb2.PlanUpdate, parts: list | None) -> None:
        flat = update.mode == common_pb2.MODE_FLAT
        if not update.active_version:
            await self._install(None, flat, "watch", update.event)
        elif update.active_version == self.router.plan_version and self.router.plan is not None:
            await self._install(self.router.plan, flat, "watch", update.event)
        else:
            start = time.perf_counter()
            prepared = await asyncio.to_thread(self._decode, parts)
            self._apply(prepared, flat, "watch", update.event, decode_s=time.perf_counter() - start)

    async def _trim(self) -> None:
        plan = self.router.plan
        if _TRIM is not None and plan is not None and len(plan.table) >= TRIM_KEYS:
            await asyncio.to_thread(_TRIM, 0)

    def _decode(self, parts: list) -> Prepared:
        """Worker thread: the update's slices -> a prepared, columnar plan (ValueError if invalid)."""
        return self.router.prepare(codec.plan_from_slices(parts, columnar=True))

    async def _read_store(self) -> None:
        if self.store is None:
            return
        try:
            control = await self.store.get_control()
            flat = control.mode == Mode.FLAT
            if control.active_version == self.router.plan_version and self.router.plan_source != "none":
                if flat != self.router.flat or self.router.plan_source != "redis":
                    await self._install(self.router.plan, flat, "redis", "mode")
                return
            plan = await self.store.get_plan(control.active_version) if control.active_version else None
        except (ServiceError, ValueError, OSError) as exc:
            log.warning("store read failed; keeping the last plan",
                        extra=kv(error=str(exc), plan_version=self.router.plan_version))
            return
        try:
            await self._install(plan, flat, "redis", "read")
        except ValueError as exc:
            log.error("bad plan in the store; keeping the last one", extra=kv(error=str(exc)))

    async def _install(self, plan, flat: bool, source: str, event: str) -> None:
        if plan is not None and plan is self.router.plan:      # a mode change: nothing to prepare
            prepared = None
        else:
            prepared = await asyncio.to_thread(self.router.prepare, plan)
        self._apply(prepared, flat, source, event)
        if prepared is not None:
            del prepared, plan
            await self._trim()

    def _apply(self, prepared: Prepared | None, flat: bool, source: str, event: str, decode_s: float = 0.0) -> None:
        """On the loop, constant time: the prepared plan (None: the installed one) and the mode."""
        before = (self.router.plan_version, self.router.flat)
        if prepared is None:
            self.router.set_plan(self.router.plan, flat=flat, source=source)
        else:
            self.router.install(prepared, flat=flat, source=source)
        plan = self.router.plan
        self.updates += 1
        self._first.set()
        if before != (self.router.plan_version, flat):
            log.info("plan installed", extra=kv(version=self.router.plan_version, flat=flat, source=source,
                                                event=event, keys=len(plan.table) if plan else 0,
                                                decode_s=round(decode_s, 3)))


LONG_POLL = 10.0      # seconds the planner may hold an EngineFeed read of an unchanged set


class EngineFeed:
    """Follows the engine set (module header) into the router and the replica monitor."""

    def __init__(self, router: Router, monitor: ReplicaMonitor, *, planner: str = "", store: Store | None = None,
                 interval: float = 0.5, timeout: float = 2.0, tls: TLSFiles | None = None) -> None:
        self.router = router
        self.monitor = monitor
        self.planner = planner
        self.store = store
        self.interval = interval
        self.timeout = timeout
        self.version = 0
        self.engines = EngineSet()
        self.draining: set[int] = set()
        self._tls = tls
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task | None = None
        self._gating: asyncio.Task | None = None
        self._stopping = False
        self._skipped: set[str] = set()
        self._plan_names: dict[tuple[int, str], bool] = {}     # (plan version, id) -> the plan places keys there

    async def start(self) -> None:
        if self.planner:
            self._channel = aio_channel(self.planner, self._tls)
        await self.step()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="engine-feed")
        self._gating = loop.create_task(self._gate_loop(), name="engine-gate")

    async def stop(self) -> None:
        self._stopping = True
        await stop_tasks([self._task, self._gating])
        self._task = self._gating = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            try:
                held = await self.step(wait=LONG_POLL)
            except Exception:  # noqa: BLE001 - the feed must survive a bad step
                log.exception("engine feed step failed")
                held = False
            if not held:     # no long poll (the store, an older planner, an error): the next read after interval
                await asyncio.sleep(max(0.0, started + self.interval - loop.time()))

    async def _gate_loop(self) -> None:
        """The drain gate every interval too: a long poll may hold a read for LONG_POLL seconds,
        and a draining slot must leave rotation soon after the plan that drops it is installed."""
        while not self._stopping:
            await asyncio.sleep(self.interval)
            self.gate()

    async def step(self, wait: float = 0.0) -> bool:
        """One read of the set (the planner may hold it up to `wait` s: the long poll), then the
        drain gate on the plan installed now; True if the planner held the read or the set changed."""
        engines, held = await self._read(wait)
        if engines is not None and engines.version != self.version:
            await self.apply(engines)
            held = True
        self.gate()
        return held

    async def _read(self, wait: float = 0.0) -> tuple[EngineSet | None, bool]:
        """(the set, or None if unchanged or unknown; whether the planner held the call)."""
        if self._channel is not None:
            wait = wait if self.version else 0.0        # the first read is answered at once
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                answer = await planner_pb2_grpc.PlannerStub(self._channel).ListEngines(
                    planner_pb2.ListEnginesRequest(known_version=self.version, wait_seconds=wait),
                    timeout=self.timeout + wait)
                # an answer in under half the wait was not held (a planner without the long poll)
                held = wait > 0 and loop.time() - started >= wait / 2
                if answer.unchanged:
                    return None, held
                return EngineSet(answer.version, tuple(_engine(e) for e in answer.engines)), held
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return None, False                 # an older planner: a fixed engine set
        if self.store is not None:
            try:
                return await self.store.get_engine_set(), False
            except (ServiceError, ValueError, OSError) as exc:
                log.warning("engine set read failed", extra=kv(error=str(exc)))
        return None, False

    async def apply(self, engines: EngineSet) -> None:
        """New engines get slots; states become rotation (module header)."""
        router, monitor = self.router, self.monitor
        added = []
        for engine in engines.engines:
            i = router._index.get(engine.id)
            if i is None:
                if engine.state == REMOVED:
                    continue
                if not engine.address:
                    if engine.id not in self._skipped:
                        self._skipped.add(engine.id)
                        log.warning("engine without an address left out", extra=kv(engine=engine.id))
                    continue
                i = await monitor.add(Replica(engine.id, engine.address))
                added.append(i)
            if engine.state == REMOVED:
                self.draining.discard(i)
                await monitor.retire(i)
            elif engine.state == DRAINING:
                self.draining.add(i)
            elif engine.state == ACTIVE and i in self.draining:
                self.draining.discard(i)
                monitor.open_slot(i)
        if added:
            await self._reindex()
            for i in added:
                monitor.open_slot(i)
            await monitor.poll_once()
        self.version, self.engines = engines.version, engines
        log.info("engine set followed", extra=kv(version=engines.version, slots=len(router.ids), added=len(added),
                                                 draining=sorted(router.ids[i] for i in self.draining)))

    async def _reindex(self) -> None:
        """Prepare the installed plan again for the grown slot count (a plan the plan feed
        installs meanwhile is prepared for it already: then nothing is left to do)."""
        router = self.router
        count = len(router.ids)
        while True:
            plan, flat, source = router.plan, router.flat, router.plan_source
            prepared = await asyncio.to_thread(router.prepare, plan)
            if router.plan is plan and len(router.ids) == count:
                router.install(prepared, flat=router.flat if router.plan is plan else flat, source=source)
                return
            count = len(router.ids)

    def gate(self) -> None:
        """Draining slots out of rotation once the installed plan names them no more (or flat)."""
        plan, router = self.router.plan, self.router
        for i in sorted(self.draining):
            rid = router.ids[i]
            if router.flat or plan is None or not self._named(plan, rid):
                if i not in self.monitor.closed:
                    self.monitor.close_slot(i, "draining: no planned key left")
            elif i in self.monitor.closed:
                self.monitor.open_slot(i)

    def _named(self, plan, rid: str) -> bool:
        key = (plan.version, rid)
        if key not in self._plan_names:
            if len(self._plan_names) > 64:
                self._plan_names.clear()
            self._plan_names[key] = _plans_on(plan, rid)
        return self._plan_names[key]


def _plans_on(plan, replica_id: str) -> bool:
    """Whether `plan` places any key (or prefix node) on `replica_id`."""
    if replica_id not in plan.replica_ids:
        return False
    m = plan.replica_ids.index(replica_id)
    table = plan.table
    members = getattr(table, "members", None)
    if members is not None:
        found = bool((members == m).any())
    else:
        found = any(m in row for row in table.values())
    return found or any(m in entry.replicas for entry in plan.prefixes.values())


def _engine(info: planner_pb2.EngineInfo):
    return Engine(info.slot, info.id, info.address, info.state, info.source, info.changed_at)
