"""CPU a second of a lone dispatcher's record bus (services/dispatcher/recordbus.py): one RecordBus
on a real Redis (an embedded redis-server, or `--redis URL`), nobody else on its channel, no routes,
hand-over off. What it pays is the beacon (a publish every ALONE_BEACON s, heard back by its own
subscription) and whatever its send loop does between beacons. CPU seconds of this process
(time.process_time) over `--seconds`, after `--warm` seconds; uvloop, as the dispatcher runs.

    PYTHONPATH=$PWD:$PWD/protos /work/wt/quiet .venv/bin/python bench/recordbus_alone.py [--seconds 20] [--redis URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from services.dispatcher.recordbus import ALONE_BEACON, RecordBus, sender_id
from services.dispatcher.router import Router
from services.local.redis_server import RedisProcess
from services.model import Replica
from services.rpc.loops import use_uvloop
from services.store.redis import RedisStore


async def measure(url: str, seconds: float, warm: float) -> dict:
    router = Router([Replica(f"e{i}", f"127.0.0.1:{i + 1}") for i in range(4)], seed=1)
    store = RedisStore(url, prefix=f"busalone{os.getpid()}")
    bus = RecordBus(router, store, sender_id("bench"), handover=False)
    await bus.start()
    try:
        await asyncio.sleep(warm)
        c0, w0, p0 = time.process_time(), time.monotonic(), bus.published[0]
        await asyncio.sleep(seconds)
        wall = time.monotonic() - w0
        return {"cpu_ms_s": (time.process_time() - c0) / wall * 1e3, "batches_s": (bus.published[0] - p0) / wall,
                "own_heard": bus.own}
    finally:
        await bus.stop()
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warm", type=float, default=2.0)
    ap.add_argument("--redis", help="a Redis URL (default: an embedded redis-server)")
    args = ap.parse_args()
    redis = None if args.redis else RedisProcess().start()
    try:
        use_uvloop(True)
        out = asyncio.run(measure(args.redis or redis.url, args.seconds, args.warm))
    finally:
        if redis is not None:
            redis.stop()
    print(f"lone record bus: {out['cpu_ms_s']:.2f} ms CPU a second, {out['batches_s']:.2f} batches a second "
          f"(beacon {ALONE_BEACON:g} s), own batches heard {out['own_heard']}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
