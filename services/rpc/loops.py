"""Background-loop helpers: retry backoff, a fixed-period loop, bounded task shutdown, and the
choice of event loop (`use_uvloop`)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Awaitable, Callable, Iterable

from services.rpc.logs import kv

log = logging.getLogger("cacheroute.rpc")


def use_uvloop(enabled: bool) -> bool:
    """Run this process's asyncio loops on uvloop (libuv) when `enabled`; whether they will.

    Chosen for the dispatcher's request path: bench/dispatcher_cpu.py measured less CPU per
    relayed request on it (docs/benchmarks.md), and grpc.aio serves on it
    (tests/integration/test_dispatcher_uvloop.py). Without the package the default loop is
    kept and a warning logged. Call it before `asyncio.run`."""
    if not enabled:
        asyncio.set_event_loop_policy(None)
        return False
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed: the default asyncio loop")
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class Backoff:
    """Retry delays: `initial`, doubling after each failure, capped at `maximum`; `reset()` after
    a success. With `rng` each delay d is drawn uniformly from [d/2, d], so peers that failed
    together do not retry in lockstep."""

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        if not 0 < initial <= maximum:
            raise ValueError("Backoff needs 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self._rng = rng
        self._next = initial

    def reset(self) -> None:
        self._next = self.initial

    def __iter__(self) -> "Backoff":
        return self

    def __next__(self) -> float:
        delay, self._next = self._next, min(self.maximum, self._next * 2)
        return self._rng.uniform(delay / 2, delay) if self._rng else delay


async def every(interval: float, step: Callable[[], Awaitable[object]],
                stopping: Callable[[], bool] = lambda: False) -> None:
    """Await `step()` every `interval` seconds, start to start (a slow step delays the next one,
    never overlaps it), the first one `interval` from now; until cancelled or `stopping()`."""
    loop = asyncio.get_running_loop()
    due = loop.time() + interval
    while not stopping():
        await asyncio.sleep(max(0.0, due - loop.time()))
        due = loop.time() + interval
        await step()


async def stop_tasks(tasks: Iterable[asyncio.Task | None], timeout: float = 2.0) -> None:
    """Cancel background tasks (None entries are skipped) and wait a bounded time. Loops that
    call Redis also check a stop flag: on Python 3.11 a cancel that coincides with an
    asyncio.timeout expiring (redis-py reads) can be swallowed, and stop must not hang on that.
    A task that had died of an exception is logged (nobody else would see it)."""
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    if not live:
        return
    done, pending = await asyncio.wait(live, timeout=timeout)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task had failed", extra=kv(task=task.get_name()), exc_info=task.exception())
    if pending:
        log.warning("background tasks did not stop in time", extra=kv(tasks=[t.get_name() for t in pending]))
