"""The record bus's transport (services/dispatcher/recordbus.py): opaque batches between
dispatchers on the pub/sub channel `Keys.records()` (`{prefix}:{records}:bus`; nothing stored), and
hand-overs to a starting dispatcher in `Keys.handover(sender)` (a string, expiring; same hash tag).

One node: PUBLISH / SUBSCRIBE (any Redis version). A Redis Cluster: SPUBLISH / SSUBSCRIBE (Redis
7.0+; redis-py's ClusterPubSub routes them to the node owning the channel's slot), so a batch
travels to one shard instead of being broadcast over the cluster bus to every node.
`RedisStore.records()` is a `RecordChannel` on the store's own connection and errors (Unavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
class RecordChannel:
    """`await publish(blob)` (the number of subscribers that received it) and `subscription()`."""

    def __init__(self, store) -> None:
        self.store = store
        self.name = store.keys.records()

    async def publish(self, blob: bytes) -> int:
        async with self.store._guard():
            if self.store._cluster:
                return int(await self.store._redis.spublish(self.name, blob))
            return int(await self.store._redis.publish(self.name, blob))

    async def put_handover(self, asker: str, blob: bytes, ttl: int) -> bool:
        """Write a hand-over for `asker` unless one is there (SET NX EX); whether it was written."""
        async with self.store._guard():
            return bool(await self.store._redis.set(self.store.keys.handover(asker), blob, nx=True, ex=ttl))

    async def take_handover(self, asker: str) -> bytes | None:
        """Read and delete `asker`'s hand-over (GETDEL, Redis 6.2+); None if there is none."""
        async with self.store._guard():
            return await self.store._redis.getdel(self.store.keys.handover(asker))

    def subscription(self) -> "RecordSubscription":
        return RecordSubscription(self.store)


class RecordSubscription:
    """The record bus's messages as raw bytes: `await start()`, `await get(timeout)` (None after
    `timeout` seconds without one), `await close()`. Errors are Unavailable, as every store call's."""

    def __init__(self, store, channel: str | None = None, *, sharded: bool | None = None) -> None:
        self.store = store
        self.channel = store.keys.records() if channel is None else channel
        # a shard channel in a Cluster (module header); the store's plan events pass sharded=False
        self.sharded = store._cluster if sharded is None else sharded
        self._pubsub = None

    async def start(self) -> None:
        async with self.store._guard():
            self._pubsub = self.store._redis.pubsub(ignore_subscribe_messages=True)
            if self.sharded:
                await self._pubsub.ssubscribe(self.channel)
            else:
                await self._pubsub.subscribe(self.channel)

    async def get(self, timeout: float) -> bytes | None:
        if self._pubsub is None:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        read = self._pubsub.get_sharded_message if self.sharded else self._pubsub.get_message
        async with self.store._guard():
            while (left := deadline - loop.time()) > 0:
                msg = await read(timeout=left)
                if msg is not None and msg.get("type") in ("message", "smessage", b"message", b"smessage"):
                    return msg["data"]
        return None

    async def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None
