"""cacheroute.v1.Dispatcher: route with the active plan, proxy engine streams, report status.

Generate goes through the one dispatch the HTTP API uses (services.dispatcher.dispatch:
route, backend call, one retry elsewhere before the first chunk, ejection, accounting), to
any backend: the gRPC engine, or an HTTP engine (services.backends.http serves it as a
streamed /v1/completions call; it needs a text prompt, a `blocks` prompt is
INVALID_ARGUMENT there). Errors map to status codes by dispatch's one table."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterable, Sequence

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.auth import bearer_of_metadata
from services.backends.base import EngineError
from services.dispatcher.dispatch import Dispatcher, Job, generating, grpc_error
from services.core import routing
from services.core.policy import NoHealthyReplica
from services.core.request import BLOCK_TOKENS
from services.dispatcher.batches import batch_keys, route_batch
from services.dispatcher.budget import BudgetConfig, SharedBudget
from services.dispatcher.monitor import ReplicaMonitor
from services.dispatcher.router import Router
from services.errors import InvalidArgument, Unavailable
from services.model import MAX_KEY_BYTES

MODE = {False: common_pb2.MODE_PLANNED, True: common_pb2.MODE_FLAT}


@dataclass(frozen=True, slots=True)
class KeyRules:
    blocks: int = routing.DEFAULT_KEY_BLOCKS      # key = first N prefix block hashes
    tokens: int = routing.DEFAULT_KEY_TOKENS      # key = first N prompt tokens
    max_batch: int = 10_000                       # RouteBatch requests per call
    generate_timeout: float = 600.0               # engine stream deadline when the caller set none


def route_key(request: dispatcher_pb2.RouteRequest, rules: KeyRules) -> tuple[str, int]:
    """(routing key, reusable prefix tokens for telemetry) of a RouteRequest; ValueError if none."""
    source = request.WhichOneof("source")
    if source == "key":
        return routing.check_key(request.key), 0
    if source == "prefix":
        hashes = request.prefix.block_hashes
        return routing.key_from_hashes(hashes, rules.blocks), len(hashes) * BLOCK_TOKENS
    if source == "prompt":
        return routing.key_from_prompt(request.prompt, rules.tokens), 0
    raise ValueError("no routing key: set key, prefix or prompt")


def generate_key(request: engine_pb2.GenerateRequest, rules: KeyRules) -> tuple[str, int, int]:
    """(routing key, prompt tokens, reusable prefix tokens) of a GenerateRequest; ValueError if invalid."""
    if request.max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    source = request.WhichOneof("prompt_source")
    if source == "blocks":
        tokens = request.blocks.prompt_tokens
        blocks = routing.cacheable_blocks(request.blocks.block_hashes, tokens)
        prefix = min(len(blocks) * BLOCK_TOKENS, max(tokens - 1, 0))
        key = request.key or routing.key_from_hashes(request.blocks.block_hashes, rules.blocks)
    elif source == "prompt":
        tokens, prefix = routing.count_tokens(request.prompt), 0
        key = request.key or routing.key_from_prompt(request.prompt, rules.tokens)
    else:
        raise ValueError("no prompt: set prompt or blocks")
    return routing.check_key(key), tokens, prefix


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(message, field: str) -> bytes:
    number = message.DESCRIPTOR.fields_by_name[field].number
    assert number < 16, "one-byte tag expected"
    return bytes([number << 3 | 2])             # wire type 2: length-delimited


class DecisionEncoder:
    """RouteBatchResponse wire bytes without one message object per decision.

    Building each RouteDecision through the protobuf API costs more than routing it. The
    fields that depend only on (replica, reason, plan version) are serialized once by
    protobuf itself; per decision only the key field and the two length prefixes are
    written here. Field numbers come from the descriptors; the result is parsed back
    into a RouteBatchResponse (cheap), so the RPC's types do not change."""

    _KEY = _tag(common_pb2.RouteDecision, "key")
    _DECISION = _tag(dispatcher_pb2.RouteBatchResponse, "decisions")
    _VARINT = tuple(_varint(n) for n in range(1 << 14))

    def __init__(self, ids: Sequence[str], addresses: Sequence[str]) -> None:
        self.ids, self.addresses = ids, addresses
        self._version = -1
        self._heads: dict[tuple[int, int], bytes] = {}

    def _head(self, i: int, reason: int) -> bytes:
        head = self._heads[(i, reason)] = common_pb2.RouteDecision(
            replica_id=self.ids[i], address=self.addresses[i], plan_version=self._version, reason=reason,
        ).SerializeToString()
        return head

    def encode(self, picks: Iterable[tuple[int, int]], keys: Iterable[str], version: int) -> bytes:
        """Wire bytes of a RouteBatchResponse: one decision per (replica, reason) pick and key."""
        if version != self._version:
            self._heads, self._version = {}, version
        heads, varint, key_tag, dec_tag, short = self._heads, self._VARINT, self._KEY, self._DECISION, len(self._VARINT)
        parts = []
        for (i, reason), key in zip(picks, keys):
            head = heads.get((i, reason)) or self._head(i, reason)
            kb = key.encode()
            body = b"".join((head, key_tag, varint[len(kb)] if len(kb) < short else _varint(len(kb)), kb))
            parts += (dec_tag, varint[len(body)] if len(body) < short else _varint(len(body)), body)
        return b"".join(parts)


def peer_host(context) -> str:
    """The caller's address without its port ("ipv4:127.0.0.1"); "local" without a transport."""
    try:
        peer = context.peer() if context is not None else ""
    except Exception:  # noqa: BLE001 - a context without a transport
        peer = ""
    if not peer:
        return "local"
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() and not peer.startswith("unix:") else peer


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServicer):
    def __init__(self, router: Router, monitor: ReplicaMonitor, rules: KeyRules, dispatcher_id: str, *,
                 budget: SharedBudget | None = None, keyring=None, dispatcher: Dispatcher | None = None,
                 forward_client_auth: bool = False) -> None:
        self.router = router
        self.monitor = monitor
        self.dispatcher = dispatcher        # Generate's one dispatch (services.dispatcher.dispatch)
        self.forward_client_auth = forward_client_auth   # the caller's authorization to HTTP engines
        self.rules = rules
        self.dispatcher_id = dispatcher_id
        self.budget = budget or SharedBudget(BudgetConfig(rate=0))
        self.keyring = keyring              # services.auth.KeyRing: callers are tenants when it has keys
        self._ids = router.ids
        self._addresses = tuple(r.address for r in router.replicas)
        self._encoder = DecisionEncoder(self._ids, self._addresses)

    def _follow_slots(self) -> None:
        """Engines added at run time (services/core/engines.py) grow the router's slots."""
        if len(self._ids) != len(self.router.ids):
            self._ids = self.router.ids
            self._addresses = tuple(r.address for r in self.router.replicas)
            self._encoder.ids, self._encoder.addresses = self._ids, self._addresses

    def caller(self, context) -> str | None:
        """Whose budget a call draws on: its tenant (API keys), else its peer host; None for a
        holder of the deployment token, who may set the plan outright (BuildPlan with explicit
        rates), so bounding its telemetry would protect nothing. The interceptor has already
        refused calls without an accepted key."""
        if self.keyring is not None and self.keyring.enabled:
            try:
                tenant = self.keyring.tenant_of(
                    bearer_of_metadata(context.invocation_metadata() if context is not None else ()))
            except Exception:  # noqa: BLE001 - refused upstream; treat as the peer
                return peer_host(context)
            return "tenant:" + tenant if tenant else None
        return peer_host(context)

    async def _granted(self, context, n: int, now: float) -> int:
        if not self.budget.bounded:
            return n
        caller = self.caller(context)
        return n if caller is None else await self.budget.take(caller, n, now)

    def _route(self, key: str, prompt_tokens: int, prefix_tokens: int, now: float, *, report: bool = True,
               avoid: int = -1, blocks=()):
        try:
            return self.router.route(key, now, prompt_tokens, prefix_tokens, report=report, avoid=avoid,
                                     blocks=blocks)
        except NoHealthyReplica:
            raise Unavailable("no healthy replica") from None

    def _decision(self, pick, key: str) -> common_pb2.RouteDecision:
        i = pick.replica
        self._follow_slots()
        return common_pb2.RouteDecision(replica_id=self._ids[i], address=self._addresses[i],
                                        plan_version=self.router.plan_version, reason=pick.reason, key=key)

    async def Route(self, request, context) -> common_pb2.RouteDecision:
        key, prefix_tokens = route_key(request, self.rules)
        now = time.time()
        report = await self._granted(context, 1, now) == 1
        blocks = request.prefix.block_hashes if self.router.prefix_nodes and request.HasField("prefix") else ()
        pick = self._route(key, request.prompt_tokens, prefix_tokens, now, report=report, blocks=blocks)
        if not report:
            self.router.telemetry_capped += 1
        return self._decision(pick, key)

    async def RouteBatch(self, request, context) -> dispatcher_pb2.RouteBatchResponse:
        requests = request.requests
        if len(requests) > self.rules.max_batch:
            raise InvalidArgument(f"batch of {len(requests)} requests is over the cap of {self.rules.max_batch} "
                                  "(--max-batch)")
        rules, quick = self.rules, MAX_KEY_BYTES // 4
        # a non-empty `key` is the oneof's source; up to 64 characters it is a valid key
        keys = await batch_keys(requests, lambda r: (k, 0) if 0 < len(k := r.key) <= quick else route_key(r, rules))
        now = time.time()
        granted = await self._granted(context, len(keys), now)
        self._follow_slots()
        try:   # in slices, yielding the loop between them (services/dispatcher/batches.py)
            wire = await route_batch(self.router, self._encoder, requests, keys, now, granted)
        except NoHealthyReplica:
            raise Unavailable("no healthy replica") from None
        return dispatcher_pb2.RouteBatchResponse.FromString(wire)

    async def Generate(self, request, context) -> AsyncIterator[engine_pb2.GenerateChunk]:
        key, prompt_tokens, prefix_tokens = generate_key(request, self.rules)
        blocks = ()
        if self.router.prefix_nodes and request.WhichOneof("prompt_source") == "blocks":
            blocks = routing.cacheable_blocks(request.blocks.block_hashes, prompt_tokens)
        timeout = context.time_remaining() or self.rules.generate_timeout
        forwarded = self._forwarded(context)
        caller = self.caller(context) if self.budget.bounded else None
        job = Job(key, time.time(), prompt_tokens, prefix_tokens, prefix_tokens, blocks, request.max_tokens, caller=caller)
        try:
            served = await self.dispatcher.dispatch(job, generating(request, timeout, forwarded))
        except EngineError as error:
            raise grpc_error(error) from None
        stream, done = served.opened, False
        try:
            stream.first.route.CopyFrom(self._decision(served.pick, key))
            last = stream.first
            yield last
            async for last in stream.rest:
                yield last
            done = True
            # the output's length: the final chunk's index counts the text chunks before it
            served.finish((last.prompt_tokens, last.cached_tokens, last.index) if last.prompt_tokens else None)
        except EngineError as error:
            done = True
            served.failed(error)
            raise grpc_error(error) from None
        finally:
            if not done:
                served.client_gone("cancelled")
            await served.close()

    def _forwarded(self, context) -> str | None:
        """The caller's `authorization` metadata, passed to HTTP engines when the deployment forwards it."""
        if not self.forward_client_auth or context is None:
            return None
        token = bearer_of_metadata(context.invocation_metadata())
        return f"Bearer {token}" if token else None

    async def GetStatus(self, request, context) -> dispatcher_pb2.DispatcherStatus:
        return status_message(self.router, self.dispatcher_id)


def status_message(router: Router, dispatcher_id: str) -> dispatcher_pb2.DispatcherStatus:
    out = dispatcher_pb2.DispatcherStatus(
        dispatcher_id=dispatcher_id, plan_version=router.plan_version, mode=MODE[router.flat],
        plan_source=router.plan_source, routed=router.routed, planned=router.counts[1], cold=router.counts[2],
        fallback=router.counts[3], telemetry_dropped=router.telemetry_dropped,
        telemetry_capped=router.telemetry_capped)
    for i, replica in enumerate(router.replicas):
        stats = router.engine_stats[i]
        hit = stats.cached_tokens / stats.prompt_tokens if stats is not None and stats.prompt_tokens else 0.0
        out.replicas.add(replica_id=replica.id, address=replica.address, healthy=router.state.healthy[i],
                         in_flight=router.outstanding[i], waiting=stats.waiting if stats else 0,
                         running=stats.running if stats else 0, kv_usage=router.state.kv_usage[i],
                         hit_rate=hit, routed=router.routed_to[i])
    return out
