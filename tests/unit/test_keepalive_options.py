"""Clients and servers agree on keepalive (services/rpc/channels.py): a gRPC server takes a
ping sooner than its min_ping_interval_without_data_ms (default 5 minutes) after the last as
a strike and answers the third with GOAWAY "too_many_pings"; our clients ping every
keepalive_time_ms. Every server we start must accept that interval."""

from __future__ import annotations

import asyncio

import grpc

from services.rpc import ServerConfig, start_server
from services.rpc.channels import channel_options, server_keepalive_options

GRPC_SERVER_DEFAULT_MIN_PING_MS = 300_000


def test_the_server_accepts_pings_at_the_clients_interval():
    client = dict(channel_options())
    server = dict(channel_options() + server_keepalive_options())
    accepted = server.get("grpc.http2.min_ping_interval_without_data_ms", GRPC_SERVER_DEFAULT_MIN_PING_MS)
    assert accepted <= client["grpc.keepalive_time_ms"] // 2      # room for timer jitter


def test_start_server_passes_the_keepalive_options(monkeypatch):
    """start_server builds its grpc.aio server with the options (a real server, spied on)."""
    asyncio.run(_started(monkeypatch))


async def _started(monkeypatch):
    seen = []
    real = grpc.aio.server

    def spy(*args, **kwargs):
        seen.append(dict(kwargs.get("options") or []))
        return real(*args, **kwargs)

    monkeypatch.setattr(grpc.aio, "server", spy)
    running = await start_server(ServerConfig(name="ka", port=0), [], [])
    try:
        assert seen and seen[0]["grpc.http2.min_ping_interval_without_data_ms"] == \
            dict(server_keepalive_options())["grpc.http2.min_ping_interval_without_data_ms"]
        assert seen[0]["grpc.keepalive_time_ms"] == dict(channel_options())["grpc.keepalive_time_ms"]
    finally:
        await running.stop()
