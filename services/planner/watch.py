"""Fan-out of control-state changes to WatchPlans streams.

One background task per planner follows the store's pub/sub channel and, as a safety net
against lost messages (pub/sub is fire-and-forget), re-reads the control state every
`poll_seconds`. Whenever the active version or the mode differs from what it last saw, it
pushes (state, event) to every listener. Listener queues are small and keep the newest
updates: a watcher only needs the latest state, so a slow one cannot hold memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from services.errors import Unavailable
from services.model import ControlState
from services.rpc import Backoff, kv, stop_tasks
from services.store import Store

log = logging.getLogger("cacheroute.planner")


class WatchHub:
    def __init__(self, store: Store, *, poll_seconds: float = 0.5, queue_size: int = 8) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self.queue_size = queue_size
        self.state: ControlState | None = None
        self._listeners: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.on_state = lambda state: None       # metrics hook

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="planner-watch")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.queue_size)
        self._listeners.add(queue)
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    def _push(self, state: ControlState, event: str) -> None:
        for queue in self._listeners:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait((state, event))

    async def _run(self) -> None:
        backoff = Backoff(self.poll_seconds, max(self.poll_seconds, 5.0))
        while not self._stopping:
            try:
                async with self.store.subscribe() as sub:
                    await self.refresh(None)
                    backoff.reset()
                    while not self._stopping:
                        event = await sub.get(timeout=self.poll_seconds)
                        await self.refresh(event.event if event else None)
            except Unavailable as exc:
                log.warning("watch: store unavailable", extra=kv(error=str(exc)))
                await asyncio.sleep(next(backoff))

    async def refresh(self, event: str | None) -> None:
        """Re-read the control state; push it if the active version or mode changed."""
        state = await self.store.get_control()
        old, self.state = self.state, state
        self.on_state(state)
        if old is None or (old.active_version, old.mode) == (state.active_version, state.mode):
            return
        if event is None:  # found by polling: name it from what changed
            event = "mode" if old.mode != state.mode else await self._last_event()
        self._push(state, event)

    async def _last_event(self) -> str:
        latest = await self.store.history(1)
        return latest[0].event if latest else "activate"
