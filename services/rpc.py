"""Server bootstrap shared by every service.

One place for the cross-cutting parts: configuration common to all services, JSON logs,
grpc health checking and reflection, the interceptor that maps domain errors to status
codes, checks bearer tokens on control RPCs and counts RPCs, message-size limits, TLS,
Prometheus metrics on an HTTP port, and graceful shutdown (health NOT_SERVING, then
`server.stop(grace)`). Signal handlers only set an event.

Environment variables (flags override them; documented defaults in parentheses):
  CACHEROUTE_HOST (127.0.0.1)            address to bind
  CACHEROUTE_METRICS_HOST (127.0.0.1)    Prometheus HTTP bind address
  CACHEROUTE_AUTH_TOKEN / _FILE          bearer token required on control and telemetry-write RPCs,
                                         and sent by the services that call them (none)
  CACHEROUTE_TLS_CERT, _TLS_KEY          server certificate and key (PEM files; plaintext if unset)
  CACHEROUTE_TLS_CLIENT_CA               require client certificates signed by this CA (mTLS)
  CACHEROUTE_TLS_CA                      CA that clients use to verify servers
  CACHEROUTE_MAX_MESSAGE_BYTES (8388608) gRPC send/receive limit
  CACHEROUTE_GRACE_SECONDS (5)           shutdown grace period
  CACHEROUTE_LOG_LEVEL (INFO)
Per-service ports come from each service's own flags/env (see its __main__).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol

import grpc
import orjson
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from services.errors import InvalidArgument, status_for

log = logging.getLogger("cacheroute.rpc")


def env(name: str, default: str = "") -> str:
    return os.environ.get(f"CACHEROUTE_{name}", default)


def env_number(name: str, default: str, kind: type[int] | type[float]) -> int | float:
    """A numeric flag default from CACHEROUTE_<name>; a bad value is a one-line ValueError naming the variable."""
    raw = env(name, default)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"CACHEROUTE_{name}={raw!r} is not a valid {kind.__name__}") from None


def read_secret(value: str | None, path: str | None) -> str | None:
    """A secret from its value or from a file (first line). Never logged."""
    if path:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip() or None
    return value or None


@dataclass(frozen=True)
class TLSFiles:
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None   # server side: require client certs (mTLS)
    ca: str | None = None          # client side: verify servers with this CA

    @property
    def server_enabled(self) -> bool:
        return bool(self.cert and self.key)

    def server_credentials(self) -> grpc.ServerCredentials:
        key, cert = _read(self.key), _read(self.cert)
        ca = _read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.ca or self.server_enabled):
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None,
            private_key=_read(self.key) if self.key else None,
            certificate_chain=_read(self.cert) if self.cert else None,
        )


def _read(path: str | None) -> bytes:
    with open(path, "rb") as fh:  # type: ignore[arg-type]
        return fh.read()


@dataclass(frozen=True)
class ServerConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 0                       # 0: ephemeral
    metrics_host: str = "127.0.0.1"
    metrics_port: int = -1              # -1: no metrics endpoint, 0: ephemeral
    auth_token: str | None = field(default=None, repr=False)
    tls: TLSFiles = TLSFiles()
    max_message_bytes: int = 8 * 1024 * 1024
    grace_seconds: float = 5.0
    log_level: str = "INFO"


def add_server_flags(parser: argparse.ArgumentParser, *, default_port: int, default_metrics_port: int) -> None:
    """Flags every service shares. Defaults come from CACHEROUTE_* env vars, then the given values."""
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=env("HOST", "127.0.0.1"), help="bind address (env CACHEROUTE_HOST)")
    g.add_argument("--port", type=int, default=env_number("PORT", str(default_port), int),
                   help=f"gRPC port, 0 = ephemeral (env CACHEROUTE_PORT, default {default_port})")
    g.add_argument("--metrics-host", default=env("METRICS_HOST", "127.0.0.1"))
    g.add_argument("--metrics-port", type=int, default=env_number("METRICS_PORT", str(default_metrics_port), int),
                   help=f"Prometheus port, -1 = off, 0 = ephemeral (env CACHEROUTE_METRICS_PORT, default {default_metrics_port})")
    g.add_argument("--auth-token-file", default=env("AUTH_TOKEN_FILE") or None,
                   help="file holding the bearer token (or env CACHEROUTE_AUTH_TOKEN): required on protected RPCs, "
                        "sent on this service's telemetry calls")
    g.add_argument("--tls-cert", default=env("TLS_CERT") or None)
    g.add_argument("--tls-key", default=env("TLS_KEY") or None)
    g.add_argument("--tls-client-ca", default=env("TLS_CLIENT_CA") or None, help="require client certs (mTLS)")
    g.add_argument("--tls-ca", default=env("TLS_CA") or None, help="CA for verifying the services this one calls")
    g.add_argument("--max-message-bytes", type=int, default=env_number("MAX_MESSAGE_BYTES", str(8 * 1024 * 1024), int))
    g.add_argument("--grace-seconds", type=float, default=env_number("GRACE_SECONDS", "5", float))
    g.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))


def server_config(name: str, args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        name=name, host=args.host, port=args.port, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
        auth_token=read_secret(env("AUTH_TOKEN") or None, args.auth_token_file),
        tls=TLSFiles(args.tls_cert, args.tls_key, args.tls_client_ca, args.tls_ca),
        max_message_bytes=args.max_message_bytes, grace_seconds=args.grace_seconds, log_level=args.log_level,
    )


# ---------------------------------------------------------------- logging

class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                               "service": self.service, "logger": record.name, "msg": record.getMessage()}
        fields = getattr(record, "fields", None)
        if fields:
            doc.update(fields)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("msg", extra=kv(plan=3))` adds structured fields to a JSON log line."""
    return {"fields": fields}


# ---------------------------------------------------------------- channels and background loops

# gRPC's own reconnect backoff starts at 1 s and grows to 120 s; a restarted replica must be
# back in the dispatcher's (and planner's) health view within a second. (min, max) seconds.
FAST_RECONNECT = (0.1, 0.5)


def channel_options(max_message_bytes: int = 8 * 1024 * 1024, *,
                    reconnect: tuple[float, float] | None = None) -> list[tuple[str, Any]]:
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.enable_retries", 0),
    ]
    if reconnect is not None:
        low, high = (round(s * 1000) for s in reconnect)
        opts += [("grpc.initial_reconnect_backoff_ms", low), ("grpc.min_reconnect_backoff_ms", low),
                 ("grpc.max_reconnect_backoff_ms", high)]
    return opts


def aio_channel(target: str, tls: TLSFiles | None = None, max_message_bytes: int = 8 * 1024 * 1024, *,
                reconnect: tuple[float, float] | None = None) -> grpc.aio.Channel:
    """A channel to `target` (TLS when `tls` has a CA or a cert); grpc reconnects it by itself,
    with `reconnect` = (min, max) seconds between attempts instead of its 1..120 s default."""
    creds = tls.channel_credentials() if tls else None
    opts = channel_options(max_message_bytes, reconnect=reconnect)
    return grpc.aio.secure_channel(target, creds, opts) if creds else grpc.aio.insecure_channel(target, opts)


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """Call metadata that presents `token` to a protected RPC (None without a token)."""
    return (("authorization", f"Bearer {token}"),) if token else None


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


# ---------------------------------------------------------------- interceptor

def _bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            return text[7:].strip() if text.lower().startswith("bearer ") else ""
    return None


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

    def __init__(self, auth_token: str | None, protected: frozenset[str], metrics: "RpcMetrics",
                 audited: frozenset[str] = frozenset()) -> None:
        self.auth_token = auth_token
        self.protected = protected
        self.metrics = metrics
        self.audited = audited

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


def _wrap(handler: grpc.RpcMethodHandler, method: str, denial, metrics: "RpcMetrics",
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


# ---------------------------------------------------------------- metrics

class RpcMetrics:
    """A per-server Prometheus registry (no global state: several servers may share a process)."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.service = service
        self._calls = Counter("cacheroute_rpc_total", "RPCs by method and status", ["method", "code"], registry=self.registry)
        self._latency = Histogram("cacheroute_rpc_seconds", "unary RPC latency", ["method"], registry=self.registry,
                                  buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))

    def count(self, method: str, code: grpc.StatusCode) -> None:
        self._calls.labels(method, code.name).inc()

    def observe(self, method: str, seconds: float) -> None:
        self._calls.labels(method, "OK").inc()
        self._latency.labels(method).observe(seconds)


# ---------------------------------------------------------------- server

@dataclass
class RunningServer:
    config: ServerConfig
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    service_names: tuple[str, ...]
    port: int
    metrics: RpcMetrics
    metrics_port: int | None = None
    _metrics_http: Any = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    def request_stop(self) -> None:
        self._stopping.set()

    async def wait_for_stop_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._stopping.set)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        await self._stopping.wait()

    async def stop(self, grace: float | None = None) -> None:
        await self.set_serving(False)
        await self.server.stop(self.config.grace_seconds if grace is None else grace)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        log.info("stopped", extra=kv(port=self.port))


async def start_server(
    config: ServerConfig,
    servicers: Iterable[tuple[Callable[[Any, grpc.aio.Server], None], Any]],
    service_names: Iterable[str],
    *,
    protected_methods: Iterable[str] = (),
    audited_methods: Iterable[str] = (),
    metrics: RpcMetrics | None = None,
) -> RunningServer:
    """Start an aio server with health, reflection, the interceptor and (optionally) metrics.

    `servicers` pairs generated `add_XServicer_to_server` functions with servicer objects;
    `service_names` are their full names (e.g. "cacheroute.v1.Planner");
    `protected_methods` are method names that need the bearer token when one is configured;
    every call of an `audited_methods` method, allowed or denied, leaves a `cacheroute.audit`
    record (method, caller address, outcome; never the token).
    """
    metrics = metrics or RpcMetrics(config.name)
    names = tuple(service_names)
    server = grpc.aio.server(
        interceptors=[ServiceInterceptor(config.auth_token, frozenset(protected_methods), metrics,
                                         frozenset(audited_methods))],
        options=channel_options(config.max_message_bytes) + [("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=None,
    )
    for add, servicer in servicers:
        add(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME), server)
    bind = f"{config.host}:{config.port}"
    if config.tls.server_enabled:
        port = server.add_secure_port(bind, config.tls.server_credentials())
    else:
        port = server.add_insecure_port(bind)
    if port == 0:
        raise OSError(f"cannot bind {bind}")
    await server.start()
    running = RunningServer(config, server, health, names, port, metrics)
    if config.metrics_port >= 0:
        httpd, _thread = start_http_server(config.metrics_port, addr=config.metrics_host, registry=metrics.registry)
        running._metrics_http = httpd
        running.metrics_port = httpd.server_port
    await running.set_serving(True)
    log.info("serving", extra=kv(address=running.address, metrics_port=running.metrics_port,
                                 tls=config.tls.server_enabled, auth=bool(config.auth_token)))
    return running


# ---------------------------------------------------------------- main()

class Service(Protocol):
    """What each service's `serve(config)` returns."""

    running: RunningServer | None

    async def stop(self) -> None: ...


def run_service(name: str, parse_config: Callable[[], Any], serve: Callable[[Any], Awaitable[Service]]) -> int:
    """The body of every service's `main()`: build the config (a ValueError is one line on
    stderr and exit 2), JSON logs, serve until SIGTERM/SIGINT, then stop gracefully."""
    try:
        config = parse_config()
    except ValueError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(name, config.server.log_level)

    async def run() -> None:
        service = await serve(config)
        try:
            assert service.running is not None
            await service.running.wait_for_stop_signal()
        finally:
            await service.stop()

    asyncio.run(run())
    return 0
