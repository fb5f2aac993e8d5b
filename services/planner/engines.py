"""Engines that come and go, on the planner: the engine set (services/core/engines.py) as this
planner sees it, its changes (AddEngine, DrainEngine, RemoveEngine and DNS discovery) and the
re-plan each one calls for.

The set. Stored next to the plans (Store.get_engine_set / put_engine_set, a compare-and-set
on its version); `EngineRegistry` keeps the last one read and re-reads it every `poll`
seconds (default 0.5), so a change made through any planner reaches every planner within a
poll. At start the configured replicas (`--replicas`) the stored set lacks are added to it
(source "config"); a stored set is otherwise kept as it is, so a restart keeps the engines
added at run time. When the set changes the planner's health view follows it
(ReplicaHealth.set_addresses) and the control loop is woken.

Placement. The control loop plans over the *active* engines (`placeable_ids`) that its
health view does not call down. So:
  - add: the woken loop builds a churn-aware candidate over a changed replica set, which the
    switching rule takes; its move bound (`--max-moves`) hands the new engine at most that
    many key shares per loop, so it warms up over a few loops (as a returning replica does);
  - drain: `move_off` writes a repaired version of the active plan without the engine
    (services.core.replan.repair_plan: only that engine's keys move, to the survivors, churn
    recorded) and activates it at once (compare-and-set on the version it repaired; an
    operator step, so allowed in flat mode and refused when a version is pinned); dispatchers
    stop sending the engine new requests once the plan they run holds none there;
  - remove: the engine leaves the health view and every dispatcher's rotation for good.

Discovery (`--discover [KIND+][http://]NAME:PORT`, every `--discover-interval` s, default 10):
the lease holder resolves NAME (getaddrinfo: every A/AAAA record, as a Kubernetes headless
Service answers with one per ready pod) and reconciles the set for the source "dns:NAME:PORT"
(services.core.engines.reconcile): new addresses are added, vanished ones drained (their keys
move at once), and a drained one whose keys have left the active plan is removed at a later
resolution. A failed or empty lookup changes nothing. Its writes carry the lease's fencing
token, so a deposed leader's stale view is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import socket
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from services.backends import parse_endpoint
from services.core.engines import (
    DRAINING, EngineConflict, EngineSet, add_engine, drain_engine, reconcile, remove_engine, seed,
)
from services.core.replan import repair_plan
from services.errors import FailedPrecondition, InvalidArgument, Unavailable
from services.rpc import every, kv, stop_tasks
from services.store import Fenced, StaleVersion, Store

log = logging.getLogger("cacheroute.planner.engines")
CAS_ATTEMPTS = 8


@dataclass(frozen=True)
class Discovery:
    """A DNS name whose addresses are engines: `template` with "{host}" for each address."""

    name: str
    port: int
    template: str                 # e.g. "{host}:50061" or "vllm+http://{host}:8000"
    interval: float = 10.0

    @property
    def source(self) -> str:
        return f"dns:{self.name}:{self.port}"


_DISCOVER = re.compile(r"^(?:(?P<kind>[a-z]+)\+)?(?:(?P<scheme>https?)://)?(?P<host>[A-Za-z0-9._-]+):(?P<port>\d{1,5})/?$")


def parse_discovery(text: str, interval: float = 10.0) -> Discovery:
    """`[KIND+][http(s)://]NAME:PORT` -> Discovery; ValueError (one line) otherwise."""
    m = _DISCOVER.match(text.strip())
    if m is None or not 0 < int(m["port"]) < 65536:
        raise ValueError(f"--discover {text!r} is not [KIND+][http://]NAME:PORT")
    if not interval > 0:
        raise ValueError("--discover-interval must be > 0")
    prefix = (m["kind"] + "+" if m["kind"] else "") + (m["scheme"] + "://" if m["scheme"] else "")
    return Discovery(m["host"], int(m["port"]), prefix + "{host}:" + m["port"], interval)


async def resolve(name: str, port: int) -> list[str]:
    """Every address `name` resolves to (IPv6 in brackets), sorted; [] when the lookup fails."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        log.warning("engine discovery lookup failed", extra=kv(name=name, error=str(exc)))
        return []
    hosts = {info[4][0] for info in infos}
    return sorted(f"[{h}]" if ":" in h else h for h in hosts)


class EngineRegistry:
    """The stored engine set as this planner last read it (module header)."""

    def __init__(self, store: Store, *, configured: Sequence[tuple[str, str]], clock: Callable[[], float] = time.time,
                 poll: float = 0.5, on_change: Callable[[EngineSet], Awaitable[None]] | None = None) -> None:
        self.store = store
        self.configured = tuple(configured)
        self.clock = clock
        self.poll = poll
        self.on_change = on_change
        self.current = EngineSet()        # version 0 until the store answers
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._waiters: list[asyncio.Future] = []     # wait_change callers, woken by the next adoption

    def placeable_ids(self) -> tuple[str, ...]:
        """The active engines' ids; the configured ones until the store has answered once."""
        if not self.current.version:
            return tuple(rid for rid, _ in self.configured)
        return self.current.placeable_ids()

    async def start(self) -> None:
        try:
            await self.change(lambda s: seed(s, self.configured, now=self.clock()))
        except Unavailable as exc:
            log.warning("engine set not read yet", extra=kv(error=str(exc)))
        self._task = asyncio.create_task(every(self.poll, self.refresh, lambda: self._stopping),
                                         name="planner-engines")

    async def stop(self) -> None:
        self._stopping = True
        await stop_tasks([self._task])
        self._task = None
        self._wake_waiters()            # held long polls answer now, not at the end of the server's grace

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def refresh(self) -> None:
        try:
            stored = await self.store.get_engine_set()
        except (Unavailable, ValueError) as exc:
            log.warning("engine set read failed", extra=kv(error=str(exc)))
            return
        await self._adopt(stored)

    async def wait_change(self, version: int, timeout: float) -> None:
        """Return once this planner has adopted a set other than `version`, or after `timeout` s
        (ListEngines' long poll: a dispatcher holding the current set waits here, not in a loop)."""
        if self.current.version != version or self._stopping:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def _adopt(self, stored: EngineSet) -> None:
        if stored.version and stored.version != self.current.version:
            self.current = stored
            self._wake_waiters()
            log.info("engine set", extra=kv(version=stored.version, engines={e.id: e.state for e in stored.engines}))
            if self.on_change is not None:
                await self.on_change(stored)

    async def change(self, step: Callable[[EngineSet], EngineSet], *,
                     fencing_token: int | None = None) -> tuple[EngineSet, EngineSet]:
        """Apply `step` to the stored set and write it (compare-and-set, retried on a concurrent
        write); (before, after). `step` returning its input writes nothing."""
        for _ in range(CAS_ATTEMPTS):
            before = await self.store.get_engine_set()
            after = step(before)
            if after is before:
                await self._adopt(before)
                return before, after
            try:
                await self.store.put_engine_set(after, expected=before.version, fencing_token=fencing_token)
            except StaleVersion:
                continue
            await self._adopt(after)
            return before, after
        raise Unavailable("the engine set kept changing under this write; try again")


async def move_off(store: Store, engine_ids: Sequence[str], *, now: float, reason: str,
                   fencing_token: int | None = None) -> tuple[int, str]:
    """Activate the active plan without `engine_ids` (repair_plan: only their keys move);
    (active version after, a one-line outcome). Nothing to do when the plan does not name them."""
    for _ in range(3):
        state, active = await store.get_active_plan()
        if active is None:
            return 0, "no active plan"
        gone = tuple(rid for rid in engine_ids if rid in active.replica_ids)
        if not gone:
            return active.version, f"v{active.version} places no key there"
        if len(gone) == len(active.replica_ids):
            return active.version, f"v{active.version} has no other replica; the next re-plan moves the keys"
        plan = repair_plan(active, gone, version=await store.next_version(), created_at=now)
        plan = dataclasses.replace(plan, builder="drain", extra={**plan.extra, "drained": sorted(gone)})
        await store.put_plan(plan)
        try:
            await store.activate(plan.version, expected=active.version, now=now, fencing_token=fencing_token,
                                 reason=f"{reason}: {', '.join(gone)}; churn {plan.churn or 0.0:.3f}", automatic=False)
        except StaleVersion:
            continue                               # a concurrent activation: repair the new one
        except Fenced:
            return active.version, f"refused: deposed, v{plan.version} not activated"
        except FailedPrecondition as exc:
            return active.version, f"refused: v{plan.version} not activated, {exc}"
        moved = sum(1 for members in active.table.values() if any(active.replica_ids[m] in gone for m in members))
        log.info("keys moved off", extra=kv(version=plan.version, engines=gone, keys=moved, churn=plan.churn))
        return plan.version, f"v{plan.version} active: {moved} key(s) moved off {', '.join(gone)}"
    return (await store.get_control()).active_version, "refused: the active version kept changing"


class EngineControl:
    """The use cases behind the engine RPCs and discovery: change the set, then re-plan."""

    def __init__(self, registry: EngineRegistry, store: Store, *, wake: Callable[[], None],
                 clock: Callable[[], float] = time.time, default_kind: str = "cacheroute") -> None:
        self.default_kind = default_kind      # of addresses without KIND+ (services.backends)
        self.registry = registry
        self.store = store
        self.wake = wake
        self.clock = clock

    async def add(self, address: str, engine_id: str = "") -> tuple[EngineSet, str, str]:
        """(set after, the new engine's id, outcome); ValueError for an address the engine kind refuses."""
        parse_endpoint(address, self.default_kind)
        _, after = await self.registry.change(
            lambda s: add_engine(s, address, engine_id=engine_id, now=self.clock()))
        self.wake()
        new = after.engines[-1]
        return after, new.id, f"{new.id} added in slot {new.slot}; the next re-plan places its share"

    async def drain(self, ref: str) -> tuple[EngineSet, str, int, str]:
        """(set after, the engine's id, active version, outcome)."""
        _, after = await self.registry.change(lambda s: drain_engine(s, ref, now=self.clock()))
        engine = after.find(ref)
        version, outcome = await move_off(self.store, [engine.id], now=self.clock(), reason="drain")
        self.wake()
        return after, engine.id, version, outcome

    async def remove(self, ref: str, force: bool = False) -> tuple[EngineSet, str, int, str]:
        """(set after, the engine's id, active version, outcome)."""
        named: list[str] = []

        def step(s: EngineSet) -> EngineSet:
            named[:] = [s.find(ref).id]
            return remove_engine(s, ref, now=self.clock(), force=force)

        _, after = await self.registry.change(step)
        version, outcome = await move_off(self.store, named, now=self.clock(), reason="remove")
        self.wake()
        return after, named[0], version, outcome

    async def discover_once(self, discovery: Discovery, token: int | None,
                            lookup: Callable[[str, int], Awaitable[list[str]]] = resolve) -> str | None:
        """One resolution and reconciliation (module header); an outcome line when the set changed."""
        hosts = await lookup(discovery.name, discovery.port)
        addresses = [discovery.template.format(host=h) for h in hosts]
        _, active = await self.store.get_active_plan()
        named = set(active.replica_ids) if active is not None else set()
        before, after = await self.registry.change(
            lambda s: reconcile(s, discovery.source, addresses, now=self.clock(), planned=named.__contains__),
            fencing_token=token)
        if after is before:
            return None
        drained = [e.id for e in after.engines if e.state == DRAINING and (old := before.by_id(e.id)) is not None
                   and old.state != DRAINING]
        outcome = f"engine set v{after.version} from {discovery.source}: {len(hosts)} address(es)"
        if drained:
            _, moved = await move_off(self.store, drained, now=self.clock(), reason="drain (gone from DNS)",
                                      fencing_token=token)
            outcome += f"; {moved}"
        self.wake()
        log.info("engines discovered", extra=kv(source=discovery.source, hosts=hosts, outcome=outcome))
        return outcome


class DiscoveryTask:
    """Runs `discover_once` every interval while this planner holds the lease."""

    def __init__(self, control: EngineControl, discovery: Discovery, leader: Callable[[], int | None],
                 lookup: Callable[[str, int], Awaitable[list[str]]] = resolve) -> None:
        self.control = control
        self.discovery = discovery
        self.leader = leader
        self.lookup = lookup
        self.last_outcome = ""
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="planner-discovery")

    async def stop(self) -> None:
        self._stopping = True
        await stop_tasks([self._task])
        self._task = None

    async def _run(self) -> None:
        while not self._stopping:
            token = self.leader()
            if token is not None:
                try:
                    outcome = await self.control.discover_once(self.discovery, token, self.lookup)
                    if outcome:
                        self.last_outcome = outcome
                except (Unavailable, Fenced, EngineConflict, InvalidArgument) as exc:
                    log.warning("engine discovery step failed", extra=kv(error=str(exc)))
                except Exception:  # noqa: BLE001 - the task must survive a bad step
                    log.exception("engine discovery step failed")
            await asyncio.sleep(self.discovery.interval if token is not None else min(1.0, self.discovery.interval))
