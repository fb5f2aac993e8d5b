from __future__ import annotations

import redis

from services.local.redis_server import RedisProcess


def test_spawned_redis_answers_and_persists_with_aof(tmp_path):
    server = RedisProcess(appendonly=True, data_dir=str(tmp_path)).start()
    try:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        client.close()
        port = server.port
        server.stop(kill=False)
        server.port = port
        server.start()
        assert redis.Redis.from_url(server.url).get("k") == b"v"
    finally:
        server.close()
