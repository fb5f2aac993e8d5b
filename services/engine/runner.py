"""Runs the engine model (services.core.engine) in real time for the live replica service.

One asyncio task drives `EngineModel.step(now)` back to back and sleeps `duration ×
time_scale` per step, then hands each request its tokens. Model time is a virtual clock
that advances by exactly each step's duration, so TTFTs are the model's and do not
depend on event-loop wake-up jitter:

- while a step runs, a new request's arrival is the wall clock mapped into model time
  (relative to the step's start), clamped into the step; it joins the model at the next
  step start (as in vLLM, a request cannot enter a batch that is already running);
- when the engine is idle the clock jumps to the first arrival, so an idle replica's TTFT
  is exactly the prefill step's duration.

TTFT = (end of the step that finished the prefill) − arrival, in model seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import deque
from dataclasses import dataclass

from services.core.engine import EngineModel, StepResult
from services.core.request import Request
from services.errors import ResourceExhausted
from services.rpc import stop_tasks

# vLLM's vllm:time_to_first_token_seconds buckets (upper bounds, seconds; +Inf implied)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


@dataclass(slots=True)
class TokenEvent:
    """One emitted token of one request."""

    index: int
    ttft: float | None = None       # first token only
    cached: int | None = None       # first token only
    finished: bool = False


class Ticket:
    """A submitted request's view of the engine: its token events, in order."""

    __slots__ = ("rid", "request", "arrival", "events", "emitted", "done")

    def __init__(self, rid: int, request: Request, arrival: float) -> None:
        self.rid = rid
        self.request = request
        self.arrival = arrival
        self.events: asyncio.Queue[TokenEvent] = asyncio.Queue()   # bounded by max_tokens
        self.emitted = 0
        self.done = False


class EngineRunner:
    def __init__(self, model: EngineModel, *, time_scale: float = 1.0, max_requests: int = 4096) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.model = model
        self.time_scale = time_scale
        self.max_requests = max_requests
        self._rids = itertools.count(1)
        self._tickets: dict[int, Ticket] = {}
        self._pending: deque[Ticket] = deque()     # arrived, not yet handed to the model
        self._now = 0.0                            # model clock
        self._anchor = (0.0, 0.0)                  # (model time, loop time) of the last step start / idle start
        self._step_end: float | None = None        # model time the running step ends, None when idle
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)   # per bucket (not cumulative), last: +Inf
        self.ttft_sum = 0.0                                  # model seconds

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._anchor = (self._now, loop.time())
        self._task = loop.create_task(self._drive(), name="engine-driver")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None

    # ------------------------------------------------------------ requests

    @property
    def in_flight(self) -> int:
        return len(self._tickets)

    @property
    def pending(self) -> int:
        """Arrived requests not yet handed to the model (they join at the next step start)."""
        return len(self._pending)

    def submit(self, prompt_tokens: int, blocks: tuple[int, ...], max_tokens: int, key: str = "") -> Ticket:
        """Queue a request now; its events arrive on `ticket.events`. ValueError if it cannot fit."""
        if len(self._tickets) >= self.max_requests:
            raise ResourceExhausted(f"engine has {self.max_requests} requests in flight")
        rid = next(self._rids)
        arrival = self._arrival_now()
        request = Request(rid, arrival, key, prompt_tokens, max_tokens, blocks)
        if -(-(prompt_tokens + max_tokens) // 16) > self.model.kv_blocks:
            raise ValueError(f"prompt_tokens + max_tokens = {prompt_tokens + max_tokens} exceed the KV pool "
                             f"({self.model.kv_blocks} blocks of 16 tokens)")
        ticket = Ticket(rid, request, arrival)
        self._tickets[rid] = ticket
        self._pending.append(ticket)
        self._wake.set()
        return ticket

    def release(self, ticket: Ticket) -> None:
        """The caller is done with `ticket`: abort it in the model if it has not finished."""
        if self._tickets.pop(ticket.rid, None) is None:
            return
        if not ticket.done:
            try:
                self._pending.remove(ticket)
            except ValueError:
                self.model.abort(ticket.rid)

    # ------------------------------------------------------------ the driver

    def _arrival_now(self) -> float:
        model_t, loop_t = self._anchor
        t = model_t + (asyncio.get_running_loop().time() - loop_t) / self.time_scale
        if self._step_end is not None:
            t = min(max(t, model_t), self._step_end)
        return max(t, self._now)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        model = self.model
        while True:
            if model.idle and not self._pending:
                self._step_end = None
                self._anchor = (self._now, loop.time())
                self._wake.clear()
                await self._wake.wait()
            if model.idle:
                self._now = max(self._now, self._pending[0].arrival)
            while self._pending and self._pending[0].arrival <= self._now:
                ticket = self._pending.popleft()
                model.add(ticket.request, ticket.arrival)
            result = model.step(self._now)
            if result is None:
                continue
            start = self._now
            self._anchor = (start, loop.time())
            self._step_end = start + result.duration
            await asyncio.sleep(result.duration * self.time_scale)
            self._now = start + result.duration
            self._deliver(result, self._now)

    def _deliver(self, result: StepResult, end: float) -> None:
        tickets = self._tickets
        firsts = dict(result.first_tokens)
        finished = set(result.finished)
        for rid in result.decoded:
            ticket = tickets.get(rid)
            if ticket is None:
                continue   # released (client gone) while the step ran
            event = TokenEvent(ticket.emitted)
            cached = firsts.get(rid)
            if cached is not None:
                event.ttft = end - ticket.arrival
                event.cached = cached
                self.ttft_counts[bisect.bisect_left(TTFT_BUCKETS, event.ttft)] += 1
                self.ttft_sum += event.ttft
            if rid in finished:
                event.finished = True
                ticket.done = True
            ticket.emitted += 1
            ticket.events.put_nowait(event)
