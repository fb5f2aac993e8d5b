"""cacheroute.v1.Dispatcher: route with the active plan, proxy engine streams, report status."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator

import grpc

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.core import routing
from services.core.policy import NoHealthyReplica
from services.core.request import BLOCK_TOKENS
from services.dispatcher.monitor import ReplicaMonitor
from services.dispatcher.router import Router
from services.errors import InvalidArgument, ResourceExhausted, Unavailable

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


class DispatcherServicer(dispatcher_pb2_grpc.DispatcherServicer):
    def __init__(self, router: Router, monitor: ReplicaMonitor, rules: KeyRules, dispatcher_id: str) -> None:
        self.router = router
        self.monitor = monitor
        self.rules = rules
        self.dispatcher_id = dispatcher_id
        self._ids = router.ids
        self._addresses = tuple(r.address for r in router.replicas)

    def _route(self, key: str, prompt_tokens: int, prefix_tokens: int):
        try:
            return self.router.route(key, time.time(), prompt_tokens, prefix_tokens)
        except NoHealthyReplica:
            raise Unavailable("no healthy replica") from None

    def _decision(self, pick, key: str) -> common_pb2.RouteDecision:
        i = pick.replica
        return common_pb2.RouteDecision(replica_id=self._ids[i], address=self._addresses[i],
                                        plan_version=self.router.plan_version, reason=pick.reason, key=key)

    async def Route(self, request, context) -> common_pb2.RouteDecision:
        key, prefix_tokens = route_key(request, self.rules)
        return self._decision(self._route(key, request.prompt_tokens, prefix_tokens), key)

    async def RouteBatch(self, request, context) -> dispatcher_pb2.RouteBatchResponse:
        requests = request.requests
        if len(requests) > self.rules.max_batch:
            raise InvalidArgument(f"batch of {len(requests)} exceeds {self.rules.max_batch} requests")
        rules = self.rules
        keys = [route_key(r, rules) for r in requests]   # validate all before routing any
        response = dispatcher_pb2.RouteBatchResponse()
        add, ids, addresses, version = response.decisions.add, self._ids, self._addresses, self.router.plan_version
        route, now = self.router.route, time.time()
        try:
            for r, (key, prefix_tokens) in zip(requests, keys):
                i, reason = route(key, now, r.prompt_tokens, prefix_tokens)
                add(replica_id=ids[i], address=addresses[i], plan_version=version, reason=reason, key=key)
        except NoHealthyReplica:
            raise Unavailable("no healthy replica") from None
        return response

    async def Generate(self, request, context) -> AsyncIterator[engine_pb2.GenerateChunk]:
        key, prompt_tokens, prefix_tokens = generate_key(request, self.rules)
        timeout = context.time_remaining() or self.rules.generate_timeout
        for attempt in range(2):   # a replica that fails before its first chunk is replaced once
            pick = self._route(key, prompt_tokens, prefix_tokens)
            i = pick.replica
            decision = self._decision(pick, key)
            call = self.monitor.engines[i].Generate(request, timeout=timeout)
            self.router.stream_opened(i)
            first = True
            try:
                async for chunk in call:
                    if first:
                        chunk.route.CopyFrom(decision)
                        first = False
                    yield chunk
                return
            except grpc.aio.AioRpcError as err:
                error = self._engine_error(i, err)
                if not (first and attempt == 0 and err.code() == grpc.StatusCode.UNAVAILABLE):
                    raise error from None
            finally:
                call.cancel()
                self.router.stream_closed(i)

    def _engine_error(self, i: int, err: grpc.aio.AioRpcError) -> Exception:
        code, detail = err.code(), err.details()
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(detail)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return ResourceExhausted(f"replica {self._ids[i]}: {detail}")
        if code == grpc.StatusCode.UNAVAILABLE:
            self.monitor.mark_down(i, "stream failed")
        return Unavailable(f"replica {self._ids[i]} failed: {code.name}: {detail}")

    async def GetStatus(self, request, context) -> dispatcher_pb2.DispatcherStatus:
        return status_message(self.router, self.dispatcher_id)


def status_message(router: Router, dispatcher_id: str) -> dispatcher_pb2.DispatcherStatus:
    out = dispatcher_pb2.DispatcherStatus(
        dispatcher_id=dispatcher_id, plan_version=router.plan_version, mode=MODE[router.flat],
        plan_source=router.plan_source, routed=router.routed, planned=router.counts[1], cold=router.counts[2],
        fallback=router.counts[3], telemetry_dropped=router.telemetry_dropped)
    for i, replica in enumerate(router.replicas):
        stats = router.engine_stats[i]
        hit = stats.cached_tokens / stats.prompt_tokens if stats is not None and stats.prompt_tokens else 0.0
        out.replicas.add(replica_id=replica.id, address=replica.address, healthy=router.state.healthy[i],
                         in_flight=router.outstanding[i], waiting=stats.waiting if stats else 0,
                         running=stats.running if stats else 0, kv_usage=router.state.kv_usage[i],
                         hit_rate=hit, routed=router.routed_to[i])
    return out
