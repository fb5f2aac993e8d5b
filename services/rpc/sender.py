"""What every periodic sender of telemetry to the collector shares.

One channel to the collector, a fixed-period task that calls `flush`, the deployment token as
bearer metadata, and batch ids `<prefix>-<boot>-<seq>`: unique across restarts (a new random
boot id per process), so the collector's batch dedup never merges two processes' batches while
a retried batch keeps its id. Subclasses say what a flush sends.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
from cacheroute.v1 import collector_pb2_grpc

from services.rpc import TLSFiles, aio_channel, bearer_metadata, every, stop_tasks


class PeriodicSender:
    task_name = "collector-sender"
    flush_on_stop = True          # send what is buffered before closing the channel

    def __init__(self, collector: str, *, interval: float, timeout: float = 2.0,
                 tls: TLSFiles | None = None, token: str | None = None) -> None:
        self.collector = collector
        self.interval = interval
        self.timeout = timeout
        self._tls = tls
        self._metadata = bearer_metadata(token)
        self._boot = uuid.uuid4().hex[:12]
        self._seq = 0
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._channel = aio_channel(self.collector, self._tls)
        self._task = asyncio.get_running_loop().create_task(every(self.interval, self.flush), name=self.task_name)

    async def stop(self, flush: bool | None = None) -> None:
        await stop_tasks([self._task])
        self._task = None
        if self._channel is not None:
            if self.flush_on_stop if flush is None else flush:
                await self.flush()
            await self._channel.close()
            self._channel = None

    def next_batch_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._boot}-{self._seq}"

    @property
    def stub(self) -> collector_pb2_grpc.CollectorStub:
        assert self._channel is not None, "start() first"
        return collector_pb2_grpc.CollectorStub(self._channel)

    async def flush(self) -> bool:
        """Send what is pending; True if the collector took it (or there was nothing)."""
        raise NotImplementedError
