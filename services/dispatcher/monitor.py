"""Replica health and load polling for the dispatcher.

Every `interval` seconds (default 0.25, so ~4×/s) each replica's backend is polled with a
short deadline (default 0.2 s), concurrently (services.backends: grpc health + GetStats for
the simulated engine, `GET /metrics` + `GET /health` for HTTP engines, /health at most every
--health-every seconds while /metrics answers: services.backends.http). A replica is healthy
when the poll succeeds. A refused connection, an error or NOT_SERVING / a non-2xx /health
takes it out of T(b) and P2C at once (the policy skips unhealthy replicas); a poll that only
ran out of time counts once `timeouts_to_down` (default 2) polls in a row did, because a busy
dispatcher (or machine) misses a 0.2 s deadline now and then, and marking every replica down
on one slow poll would fail requests that a healthy cluster could serve. A dead or hung
replica is still out within interval + 2 x timeout < 1 s, and back after its first good poll.
A proxied stream that fails marks its replica down immediately too (`mark_down`), optionally
with a hold: the HTTP API ejects a replica that answered 5xx or timed out for `hold` seconds
even while its /health keeps saying OK.

Passive ejection (outlier detection, after Envoy's) lives here too: `failed(i, why)` counts
one engine failure of replica i, `answered(i)` resets its count. On the `after`-th failure
in a row the replica is held out for `hold` seconds, unless `max_fraction` of the replicas
(at least one) are held out already; `at_once` (a refused connection: the engine is gone)
ejects without the count or the cap. Only engine failures may be reported: a client that
went away is not the engine's fault (issue 20).

Panic mode (after Envoy's panic threshold): health checks alone must not empty the rotation.
When no replica is both passing its polls and not ejected, and every replica not ejected
failed only softly (its poll timed out, or it answered "not healthy": a non-2xx /health,
NOT_SERVING), the monitor puts all of those back into rotation and routes over them rather
than answering 503 for everything (issue 20: a hanging /health emptied a cluster whose
completions still worked). A replica that refuses connections or errors is down for real
and ends panic mode for itself; panic mode ends as soon as one replica passes a poll.

Engines that come and go (services/core/engines.py; the plan feed's EngineFeed follows the
set): `add` opens a new slot's backend and polls it (it is out of rotation until the router
has re-indexed the plan for it, `open_slot`); `close_slot` keeps a slot out of rotation
whatever its polls say (a draining engine whose keys have left the plan); `retire` closes a
removed engine's slot for good and stops polling it. Closed slots never count towards panic
mode.

Load of an HTTP engine without load gauges (kind `openai`, or a /metrics page without the
kind's names) is the dispatcher's own count of requests it has open there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from services.backends import Backend, BackendDown, EngineStats, make_backend
from services.dispatcher.router import Router
from services.model import Replica
from services.rpc import TLSFiles, every, kv, stop_tasks

log = logging.getLogger("cacheroute.dispatcher.monitor")


@dataclass(frozen=True)
class Ejection:
    after: int = 3                # consecutive failures before a replica is ejected
    max_fraction: float = 0.5     # cap on the share of replicas held out by passive ejection
    hold: float = 5.0             # seconds an ejected replica stays out even if /health says OK


class ReplicaMonitor:
    def __init__(self, router: Router, *, interval: float = 0.25, timeout: float = 0.2,
                 tls: TLSFiles | None = None, timeouts_to_down: int = 2,
                 backends: Sequence[Backend] | None = None, default_kind: str = "cacheroute",
                 on_stats: Callable[[int, EngineStats], None] | None = None) -> None:
        self.router = router
        self.interval = interval
        self.timeout = timeout
        self.timeouts_to_down = timeouts_to_down
        self.on_stats = on_stats
        # engines added at run time: the factory the configured backends came from (keys, deadlines),
        # and a hook for per-replica state kept outside the router (cache usage)
        self.backend_factory: Callable[[str, str], Backend] | None = None
        self.on_added: Callable[[int, Replica], None] | None = None
        self._timeouts = [0] * len(router.replicas)
        self._held_until = [0.0] * len(router.replicas)
        self._failures = [0] * len(router.replicas)   # consecutive engine failures (passive ejection)
        self.ejection = Ejection()
        self._polled = [""] * len(router.replicas)    # last poll: "ok", "soft" (timeout / not healthy), "hard"
        self.panic = False
        self.backends: list[Backend] = list(backends) if backends is not None else [
            make_backend(r.id, r.address, default_kind, tls=tls) for r in router.replicas]
        self.engines: list = []           # gRPC Engine stubs by replica index (None: an HTTP engine)
        self.closed: set[int] = set()     # slots out of rotation whatever their polls say
        self.retired: set[int] = set()    # removed engines: closed for good, never polled
        self._tls = tls
        self._default_kind = default_kind
        self._task: asyncio.Task | None = None

    def open(self) -> None:
        for backend in self.backends:
            opener = getattr(backend, "open_sync", None)
            if opener is not None:
                opener()
        self.engines = [getattr(b, "engine", None) for b in self.backends]

    async def start(self) -> None:
        self.open()
        for backend in self.backends:
            await backend.open()
        await self.poll_once()
        self._task = asyncio.get_running_loop().create_task(every(self.interval, self.poll_once),
                                                            name="replica-monitor")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        for i, backend in enumerate(self.backends):
            if i not in self.retired:
                await backend.close()

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(i) for i in range(len(self.backends)) if i not in self.retired))

    # ---- engines that come and go (module header)

    async def add(self, replica: Replica) -> int:
        """A new slot for `replica` at the end, closed until `open_slot`; its index."""
        backend = (self.backend_factory(replica.id, replica.address) if self.backend_factory is not None
                   else make_backend(replica.id, replica.address, self._default_kind, tls=self._tls))
        opener = getattr(backend, "open_sync", None)
        if opener is not None:
            opener()
        await backend.open()
        i = self.router.add_replica(replica)       # no await since the backend opened: one step
        self.backends.append(backend)
        self.engines.append(getattr(backend, "engine", None))
        for column, value in ((self._timeouts, 0), (self._held_until, 0.0), (self._failures, 0), (self._polled, "")):
            column.append(value)
        self.closed.add(i)
        if self.on_added is not None:
            self.on_added(i, replica)
        await self._poll(i)
        return i

    def open_slot(self, i: int) -> None:
        """Slot `i` may route again (healthy from its next good poll)."""
        if i not in self.retired:
            self.closed.discard(i)

    def close_slot(self, i: int, why: str) -> None:
        self.closed.add(i)
        self._set(i, False, why)

    async def retire(self, i: int) -> None:
        if i in self.retired:
            return
        self.retired.add(i)
        self.close_slot(i, "removed from the engine set")
        await self.backends[i].close()

    async def _poll(self, i: int) -> None:
        router = self.router
        marker = router.poll_sent(i)
        try:
            stats = await self.backends[i].poll(self.timeout)
        except BackendDown as down:
            if down.timeout:
                self._timeouts[i] += 1
                if self._timeouts[i] < self.timeouts_to_down:
                    return  # one slow poll: keep the replica's last state
            self._polled[i] = "soft" if down.timeout or down.answered else "hard"
            if not self._settle_panic():
                self._set(i, False, str(down))
            return
        self._timeouts[i] = 0
        if stats.has_load:
            router.stats_received(i, marker, stats.waiting, stats.running, stats.kv_usage, stats)
        else:
            router.stats_received(i, marker, 0, router.outstanding[i], stats.kv_usage, stats)
            router.recent[i] = 0          # open requests are counted in full already
            router.state.in_flight[i] = router.outstanding[i]
        if stats.has_counters and self.on_stats is not None:
            self.on_stats(i, stats)
        self._polled[i] = "ok"
        if time.monotonic() < self._held_until[i]:
            return
        self._set(i, True, "OK")
        self._settle_panic()

    def _settle_panic(self) -> bool:
        """Enter or leave panic mode (module header) after a poll result; True while in it."""
        now = time.monotonic()
        free = [j for j, until in enumerate(self._held_until) if until <= now and j not in self.closed]
        panic = bool(free) and all(self._polled[j] == "soft" for j in free)
        if panic:
            for j in free:
                self._set(j, True, "panic: health checks would empty the rotation")
        elif self.panic:
            for j in free:
                if self._polled[j] != "ok":
                    self._set(j, False, "panic over")
        if panic != self.panic:
            self.panic = panic
            log.log(logging.WARNING if panic else logging.INFO, "panic mode %s", "on" if panic else "off",
                    extra=kv(replicas=len(free)))
        return panic

    def ejected(self) -> int:
        """Replicas held out of rotation by `mark_down(..., hold)` right now."""
        now = time.monotonic()
        return sum(1 for until in self._held_until if until > now)

    def failed(self, i: int, why: str, *, at_once: bool = False) -> bool:
        """One engine failure of replica `i` (module header); True if it was ejected now."""
        rule = self.ejection
        self._failures[i] += 1
        if not at_once:
            if self._failures[i] < rule.after:
                return False
            if self.ejected() >= max(1, int(len(self._failures) * rule.max_fraction)):
                return False
        self._failures[i] = 0
        self.mark_down(i, why if at_once else f"{why} ({rule.after} failures in a row)", hold=rule.hold)
        return True

    def answered(self, i: int) -> None:
        """Replica `i` answered (below 500): its run of failures ends."""
        self._failures[i] = 0

    def mark_down(self, i: int, why: str, hold: float = 0.0) -> None:
        self._polled[i] = "hard" if not hold else self._polled[i]
        if hold > 0:
            self._held_until[i] = max(self._held_until[i], time.monotonic() + hold)
        self._set(i, False, why)

    def _set(self, i: int, healthy: bool, why: str) -> None:
        if healthy and i in self.closed:
            return
        if self.router.set_healthy(i, healthy):
            replica = self.router.replicas[i]
            log.log(logging.INFO if healthy else logging.WARNING, "replica %s", "up" if healthy else "down",
                    extra=kv(replica=replica.id, address=replica.address, reason=why))
