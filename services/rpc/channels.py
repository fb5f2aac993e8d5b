"""Client channels: options, TLS, reconnect backoff and the bearer token presented to
protected RPCs."""

from __future__ import annotations

from typing import Any

import grpc

from services.rpc.tls import TLSFiles

# gRPC's own reconnect backoff starts at 1 s and grows to 120 s; a restarted replica must be
# back in the dispatcher's (and planner's) health view within a second. (min, max) seconds.
FAST_RECONNECT = (0.1, 0.5)

# Keepalive: every client pings an open connection every KEEPALIVE_MS (a dead peer is found in
# KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS). A gRPC server, by default, takes a ping that comes
# less than 5 minutes after the last one while it sends no data as a "ping strike" and
# answers the third with GOAWAY "too_many_pings" (grpc doc/keepalive.md), which cut a
# WatchPlans stream carrying a million-key plan. So every server we start accepts pings at
# half the clients' interval (`server_keepalive_options`): timer jitter cannot make a strike.
KEEPALIVE_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000


def channel_options(max_message_bytes: int = 8 * 1024 * 1024, *,
                    reconnect: tuple[float, float] | None = None) -> list[tuple[str, Any]]:
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.enable_retries", 0),
    ]
    if reconnect is not None:
        low, high = (round(s * 1000) for s in reconnect)
        opts += [("grpc.initial_reconnect_backoff_ms", low), ("grpc.min_reconnect_backoff_ms", low),
                 ("grpc.max_reconnect_backoff_ms", high)]
    return opts


def server_keepalive_options() -> list[tuple[str, Any]]:
    """What a server needs on top of channel_options to accept the clients' keepalive pings
    (GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS; module constants above)."""
    return [("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2)]


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
