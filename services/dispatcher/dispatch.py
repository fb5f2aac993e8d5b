"""One dispatch for both front doors: route -> call the backend -> retry elsewhere once ->
ejection -> accounting. The OpenAI HTTP API (services.dispatcher.http) and gRPC Generate
(services.dispatcher.servicer) both call `Dispatcher.dispatch`, so they fail the same way
(STYLE.md: SGLang's shared `RetryExecutor` and `worker.record_outcome`).

The rule, per request:
  1. `Router.route(report=False)` picks a replica (the gRPC Route decision, no telemetry yet);
     no healthy replica is the error "no_replica". A HOLD answer (the cacheroute policy's hold
     rule: the chosen replica's KV is full and no acceptable other has room) makes the request
     wait here, not on an engine that would preempt for it: it awaits the next moment a replica
     may have freed KV (a stats poll arrived or a stream closed: `Router.changed`) and is routed
     again, until it is routed or `hold_limit` seconds passed (then it goes to its pick anyway,
     so nothing waits forever; 0: never hold). The client's deadline or disconnect cancels the
     wait like any other await; a held request holds no replica's count. Metrics:
     `cacheroute_held_total`, `cacheroute_hold_seconds` (histogram), `cacheroute_held` (now).
  2. The backend is called (services.backends: `complete` for an API request, `generate`
     for Generate, whose first chunk is awaited here). The replica's open-request count and
     its prefill estimate (the prefix-aware policy's token balance) cover the call.
  3. An EngineError marked `retry` (refused, not connected in time, answered 5xx, gone or
     full before any output: nothing the engine did can have reached the client) is
     retried once on another healthy replica (`avoid`); with none left, or failing again,
     the client gets the last replica's error.
  4. Every engine failure is counted (`cacheroute_http_upstream_errors`, by replica and
     kind) and reported to the ReplicaMonitor's passive ejection (`failed`: consecutive
     failures, capped share; "unreachable"/"unavailable" eject at once); an answer resets
     the replica's count (`answered`). "invalid", "full" and "denied" are answers, not failures.
  5. A request the engine took (HTTP 200, or a first chunk) is an arrival for the planner
     (`record_arrival`, the served rule of gRPC Generate) if its caller's telemetry budget
     (`Job.caller`, the one SharedBudget) has room, asked only then: with the budget in the
     store, at the next flush, for all of the caller's arrivals since the last one in one call
     (services.dispatcher.budget `DeferredArrivals`). When the answer is complete,
     `Served.finish` records its cache usage for HTTP engines (the gRPC engine reports its
     own counters); a client that left is `client_gone` (counted by reason, never against
     the engine); a failure after output began is `Served.failed` (ejection, no retry).

The error mapping exists once, below (`ERRORS`): each EngineError kind's HTTP status,
OpenAI error type and code, and gRPC status. A front door hands `dispatch` data, not code of its
own: the Job and the backend call built here (`completing`, `generating`), so a request's call path
runs front door -> dispatch -> router -> backend and never back into the front door's module.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.http import oai
from services.backends.base import ApiCall, Backend, EngineError, Reply
from services.core.policy import NoHealthyReplica, Pick, Reason
from services.dispatcher.cachestats import CacheUsage
from services.dispatcher.router import Router
from services.errors import InvalidArgument, PermissionDenied, ResourceExhausted, ServiceError, Unavailable

REASONS = {Reason.PLANNED: "planned", Reason.COLD: "cold", Reason.FALLBACK: "fallback"}
HOLD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.5, 5.0)

# kind -> (HTTP status, OpenAI error type, OpenAI code (None: the EngineError's own), gRPC error)
ERRORS: dict[str, tuple[int, str, str | None, type[ServiceError]]] = {
    "invalid": (400, "invalid_request_error", None, InvalidArgument),
    "full": (429, "rate_limit_error", "too_many_requests", ResourceExhausted),
    "denied": (502, "upstream_error", "engine_denied", PermissionDenied),
    "timeout": (504, "timeout", "engine_timeout", Unavailable),
    "unreachable": (502, "upstream_error", "engine_unreachable", Unavailable),
    "unavailable": (502, "upstream_error", "engine_unreachable", Unavailable),
    "failed": (502, "upstream_error", "engine_error", Unavailable),
    "no_replica": (503, "service_unavailable", "no_healthy_replica", Unavailable),
}
_AT_ONCE = frozenset({"unreachable", "unavailable"})      # the engine is gone: eject without the count
_ANSWERS = frozenset({"invalid", "full", "denied", "no_replica"})


def message(error: EngineError) -> str:
    """The one-line message of an EngineError: "replica ID <detail>" ("replica ID: <detail>"
    when the detail starts with a colon; invalid: the detail alone)."""
    rid = error.replica_id
    if error.kind in ("invalid", "no_replica") or not rid:
        return error.detail or error.code
    detail = error.detail or error.code
    return f"replica {rid}{'' if detail.startswith(':') else ' '}{detail}"


def http_error(error: EngineError) -> oai.ApiError:
    """The OpenAI-shaped error a client of the HTTP API gets for `error`."""
    status, type_, code, _ = ERRORS.get(error.kind, ERRORS["failed"])
    if code is None:
        code = error.code if error.code.replace("_", "").islower() else None
    out = oai.ApiError(status, message(error), type_, code, error.param)
    out.headers = error.headers
    return out


def grpc_error(error: EngineError) -> ServiceError:
    """The services.errors exception (gRPC status, services.rpc) a Generate caller gets."""
    return ERRORS.get(error.kind, ERRORS["failed"])[3](message(error))


@dataclass(frozen=True)
class Job:
    """What routing and accounting need of one request."""

    key: str
    now: float
    prompt_tokens: int
    prefix_tokens: int = 0          # priced by the router (gRPC: the request's cacheable prefix)
    shared_tokens: int = 0          # the reusable prefix its arrival reports to the planner
    blocks: Sequence[int] = ()      # prefix block hashes (the prefix-aware policy)
    output_tokens: int = 0          # the request's output budget (max_tokens): the hold rule's KV estimate
    # whose telemetry budget its arrival draws on (services/dispatcher/budget.py: a tenant or peer
    # host), asked once the engine took the request, so refused requests draw nothing; None: unbounded
    caller: str | None = None


class Stream:
    """A Generate call whose first chunk arrived (the HTTP 200 of a gRPC stream)."""

    status = 200

    def __init__(self, first, rest: AsyncIterator) -> None:
        self.first, self.rest = first, rest

    async def close(self) -> None:
        await self.rest.aclose()


async def first_chunk(chunks: AsyncIterator) -> Stream:
    """Await the first chunk of a backend's `generate` (failures before it may be retried)."""
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        raise EngineError("failed", "empty", "sent no tokens") from None
    except BaseException:
        await chunks.aclose()
        raise
    return Stream(first, chunks)


def completing(call: ApiCall) -> Callable[[Backend], Awaitable[Reply]]:
    """The backend call of an OpenAI API request (the HTTP front door's `dispatch` argument)."""
    return lambda backend: backend.complete(call)


def generating(request, timeout: float, authorization: str | None) -> Callable[[Backend], Awaitable[Stream]]:
    """The backend call of a gRPC Generate, up to its first chunk (the servicer's `dispatch` argument)."""
    return lambda backend: first_chunk(backend.generate(request, timeout, authorization=authorization))


class Dispatcher:
    def __init__(self, router: Router, monitor, usage: CacheUsage, registry: CollectorRegistry | None = None,
                 *, hold_limit: float = 0.0, budget=None, deferred=None) -> None:
        self.router = router
        self.hold_limit = hold_limit
        self.budget = budget            # services.dispatcher.budget.SharedBudget (None: every arrival counts)
        self.deferred = deferred        # services.dispatcher.budget.DeferredArrivals: charged per flush (shared scope)
        self._freed: asyncio.Event | None = None       # set (and dropped) when a replica may have freed KV
        router.changed = self._changed
        self.held = Counter("cacheroute_held", "requests held at the dispatcher (the hold rule: KV full)",
                            registry=registry)
        self.hold_seconds = Histogram("cacheroute_hold_seconds", "time a held request waited before it was routed",
                                      buckets=HOLD_BUCKETS, registry=registry)
        self.holding = Gauge("cacheroute_held_now", "requests held at the dispatcher now", registry=registry)
        share = Gauge("cacheroute_dispatcher_share", "share of the cluster's in-flight requests this dispatcher's "
                      "record covers: its own, plus its live peers' with the record bus on (the cold-home "
                      "rule's share gate; 1 = alone or unknown)", registry=registry)
        share.set_function(lambda: router.state.share)
        self.monitor = monitor
        self.backends: list[Backend] = monitor.backends
        self.usage = usage
        self.failures = Counter("cacheroute_http_upstream_errors",
                                "engine failures seen by the dispatcher (HTTP API and gRPC Generate)",
                                ["replica", "kind"], registry=registry)
        self.client_errors = Counter("cacheroute_dispatcher_client_errors",
                                     "requests whose client left or stopped reading (never counted against an engine)",
                                     ["reason"], registry=registry)

    def headers(self, i: int, reason: int) -> dict[str, str]:
        """The decision headers of an HTTP response from replica `i`."""
        return {"x-cacheroute-replica": self.router.ids[i], "x-cacheroute-plan-version": str(self.router.plan_version),
                "x-cacheroute-reason": REASONS[reason]}

    def failure(self, i: int, error: EngineError) -> None:
        """One outcome of replica `i` that was not an answer: counted, then passive ejection."""
        error.replica_id = self.router.ids[i]
        if error.kind in _ANSWERS:
            self.monitor.answered(i)
            return
        self.failures.labels(self.router.ids[i], self.backends[i].kind).inc()
        self.monitor.failed(i, error.detail or error.code, at_once=error.kind in _AT_ONCE)

    async def dispatch(self, job: Job, call: Callable[[Backend], Awaitable]) -> "Served":
        """Route `job`, call its backend with `call`, retry once elsewhere (module header).
        Returns the Served request (close it); raises EngineError."""
        router, avoid, last = self.router, -1, None
        for attempt in range(2):
            try:
                pick = await self._route(job, avoid)
            except NoHealthyReplica:
                raise last or EngineError("no_replica", "no_healthy_replica", "no healthy replica") from None
            i = pick.replica
            router.stream_opened(i)
            router.prefill_started(i, job.prompt_tokens)
            try:
                opened = await call(self.backends[i])
            except EngineError as error:
                self._closed(i, job)
                self.failure(i, error)
                error.headers = self.headers(i, pick.reason)
                if not (error.retry and attempt == 0):
                    raise
                avoid, last = i, error
                continue
            except BaseException:
                self._closed(i, job)
                raise
            router.prefill_done(i, job.prompt_tokens)
            self.monitor.answered(i)
            if opened.status == 200:     # served: the engine took the request, so it is planner input
                await self._arrived(job, i)
            return Served(self, i, pick, opened)
        raise AssertionError("unreachable")

    async def _arrived(self, job: Job, i: int) -> None:
        """The served request's arrival, within its caller's budget: recorded now when unbounded
        or budgeted locally, else left with its caller until the next flush (`deferred`)."""
        budget, router = self.budget, self.router
        if budget is None or job.caller is None or not budget.bounded:
            router.record_arrival(job.key, job.now, job.prompt_tokens, job.shared_tokens, job.blocks, replica=i)
        elif self.deferred is not None:
            self.deferred.add(job.caller, job.key, job.now, job.prompt_tokens, job.shared_tokens, job.blocks, i)
        elif await budget.take(job.caller, 1, job.now) == 1:
            router.record_arrival(job.key, job.now, job.prompt_tokens, job.shared_tokens, job.blocks, replica=i)
        else:                            # its caller is over its telemetry budget
            router.telemetry_capped += 1

    def _pick(self, job: Job, avoid: int, hold: bool) -> Pick:
        return self.router.route(job.key, job.now, job.prompt_tokens, job.prefix_tokens, report=False, avoid=avoid,
                                 blocks=job.blocks, hold=hold, output_tokens=job.output_tokens)

    async def _route(self, job: Job, avoid: int) -> Pick:
        """A routed pick; a HOLD answer waits for a replica to free KV (module header, step 1)."""
        pick = self._pick(job, avoid, self.hold_limit > 0)
        if pick.reason != Reason.HOLD:
            return pick
        start = time.monotonic()
        deadline = start + self.hold_limit
        self.held.inc()
        self.holding.inc()
        try:
            while pick.reason == Reason.HOLD:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._pick(job, avoid, False)        # held long enough: to its pick anyway
                if self._freed is None:
                    self._freed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._freed.wait(), left)
                except asyncio.TimeoutError:
                    pass
                pick = self._pick(job, avoid, True)
            return pick
        finally:
            self.holding.dec()
            self.hold_seconds.observe(time.monotonic() - start)

    def _changed(self) -> None:
        """A replica may have freed KV: wake every held request (they route again in the order they waited)."""
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def _closed(self, i: int, job: Job) -> None:
        self.router.prefill_done(i, job.prompt_tokens)
        self.stream_closed(i)

    def stream_closed(self, i: int) -> None:
        """A stream of replica i ended: the router's count, then wake held requests (the router's
        `changed`, called from here rather than by the router, so the call path stays downward)."""
        self.router.stream_closed(i, notify=False)
        self._changed()


class Served:
    """A dispatched request whose engine answered; `close()` it when done."""

    def __init__(self, dispatcher: Dispatcher, i: int, pick, opened) -> None:
        self.dispatcher, self.replica, self.pick, self.opened = dispatcher, i, pick, opened
        self.replica_id = dispatcher.router.ids[i]
        self.backend = dispatcher.backends[i]
        self._closed = False

    @property
    def headers(self) -> dict[str, str]:
        return self.dispatcher.headers(self.replica, self.pick.reason)

    def finish(self, usage: tuple[int, int, int | None] | None) -> None:
        """The answer reached the client whole: cache telemetry of an HTTP engine's answer."""
        if self.backend.http and self.opened.status == 200:
            if usage is None:
                self.dispatcher.usage.record_missing(self.replica)
            else:
                self.dispatcher.usage.record(self.replica, *usage)

    def failed(self, error: EngineError) -> None:
        """The engine failed after output began (no retry): counted, passive ejection."""
        self.dispatcher.failure(self.replica, error)

    def client_gone(self, reason: str) -> None:
        """The client left or stopped reading: a client error, and the engine answered."""
        self.dispatcher.client_errors.labels(reason).inc()
        self.dispatcher.monitor.answered(self.replica)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.opened.close()
        finally:
            self.dispatcher.stream_closed(self.replica)
