"""The server interceptor: bearer-token check on protected methods, domain errors mapped to
gRPC status codes in one place (services.errors.status_for), malformed requests answered
INVALID_ARGUMENT, and RPC metrics for every method."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Callable, Iterable

import grpc

from services.errors import InvalidArgument, status_for
from services.rpc.logs import kv
from services.rpc.metrics import RpcMetrics

log = logging.getLogger("cacheroute.rpc")


def _bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            return text[7:].strip() if text.lower().startswith("bearer ") else ""
    return None


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token check on protected methods, error mapping and RPC metrics for all."""

    def __init__(self, auth_token: str | None, protected: frozenset[str], metrics: RpcMetrics) -> None:
        self.auth_token = auth_token
        self.protected = protected
        self.metrics = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        denial = self._check_auth(method, details.invocation_metadata)
        return _wrap(handler, method, denial, self.metrics)

    def _check_auth(self, method: str, metadata) -> tuple[grpc.StatusCode, str] | None:
        if not self.auth_token or method.rsplit("/", 1)[-1] not in self.protected:
            return None
        token = _bearer(metadata)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"
        if not hmac.compare_digest(token.encode(), self.auth_token.encode()):
            return grpc.StatusCode.PERMISSION_DENIED, "invalid bearer token"
        return None


class _Malformed:
    """A request body that did not parse (corrupt wire format, invalid UTF-8 in a string)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """grpc answers a deserializer exception with UNKNOWN; hand the handler a marker instead,
    so a malformed request is INVALID_ARGUMENT like any other bad input."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            return _Malformed(str(exc))

    return parse


def _parsed(request: Any) -> Any:
    if isinstance(request, _Malformed):
        raise InvalidArgument(f"malformed request: {request.reason}")
    return request


async def _parsed_stream(requests) -> Any:
    async for request in requests:
        yield _parsed(request)


def _wrap(handler: grpc.RpcMethodHandler, method: str, denial, metrics: RpcMetrics) -> grpc.RpcMethodHandler:
    short = method.rsplit("/", 1)[-1]

    async def fail(context, exc: BaseException) -> None:
        code, message = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("rpc failed", extra=kv(method=short))
        metrics.count(short, code)
        await context.abort(code, message)

    async def deny(context) -> None:
        metrics.count(short, denial[0])
        await context.abort(*denial)

    kwargs = dict(request_deserializer=_lenient(handler.request_deserializer),
                  response_serializer=handler.response_serializer)
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary_unary(request, context):
            if denial:
                return await deny(context)
            start = time.perf_counter()
            try:
                response = await inner(_parsed(request), context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
                return await fail(context, exc)
            metrics.observe(short, time.perf_counter() - start)
            return response

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.unary_stream:
        inner_stream = handler.unary_stream

        async def unary_stream(request, context):
            if denial:
                await deny(context)
                return
            try:
                async for item in inner_stream(_parsed(request), context):
                    yield item
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001
                await fail(context, exc)
                return
            metrics.count(short, grpc.StatusCode.OK)

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(request_iterator, context):
            if denial:
                return await deny(context)
            try:
                response = await inner_su(_parsed_stream(request_iterator), context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001
                return await fail(context, exc)
            metrics.count(short, grpc.StatusCode.OK)
            return response

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    return handler  # stream-stream: none in the contract
