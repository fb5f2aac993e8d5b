"""Shared fixtures. Integration tests talk to a real redis-server spawned on a free port;
a missing binary is a failure, never a skip."""

from __future__ import annotations

import pytest

from services.localredis import RedisProcess


@pytest.fixture(scope="session")
def redis_server():
    """One private redis-server for the session (tests flush it through `redis_url`)."""
    with RedisProcess() as server:
        yield server


@pytest.fixture
def redis_url(redis_server):
    """A clean database on the session's redis-server."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url
