"""Shared fixtures. Integration tests talk to a real redis-server spawned on a free port;
a missing binary is a failure, never a skip."""

from __future__ import annotations

import pytest

from services.local.redis_server import RedisProcess
from tests.faults.procs import Procs


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


@pytest.fixture(scope="session")
def redis_cluster():
    """One private Redis Cluster for the session: 3 masters + 3 replicas on loopback
    (services.local.redis_cluster). Tests that kill nodes start their own."""
    from services.local.redis_cluster import RedisClusterProcess

    with RedisClusterProcess(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster):
    """The session cluster, flushed: a `redis+cluster://host:port,...` URL."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def procs(tmp_path):
    """Spawned service processes (tests/faults/procs.py), killed and reaped when the test ends."""
    registry = Procs(tmp_path / "logs")
    try:
        yield registry
    finally:
        registry.cleanup()
