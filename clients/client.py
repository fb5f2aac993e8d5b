"""Typed Python clients for CacheRoute: routing (dispatchers), plans and control (planner).

`CacheRouteClient` is synchronous, `AsyncCacheRouteClient` the asyncio twin; both take the
same arguments and return the generated protobuf messages (typed through the committed
`.pyi` stubs).

- Deadlines: every call carries one (`timeout`, default 2 s; `generate` and `watch_plans`
  take their own, default none for watching).
- Failover: several dispatcher (and planner) addresses may be given. A call that fails
  with UNAVAILABLE moves to the next address; once every address has failed in a round
  it backs off (exponential with jitter) and tries again, up to `retries` rounds. The
  address that answered last is tried first next time.
- Only idempotent calls are retried: Route, RouteBatch, status and plan reads, SetMode,
  PinPlan, UnpinPlan. BuildPlan, ActivatePlan and Rollback (compare-and-set) fail at once,
  since a lost reply may hide a success. Generate moves to another dispatcher only before
  the first chunk arrives; a stream that breaks later raises.
- Control RPCs carry `authorization: Bearer <token>` when a token is given; data-plane
  calls (Route, RouteBatch, Generate) carry `api_key` when given, else the token (a
  dispatcher with keys or a deployment token refuses calls without one).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, Sequence

import grpc

from cacheroute.v1 import (
    common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2, planner_pb2, planner_pb2_grpc,
)
from services.wire.planwire import SliceAssembler
from services.rpc import TLSFiles, channel_options

DEFAULT_TIMEOUT = 2.0
MODES = {"planned": common_pb2.MODE_PLANNED, "flat": common_pb2.MODE_FLAT}


class NoAddress(ValueError):
    """The client was asked for a service it has no address for."""


def _addresses(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(a.strip() for a in items if a.strip())


def route_request(key: str | None = None, *, prefix: Sequence[int] | None = None, prompt: str | None = None,
                  prompt_tokens: int = 0, request_id: str = "") -> dispatcher_pb2.RouteRequest:
    """A RouteRequest from exactly one key source: an explicit key, prefix block hashes, or prompt text."""
    given = sum(x is not None for x in (key, prefix, prompt))
    if given != 1:
        raise ValueError("give exactly one of key, prefix or prompt")
    req = dispatcher_pb2.RouteRequest(prompt_tokens=prompt_tokens, request_id=request_id)
    if key is not None:
        req.key = key
    elif prefix is not None:
        req.prefix.block_hashes.extend(prefix)
    else:
        req.prompt = prompt  # type: ignore[assignment]
    return req


def generate_request(prompt: str | None = None, *, blocks: Sequence[int] | None = None, prompt_tokens: int = 0,
                     max_tokens: int = 16, key: str = "", request_id: str = "") -> engine_pb2.GenerateRequest:
    """A GenerateRequest from prompt text, or from chained block hashes plus the prompt's token count."""
    if (prompt is None) == (blocks is None):
        raise ValueError("give exactly one of prompt or blocks")
    req = engine_pb2.GenerateRequest(max_tokens=max_tokens, key=key, request_id=request_id)
    if prompt is not None:
        req.prompt = prompt
    else:
        req.blocks.block_hashes.extend(blocks or ())
        req.blocks.prompt_tokens = prompt_tokens
    return req


def _complete(update: planner_pb2.PlanUpdate, slices: SliceAssembler) -> bool:
    """Fold a WatchPlans chunk in; True when `update` now holds a whole update."""
    if not update.active_version:
        return True
    whole = slices.add(update.plan)
    if whole is None:
        return False
    update.plan.CopyFrom(whole)
    return True


STREAM_BUDGET = 4 * 1024 * 1024 - 4096   # bytes of one BuildPlanStream message (under a default planner's limit)


def build_requests(rates: Sequence[planner_pb2.KeyRate] | Mapping[str, float], budget: int = STREAM_BUDGET,
                   **fields: Any) -> list[planner_pb2.BuildPlanRequest]:
    """BuildPlan's request, or, when its rates would exceed `budget` bytes, the messages of a
    BuildPlanStream: the first with every field and the first slice of rates, then slices of
    rates alone (each within `budget`, by an upper bound of each KeyRate's size)."""
    if isinstance(rates, Mapping):
        rows = [planner_pb2.KeyRate(key=k, rate=v) for k, v in rates.items()]
        sizes = [len(k.encode("utf-8")) + 24 for k in rates]
    else:
        rows = list(rates)
        sizes = [r.ByteSize() + 6 for r in rows]
    head = planner_pb2.BuildPlanRequest(**fields)
    out, start, used = [], 0, head.ByteSize()
    for i, size in enumerate(sizes):
        if used + size > budget and i > start:
            out.append(rows[start:i])
            start, used = i, 0
        used += size
    out.append(rows[start:])
    head.rates.extend(out[0])
    return [head] + [planner_pb2.BuildPlanRequest(rates=part) for part in out[1:]]


def _mode(mode: str | int) -> int:
    if isinstance(mode, str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        return MODES[mode]
    return mode


@dataclass(frozen=True)
class RetryPolicy:
    """Rounds over all addresses, with exponential backoff and full jitter between rounds."""

    rounds: int = 3
    backoff: float = 0.05
    max_backoff: float = 1.0

    def delay(self, round_no: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_backoff, self.backoff * (2 ** round_no)))


def _retryable(err: grpc.RpcError) -> bool:
    return isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


class _Endpoints:
    """Addresses of one service, the one to try first, and a stub factory per address."""

    def __init__(self, service: str, addresses: tuple[str, ...], make_channel: Callable[[str], Any],
                 make_stub: Callable[[Any], Any]) -> None:
        self.service = service
        self.addresses = addresses
        self.first = 0
        self._make_channel = make_channel
        self._make_stub = make_stub
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}

    def order(self) -> list[str]:
        if not self.addresses:
            raise NoAddress(f"no {self.service} address configured")
        n = len(self.addresses)
        return [self.addresses[(self.first + i) % n] for i in range(n)]

    def stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._make_channel(address)
            self._channels[address] = channel
            stub = self._stubs[address] = self._make_stub(channel)
        return stub

    def succeeded(self, address: str) -> None:
        self.first = self.addresses.index(address)

    def channels(self) -> list[Any]:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        return channels


class _Base:
    def __init__(self, dispatchers: str | Sequence[str] | None = None, *, planner: str | Sequence[str] | None = None,
                 token: str | None = None, timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy = RetryPolicy(),
                 tls: TLSFiles | None = None, max_message_bytes: int = 8 * 1024 * 1024, seed: int | None = None,
                 api_key: str | None = None) -> None:
        self.timeout = timeout
        self.retry = retry
        self._token = token
        self._api_key = api_key
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._rng = random.Random(seed)
        self._dispatchers = _Endpoints("dispatcher", _addresses(dispatchers), self._channel,
                                       dispatcher_pb2_grpc.DispatcherStub)
        self._planners = _Endpoints("planner", _addresses(planner), self._channel, planner_pb2_grpc.PlannerStub)

    def _channel(self, address: str) -> Any:
        raise NotImplementedError

    def _auth(self) -> list[tuple[str, str]] | None:
        return [("authorization", f"Bearer {self._token}")] if self._token else None

    def _data_auth(self) -> list[tuple[str, str]] | None:
        key = self._api_key or self._token
        return [("authorization", f"Bearer {key}")] if key else None


class CacheRouteClient(_Base):
    """Synchronous client. Use as a context manager or call `close()`.

    >>> with CacheRouteClient(["127.0.0.1:50053", "127.0.0.1:50054"], planner="127.0.0.1:50051") as c:
    ...     c.route("tenant-42").replica_id
    """

    def _channel(self, address: str) -> grpc.Channel:
        creds = self._tls.channel_credentials() if self._tls else None
        opts = channel_options(self._max_message_bytes)
        return grpc.secure_channel(address, creds, opts) if creds else grpc.insecure_channel(address, opts)

    def close(self) -> None:
        for endpoints in (self._dispatchers, self._planners):
            for channel in endpoints.channels():
                channel.close()

    def __enter__(self) -> "CacheRouteClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, endpoints: _Endpoints, method: str, request: Any, *, idempotent: bool,
              timeout: float | None = None, metadata: list[tuple[str, str]] | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        rounds = self.retry.rounds if idempotent else 1
        last: grpc.RpcError | None = None
        for round_no in range(rounds):
            if round_no:
                time.sleep(self.retry.delay(round_no - 1, self._rng))
            for address in endpoints.order():
                try:
                    reply = getattr(endpoints.stub(address), method)(request, timeout=timeout, metadata=metadata)
                except grpc.RpcError as err:
                    if not _retryable(err) or not idempotent:
                        raise
                    last = err
                    continue
                endpoints.succeeded(address)
                return reply
        assert last is not None
        raise last

    # ------------------------------------------------------------ dispatcher

    def route(self, key: str | None = None, *, prefix: Sequence[int] | None = None, prompt: str | None = None,
              prompt_tokens: int = 0, request_id: str = "", timeout: float | None = None) -> common_pb2.RouteDecision:
        """Where one request should go. Give exactly one of key, prefix (block hashes) or prompt."""
        req = route_request(key, prefix=prefix, prompt=prompt, prompt_tokens=prompt_tokens, request_id=request_id)
        return self._call(self._dispatchers, "Route", req, idempotent=True, timeout=timeout,
                                metadata=self._data_auth())

    def route_batch(self, requests: Sequence[dispatcher_pb2.RouteRequest], *,
                    timeout: float | None = None) -> list[common_pb2.RouteDecision]:
        """Decisions for many requests (build them with `route_request`), in request order."""
        reply = self._call(self._dispatchers, "RouteBatch", dispatcher_pb2.RouteBatchRequest(requests=requests),
                           metadata=self._data_auth(), idempotent=True, timeout=timeout)
        return list(reply.decisions)

    def dispatcher_status(self, *, timeout: float | None = None) -> dispatcher_pb2.DispatcherStatus:
        return self._call(self._dispatchers, "GetStatus", dispatcher_pb2.GetDispatcherStatusRequest(),
                          idempotent=True, timeout=timeout)

    def generate(self, prompt: str | None = None, *, blocks: Sequence[int] | None = None, prompt_tokens: int = 0,
                 max_tokens: int = 16, key: str = "", request_id: str = "",
                 timeout: float | None = 60.0) -> Iterator[engine_pb2.GenerateChunk]:
        """Route and stream generated tokens. The first chunk carries the RouteDecision and TTFT."""
        req = generate_request(prompt, blocks=blocks, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                               key=key, request_id=request_id)
        last: grpc.RpcError | None = None
        for round_no in range(self.retry.rounds):
            if round_no:
                time.sleep(self.retry.delay(round_no - 1, self._rng))
            for address in self._dispatchers.order():
                call = self._dispatchers.stub(address).Generate(req, timeout=timeout, metadata=self._data_auth())
                received = False
                try:
                    for chunk in call:
                        if not received:
                            received = True
                            self._dispatchers.succeeded(address)
                        yield chunk
                    return
                except grpc.RpcError as err:
                    if received or not _retryable(err):
                        raise
                    last = err
                finally:
                    call.cancel()
        assert last is not None
        raise last

    # ------------------------------------------------------------ planner reads

    def get_plan(self, version: int = 0, *, summary_only: bool = False,
                 timeout: float | None = None) -> common_pb2.Plan:
        """A stored plan version (0: the active one); a table above the message limit is
        fetched page by page and returned whole."""
        req = planner_pb2.GetPlanRequest(version=version, summary_only=summary_only, max_bytes=self._max_message_bytes)
        slices = SliceAssembler()
        while True:
            page = self._call(self._planners, "GetPlan", req, idempotent=True, timeout=timeout)
            whole = slices.add(page)
            if whole is not None:
                return whole
            req = planner_pb2.GetPlanRequest(version=page.version, table_offset=page.table_offset + len(page.table),
                                             max_bytes=self._max_message_bytes)

    def list_plans(self, limit: int = 0, before_version: int = 0, *,
                   timeout: float | None = None) -> planner_pb2.ListPlansResponse:
        return self._call(self._planners, "ListPlans", planner_pb2.ListPlansRequest(limit=limit, before_version=before_version),
                          idempotent=True, timeout=timeout)

    def diff_plans(self, from_version: int, to_version: int = 0, max_moves: int = 0, *,
                   timeout: float | None = None) -> planner_pb2.DiffPlansResponse:
        req = planner_pb2.DiffPlansRequest(from_version=from_version, to_version=to_version, max_moves=max_moves)
        return self._call(self._planners, "DiffPlans", req, idempotent=True, timeout=timeout)

    def planner_status(self, *, timeout: float | None = None) -> planner_pb2.PlannerStatus:
        return self._call(self._planners, "GetStatus", planner_pb2.GetPlannerStatusRequest(), idempotent=True,
                          timeout=timeout)

    def watch_plans(self, known_version: int = 0, *, include_table: bool = False,
                    timeout: float | None = None) -> Iterator[planner_pb2.PlanUpdate]:
        """The active plan now, then every activation, rollback or mode change (from the first planner that answers)."""
        req = planner_pb2.WatchPlansRequest(known_version=known_version, include_table=include_table,
                                            max_chunk_bytes=self._max_message_bytes)
        address = self._planners.order()[0]
        call = self._planners.stub(address).WatchPlans(req, timeout=timeout)
        slices = SliceAssembler()
        try:
            for update in call:
                if _complete(update, slices):
                    yield update
        finally:
            call.cancel()

    # ------------------------------------------------------------ control (bearer token)

    def build_plan(self, rates: Sequence[planner_pb2.KeyRate] | dict[str, float] = (), *, replica_ids: Sequence[str] = (),
                   q_cap: float = 0.0, warm_slots: int = 0, incremental: bool = False, activate: bool = False,
                   expected_active_version: int = 0, shadow: bool = False, whole: bool = True,
                   timeout: float | None = None) -> planner_pb2.BuildPlanResponse:
        """Build and store a candidate from explicit rates (key -> req/s) or the telemetry window
        (no rates). Rates above one message go as a BuildPlanStream. `whole`: page in the rest
        of a table above the message limit (False: the answer keeps only its first slice)."""
        reqs = build_requests(rates, min(STREAM_BUDGET, self._max_message_bytes - 4096), replica_ids=replica_ids,
                              q_cap=q_cap, warm_slots=warm_slots, incremental=incremental, activate=activate,
                              expected_active_version=expected_active_version, shadow=shadow)
        if len(reqs) == 1:
            reply = self._call(self._planners, "BuildPlan", reqs[0], idempotent=False, timeout=timeout,
                               metadata=self._auth())
        else:
            reply = self._call(self._planners, "BuildPlanStream", iter(reqs), idempotent=False, timeout=timeout,
                               metadata=self._auth())
        if whole and reply.plan.table_size:   # a table above the message limit: its first slice; page the rest
            reply.plan.CopyFrom(self.get_plan(reply.plan.version, timeout=timeout))
        return reply

    def activate_plan(self, version: int, expected_active_version: int, reason: str = "", *,
                      timeout: float | None = None) -> planner_pb2.ControlResponse:
        """Compare-and-set activation: FAILED_PRECONDITION when `expected_active_version` is stale."""
        req = planner_pb2.ActivatePlanRequest(version=version, expected_active_version=expected_active_version, reason=reason)
        return self._call(self._planners, "ActivatePlan", req, idempotent=False, timeout=timeout, metadata=self._auth())

    def rollback(self, expected_active_version: int, to_version: int = 0, reason: str = "", *,
                 timeout: float | None = None) -> planner_pb2.ControlResponse:
        req = planner_pb2.RollbackRequest(expected_active_version=expected_active_version, to_version=to_version,
                                          reason=reason)
        return self._call(self._planners, "Rollback", req, idempotent=False, timeout=timeout, metadata=self._auth())

    def set_mode(self, mode: str | int, reason: str = "", *, timeout: float | None = None) -> planner_pb2.ControlResponse:
        """Mode "planned" or "flat" (or a common_pb2.Mode value)."""
        req = planner_pb2.SetModeRequest(mode=_mode(mode), reason=reason)
        return self._call(self._planners, "SetMode", req, idempotent=True, timeout=timeout, metadata=self._auth())

    def pin_plan(self, version: int = 0, *, timeout: float | None = None) -> planner_pb2.ControlResponse:
        return self._call(self._planners, "PinPlan", planner_pb2.PinPlanRequest(version=version), idempotent=version != 0,
                          timeout=timeout, metadata=self._auth())

    def unpin_plan(self, *, timeout: float | None = None) -> planner_pb2.ControlResponse:
        return self._call(self._planners, "UnpinPlan", planner_pb2.UnpinPlanRequest(), idempotent=True,
                          timeout=timeout, metadata=self._auth())

    # ---- the engine set (services/core/engines.py)

    def list_engines(self, *, planned_keys: bool = False, known_version: int = 0,
                     timeout: float | None = None) -> planner_pb2.EngineSet:
        req = planner_pb2.ListEnginesRequest(known_version=known_version, planned_keys=planned_keys)
        return self._call(self._planners, "ListEngines", req, idempotent=True, timeout=timeout)

    def add_engine(self, address: str, engine_id: str = "", *, timeout: float | None = None) -> planner_pb2.EngineChange:
        """A new engine (host:port or KIND+URL) in the next slot; ALREADY_EXISTS for one in use."""
        req = planner_pb2.AddEngineRequest(address=address, id=engine_id)
        return self._call(self._planners, "AddEngine", req, idempotent=False, timeout=timeout, metadata=self._auth())

    def drain_engine(self, engine: str, *, timeout: float | None = None) -> planner_pb2.EngineChange:
        """Stop placing keys on `engine` (id or address) and move its keys now."""
        return self._call(self._planners, "DrainEngine", planner_pb2.DrainEngineRequest(engine=engine),
                          idempotent=True, timeout=timeout, metadata=self._auth())

    def remove_engine(self, engine: str, *, force: bool = False, timeout: float | None = None) -> planner_pb2.EngineChange:
        return self._call(self._planners, "RemoveEngine", planner_pb2.RemoveEngineRequest(engine=engine, force=force),
                          idempotent=True, timeout=timeout, metadata=self._auth())


class AsyncCacheRouteClient(_Base):
    """The asyncio twin of CacheRouteClient (same arguments, awaitable methods).

    >>> async with AsyncCacheRouteClient("127.0.0.1:50053") as c:
    ...     async for chunk in c.generate("hello world", max_tokens=4): ...
    """

    def _channel(self, address: str) -> grpc.aio.Channel:
        creds = self._tls.channel_credentials() if self._tls else None
        opts = channel_options(self._max_message_bytes)
        return grpc.aio.secure_channel(address, creds, opts) if creds else grpc.aio.insecure_channel(address, opts)

    async def close(self) -> None:
        for endpoints in (self._dispatchers, self._planners):
            for channel in endpoints.channels():
                await channel.close()

    async def __aenter__(self) -> "AsyncCacheRouteClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, endpoints: _Endpoints, method: str, request: Any, *, idempotent: bool,
                    timeout: float | None = None, metadata: list[tuple[str, str]] | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        rounds = self.retry.rounds if idempotent else 1
        last: grpc.RpcError | None = None
        for round_no in range(rounds):
            if round_no:
                await asyncio.sleep(self.retry.delay(round_no - 1, self._rng))
            for address in endpoints.order():
                try:
                    reply = await getattr(endpoints.stub(address), method)(request, timeout=timeout, metadata=metadata)
                except grpc.RpcError as err:
                    if not _retryable(err) or not idempotent:
                        raise
                    last = err
                    continue
                endpoints.succeeded(address)
                return reply
        assert last is not None
        raise last

    async def route(self, key: str | None = None, *, prefix: Sequence[int] | None = None, prompt: str | None = None,
                    prompt_tokens: int = 0, request_id: str = "",
                    timeout: float | None = None) -> common_pb2.RouteDecision:
        req = route_request(key, prefix=prefix, prompt=prompt, prompt_tokens=prompt_tokens, request_id=request_id)
        return await self._call(self._dispatchers, "Route", req, idempotent=True, timeout=timeout,
                                metadata=self._data_auth())

    async def route_batch(self, requests: Sequence[dispatcher_pb2.RouteRequest], *,
                          timeout: float | None = None) -> list[common_pb2.RouteDecision]:
        reply = await self._call(self._dispatchers, "RouteBatch", dispatcher_pb2.RouteBatchRequest(requests=requests),
                                 metadata=self._data_auth(), idempotent=True, timeout=timeout)
        return list(reply.decisions)

    async def dispatcher_status(self, *, timeout: float | None = None) -> dispatcher_pb2.DispatcherStatus:
        return await self._call(self._dispatchers, "GetStatus", dispatcher_pb2.GetDispatcherStatusRequest(),
                                idempotent=True, timeout=timeout)

    async def generate(self, prompt: str | None = None, *, blocks: Sequence[int] | None = None, prompt_tokens: int = 0,
                       max_tokens: int = 16, key: str = "", request_id: str = "",
                       timeout: float | None = 60.0) -> AsyncIterator[engine_pb2.GenerateChunk]:
        req = generate_request(prompt, blocks=blocks, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                               key=key, request_id=request_id)
        last: grpc.RpcError | None = None
        for round_no in range(self.retry.rounds):
            if round_no:
                await asyncio.sleep(self.retry.delay(round_no - 1, self._rng))
            for address in self._dispatchers.order():
                call = self._dispatchers.stub(address).Generate(req, timeout=timeout, metadata=self._data_auth())
                received = False
                try:
                    async for chunk in call:
                        if not received:
                            received = True
                            self._dispatchers.succeeded(address)
                        yield chunk
                    return
                except grpc.RpcError as err:
                    if received or not _retryable(err):
                        raise
                    last = err
                finally:
                    call.cancel()
        assert last is not None
        raise last

    async def get_plan(self, version: int = 0, *, summary_only: bool = False,
                       timeout: float | None = None) -> common_pb2.Plan:
        req = planner_pb2.GetPlanRequest(version=version, summary_only=summary_only, max_bytes=self._max_message_bytes)
        slices = SliceAssembler()
        while True:
            page = await self._call(self._planners, "GetPlan", req, idempotent=True, timeout=timeout)
            whole = slices.add(page)
            if whole is not None:
                return whole
            req = planner_pb2.GetPlanRequest(version=page.version, table_offset=page.table_offset + len(page.table),
                                             max_bytes=self._max_message_bytes)

    async def list_plans(self, limit: int = 0, before_version: int = 0, *,
                         timeout: float | None = None) -> planner_pb2.ListPlansResponse:
        return await self._call(self._planners, "ListPlans",
                                planner_pb2.ListPlansRequest(limit=limit, before_version=before_version),
                                idempotent=True, timeout=timeout)

    async def diff_plans(self, from_version: int, to_version: int = 0, max_moves: int = 0, *,
                         timeout: float | None = None) -> planner_pb2.DiffPlansResponse:
        req = planner_pb2.DiffPlansRequest(from_version=from_version, to_version=to_version, max_moves=max_moves)
        return await self._call(self._planners, "DiffPlans", req, idempotent=True, timeout=timeout)

    async def planner_status(self, *, timeout: float | None = None) -> planner_pb2.PlannerStatus:
        return await self._call(self._planners, "GetStatus", planner_pb2.GetPlannerStatusRequest(), idempotent=True,
                                timeout=timeout)

    async def watch_plans(self, known_version: int = 0, *, include_table: bool = False,
                          timeout: float | None = None) -> AsyncIterator[planner_pb2.PlanUpdate]:
        req = planner_pb2.WatchPlansRequest(known_version=known_version, include_table=include_table,
                                            max_chunk_bytes=self._max_message_bytes)
        call = self._planners.stub(self._planners.order()[0]).WatchPlans(req, timeout=timeout)
        slices = SliceAssembler()
        try:
            async for update in call:
                if _complete(update, slices):
                    yield update
        finally:
            call.cancel()

    async def build_plan(self, rates: Sequence[planner_pb2.KeyRate] | dict[str, float] = (), *,
                         replica_ids: Sequence[str] = (), q_cap: float = 0.0, warm_slots: int = 0,
                         incremental: bool = False, activate: bool = False, expected_active_version: int = 0,
                         shadow: bool = False, whole: bool = True,
                         timeout: float | None = None) -> planner_pb2.BuildPlanResponse:
        reqs = build_requests(rates, min(STREAM_BUDGET, self._max_message_bytes - 4096), replica_ids=replica_ids,
                              q_cap=q_cap, warm_slots=warm_slots, incremental=incremental, activate=activate,
                              expected_active_version=expected_active_version, shadow=shadow)
        method, arg = ("BuildPlan", reqs[0]) if len(reqs) == 1 else ("BuildPlanStream", iter(reqs))
        reply = await self._call(self._planners, method, arg, idempotent=False, timeout=timeout,
                                 metadata=self._auth())
        if whole and reply.plan.table_size:
            reply.plan.CopyFrom(await self.get_plan(reply.plan.version, timeout=timeout))
        return reply

    async def activate_plan(self, version: int, expected_active_version: int, reason: str = "", *,
                            timeout: float | None = None) -> planner_pb2.ControlResponse:
        req = planner_pb2.ActivatePlanRequest(version=version, expected_active_version=expected_active_version,
                                              reason=reason)
        return await self._call(self._planners, "ActivatePlan", req, idempotent=False, timeout=timeout,
                                metadata=self._auth())

    async def rollback(self, expected_active_version: int, to_version: int = 0, reason: str = "", *,
                       timeout: float | None = None) -> planner_pb2.ControlResponse:
        req = planner_pb2.RollbackRequest(expected_active_version=expected_active_version, to_version=to_version,
                                          reason=reason)
        return await self._call(self._planners, "Rollback", req, idempotent=False, timeout=timeout,
                                metadata=self._auth())

    async def set_mode(self, mode: str | int, reason: str = "", *,
                       timeout: float | None = None) -> planner_pb2.ControlResponse:
        req = planner_pb2.SetModeRequest(mode=_mode(mode), reason=reason)
        return await self._call(self._planners, "SetMode", req, idempotent=True, timeout=timeout,
                                metadata=self._auth())

    async def pin_plan(self, version: int = 0, *, timeout: float | None = None) -> planner_pb2.ControlResponse:
        return await self._call(self._planners, "PinPlan", planner_pb2.PinPlanRequest(version=version),
                                idempotent=version != 0, timeout=timeout, metadata=self._auth())

    async def unpin_plan(self, *, timeout: float | None = None) -> planner_pb2.ControlResponse:
        return await self._call(self._planners, "UnpinPlan", planner_pb2.UnpinPlanRequest(), idempotent=True,
                                timeout=timeout, metadata=self._auth())
