"""Live failure repair: the planner's own health view of the replicas, and plan repair.

Health. Every `interval` (default 0.5 s) the planner health-checks each configured replica
through the same backend the dispatchers use (services.backends: grpc health for the simulated
engine, `GET /health` for vLLM, SGLang, llama.cpp and other HTTP engines; `KIND+URL` addresses
or `default_kind`) with a short deadline (`timeout`, default 0.3 s). A replica is down from its first
failed check until its next good one. Dispatchers already drop an unhealthy replica within a
second on their own; the plan is what keeps naming it.

Repair. When the lease holder sees a replica of the active plan down for longer than `grace`
(default 2 s: a restart or a slow check should not churn the plan), it writes a repaired version
with `services.core.replan.repair_plan` (builder "repair": only the keys that lost a replica get
new ones among the survivors, the churn is recorded on the plan) and activates it with a
compare-and-set on the version it repaired, fenced by its lease token. Refusals (pinned, flat
mode, a concurrent activation) are logged and retried on the next tick.

Return. The control loop builds its candidates over the replicas this view calls healthy, so a
dead replica never comes back through a regular re-plan; when it is healthy again the next
loop's incremental candidate includes it (the switching rule switches on a changed replica set)
and its move bound (`LoopConfig.max_moves`) hands it at most that many key shares per loop, so
it warms up over a few loops instead of taking a full share at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Mapping

from services.backends import BackendDown, make_backend
from services.core.replan import repair_plan
from services.errors import FailedPrecondition, Unavailable
from services.model import Mode
from services.rpc import TLSFiles, every, kv, stop_tasks
from services.store import Fenced, Store

log = logging.getLogger("cacheroute.planner.repair")


class ReplicaHealth:
    """Polls the replicas; `down_for(now)` says for how long each one has been down."""

    def __init__(self, addresses: Mapping[str, str], *, interval: float = 0.5, timeout: float = 0.3,
                 tls: TLSFiles | None = None, on_change: Callable[[str, bool], None] = lambda rid, ok: None,
                 default_kind: str = "cacheroute") -> None:
        self.addresses = dict(addresses)
        self.interval = interval
        self.timeout = timeout
        self.on_change = on_change
        self._tls = tls
        self._default_kind = default_kind
        self._backends: dict = {}
        self._down_since: dict[str, float] = {}       # monotonic time of the first failed check
        self._task: asyncio.Task | None = None
        self._stopping = False

    def open(self) -> None:
        for rid, address in self.addresses.items():
            self._backends[rid] = make_backend(rid, address, self._default_kind, tls=self._tls)

    async def start(self) -> None:
        self.open()
        await self.poll_once()
        self._task = asyncio.create_task(every(self.interval, self.poll_once, lambda: self._stopping),
                                         name="planner-health")

    async def stop(self) -> None:
        self._stopping = True
        await stop_tasks([self._task])
        self._task = None
        for backend in self._backends.values():
            await backend.close()
        self._backends.clear()

    async def set_addresses(self, addresses: Mapping[str, str]) -> None:
        """Follow the engine set (services/planner/engines.py): check new replicas at once, forget
        removed ones (and those whose address changed, which are checked anew)."""
        new = dict(addresses)
        for rid in [r for r in self._backends if new.get(r) != self.addresses.get(r)]:
            backend = self._backends.pop(rid)
            self._down_since.pop(rid, None)
            await backend.close()
        self.addresses = new
        added = [rid for rid in new if rid not in self._backends]
        for rid in added:
            self._backends[rid] = make_backend(rid, new[rid], self._default_kind, tls=self._tls)
        await asyncio.gather(*(self._check(rid) for rid in added))

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._check(rid) for rid in list(self._backends)))

    async def _check(self, rid: str) -> None:
        backend = self._backends.get(rid)
        if backend is None:
            return
        try:
            await backend.check(self.timeout)
            ok = True
        except BackendDown:
            ok = False
        if self._backends.get(rid) is not backend:
            return                        # removed (or replaced) while it was being checked
        was_down = rid in self._down_since
        if ok and was_down:
            del self._down_since[rid]
        elif not ok and not was_down:
            self._down_since[rid] = time.monotonic()
        if ok == was_down:
            log.log(logging.INFO if ok else logging.WARNING, "replica %s", "up" if ok else "down",
                    extra=kv(replica=rid, address=self.addresses[rid]))
            self.on_change(rid, ok)

    def down_for(self) -> dict[str, float]:
        """Replica id -> seconds it has been down (only replicas that are down)."""
        now = time.monotonic()
        return {rid: now - since for rid, since in self._down_since.items()}

    def usable(self, replica_ids: tuple[str, ...], grace: float) -> tuple[str, ...]:
        """`replica_ids` without those down for `grace` seconds or more (all of them if every one is):
        the set the control loop plans over."""
        down = {rid for rid, seconds in self.down_for().items() if seconds >= grace}
        alive = tuple(rid for rid in replica_ids if rid not in down)
        return alive or replica_ids


async def repair_once(store: Store, health: ReplicaHealth, *, grace: float, token: int | None, now: float,
                      attempted: set[tuple[int, tuple[str, ...]]] | None = None) -> str | None:
    """Repair the active plan if a replica of it has been down longer than `grace`; an outcome
    line when something was attempted, None when there was nothing to do. Flat mode and a pinned
    version are left alone (the store would refuse the activation), and each (active version,
    dead set) is attempted once, so a refusal does not write a new version every tick."""
    dead = sorted(rid for rid, seconds in health.down_for().items() if seconds >= grace)
    if not dead:
        return None
    state, active = await store.get_active_plan()
    if active is None or state.mode == Mode.FLAT or state.pinned_version:
        return None
    gone = tuple(rid for rid in dead if rid in active.replica_ids)
    if not gone or len(gone) == len(active.replica_ids):
        return None
    if attempted is not None:
        if (active.version, gone) in attempted:
            return None
        attempted.add((active.version, gone))
    plan = repair_plan(active, gone, version=await store.next_version(), created_at=now)
    await store.put_plan(plan)
    reason = f"repair: replica(s) {', '.join(gone)} down for >= {grace:g}s; churn {plan.churn or 0.0:.3f}"
    try:
        await store.activate(plan.version, expected=active.version, now=now, reason=reason, fencing_token=token,
                             automatic=True)
    except Fenced:
        return f"refused: deposed, repair v{plan.version} not activated"
    except FailedPrecondition as exc:
        return f"refused: repair v{plan.version} not activated, {exc}"
    log.warning("plan repaired", extra=kv(version=plan.version, repaired=active.version, dead=gone, churn=plan.churn,
                                          admitted=plan.admitted_keys))
    return f"repaired: v{plan.version} active, {reason}"


class Repairer:
    """The repair task: checks after every health poll while this planner holds the lease."""

    def __init__(self, store: Store, health: ReplicaHealth, *, grace: float, leader: Callable[[], int | None],
                 clock: Callable[[], float] = time.time, on_repair: Callable[[str], None] = lambda outcome: None) -> None:
        self.store = store
        self.health = health
        self.grace = grace
        self.leader = leader           # the lease token while leading, else None
        self.clock = clock
        self.on_repair = on_repair
        self.last_outcome = ""
        self._attempted: set[tuple[int, tuple[str, ...]]] = set()
        self._task: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="planner-repair")

    async def stop(self) -> None:
        self._stopping = True
        await stop_tasks([self._task])
        self._task = None

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.health.interval)
            token = self.leader()
            if token is None:
                continue
            try:
                outcome = await repair_once(self.store, self.health, grace=self.grace, token=token, now=self.clock(),
                                            attempted=self._attempted)
            except Unavailable as exc:
                log.warning("repair step failed", extra=kv(error=str(exc)))
                continue
            except Exception:  # noqa: BLE001 - the task must survive a bad step
                log.exception("repair step failed")
                continue
            if outcome is not None:
                self.last_outcome = outcome
                self.on_repair(outcome)
