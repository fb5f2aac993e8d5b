"""The server interceptor: bearer-token check on protected methods, domain errors mapped to
gRPC status codes in one place (services.errors.status_for), malformed requests answered
INVALID_ARGUMENT, and RPC metrics for every method."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Callable

import grpc

from services.auth import AuthError, bearer_of_metadata as _bearer
from services.errors import InvalidArgument, status_for
from services.rpc.logs import kv
from services.rpc.metrics import RpcMetrics

log = logging.getLogger("cacheroute.rpc")


audit_log = logging.getLogger("cacheroute.audit")

# request fields an audit record names (scalars only; never a credential, never a table)
_AUDIT_FIELDS = ("version", "expected_active_version", "to_version", "mode", "activate", "shadow", "incremental",
                 "window_seconds")


def _audit_fields(request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:
        return out
    for name in _AUDIT_FIELDS:
        if name in descriptor.fields_by_name:
            out[name] = getattr(request, name)
    if "reason" in descriptor.fields_by_name:
        reason = " ".join(request.reason.split())
        out["reason"] = reason[:80] + ("..." if len(reason) > 80 else "")
    if "rates" in descriptor.fields_by_name:
        out["rates"] = len(request.rates)
    return out


def audit(method: str, context: Any, request: Any, code: grpc.StatusCode, credential: str,
          detail: str = "") -> None:
    """One record per control call, allowed or denied: who (peer address), what, the outcome.
    `credential` says what was presented ("valid", "missing", "invalid", "not-required"),
    never the credential itself."""
    try:
        peer = context.peer()
    except Exception:  # noqa: BLE001 - a context without a transport
        peer = ""
    audit_log.info("control call", extra=kv(method=method, peer=peer, code=code.name, credential=credential,
                                            allowed=code not in (grpc.StatusCode.UNAUTHENTICATED,
                                                                 grpc.StatusCode.PERMISSION_DENIED),
                                            detail=" ".join(detail.split())[:160], **_audit_fields(request)))


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token check on protected methods, error mapping and RPC metrics for all, and an
    audit record for every call of an audited method."""

    def __init__(self, auth_token: str | None, protected: frozenset[str], metrics: RpcMetrics,
                 audited: frozenset[str] = frozenset(), keyring: Any = None,
                 keyring_methods: frozenset[str] = frozenset()) -> None:
        self.auth_token = auth_token
        self.protected = protected
        self.metrics = metrics
        self.audited = audited
        self.keyring = keyring                  # services.auth.KeyRing for the data-plane methods
        self.keyring_methods = keyring_methods

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        denial = self._check_auth(method, details.invocation_metadata)
        credential = None
        if method.rsplit("/", 1)[-1] in self.audited:
            credential = ("not-required" if not self.auth_token else "valid" if denial is None
                          else "missing" if denial[0] == grpc.StatusCode.UNAUTHENTICATED else "invalid")
        return _wrap(handler, method, denial, self.metrics, credential)

    def _check_auth(self, method: str, metadata) -> tuple[grpc.StatusCode, str] | None:
        short = method.rsplit("/", 1)[-1]
        if short in self.keyring_methods:
            return _check_key(self.keyring, metadata)
        if not self.auth_token or short not in self.protected:
            return None
        token = _bearer(metadata)
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"
        if not hmac.compare_digest(token.encode(), self.auth_token.encode()):
            return grpc.StatusCode.PERMISSION_DENIED, "invalid bearer token"
        return None


def _check_key(keyring: Any, metadata) -> tuple[grpc.StatusCode, str] | None:
    """A data-plane call against the key ring (API keys and the deployment token): None if
    accepted or nothing is required; UNAUTHENTICATED without a key, PERMISSION_DENIED with a
    wrong one or a non-Bearer scheme."""
    if keyring is None or not keyring.enabled:
        return None
    presented = _bearer(metadata)
    if presented == "":
        return grpc.StatusCode.PERMISSION_DENIED, "authorization is not a Bearer credential"
    try:
        keyring.tenant_of(presented)
    except AuthError as exc:
        return (grpc.StatusCode.UNAUTHENTICATED if exc.missing else grpc.StatusCode.PERMISSION_DENIED), str(exc)
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


def _wrap(handler: grpc.RpcMethodHandler, method: str, denial, metrics: RpcMetrics,
          credential: str | None = None) -> grpc.RpcMethodHandler:
    """`credential` set: the method is audited (unary calls: every outcome is logged)."""
    short = method.rsplit("/", 1)[-1]

    async def fail(context, exc: BaseException, request: Any = None) -> None:
        code, message = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("rpc failed", extra=kv(method=short))
        metrics.count(short, code)
        if credential is not None:
            audit(short, context, request, code, credential, message)
        await context.abort(code, message)

    async def deny(context, request: Any = None) -> None:
        metrics.count(short, denial[0])
        if credential is not None:
            audit(short, context, request, denial[0], credential, denial[1])
        await context.abort(*denial)

    kwargs = dict(request_deserializer=_lenient(handler.request_deserializer),
                  response_serializer=handler.response_serializer)
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary_unary(request, context):
            if denial:
                return await deny(context, request)
            start = time.perf_counter()
            try:
                response = await inner(_parsed(request), context)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
                return await fail(context, exc, request)
            metrics.observe(short, time.perf_counter() - start)
            if credential is not None:
                audit(short, context, request, grpc.StatusCode.OK, credential)
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
