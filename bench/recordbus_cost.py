"""CPU cost of the record bus per routed request (services/dispatcher/recordbus.py), no network:
encoding one sender's batch, decoding it, and a receiver feeding it into its cacheroute policy's
record (`RecordBus.handle` -> `CacheRoutePolicy.observe`). A tier of N routers pays encode once
and decode + observe N - 1 times per request routed anywhere in the tier.

Batches of `--entries` requests of `--blocks` block hashes each (0: by key, the live Generate path
without prefix nodes, whose record is a KeyLRU), replicas `--replicas`, repeated `--rounds` times;
CPU seconds by time.process_time, so the figure holds on a shared machine.

    PYTHONPATH=$PWD:$PWD/protos nice -n 19 .venv/bin/python bench/recordbus_cost.py [--entries 400] [--blocks 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

from services.dispatcher.recordbus import RecordBus, decode_batch, encode_batch
from services.dispatcher.router import Router
from services.model import Replica


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--keys", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(1)
    ids = [f"e{i}" for i in range(args.replicas)]
    router = Router([Replica(r, f"127.0.0.1:{i + 1}") for i, r in enumerate(ids)], seed=1)
    router.state.healthy[:] = [True] * args.replicas
    router.state.kv_blocks[:] = [8192] * args.replicas
    bus = RecordBus(router, None, "receiver", batch_max=max(4096, args.entries))
    batches = []
    for _ in range(args.rounds):
        entries = []
        for _ in range(args.entries):
            k = rng.randrange(args.keys)
            entries.append((ids[k % args.replicas], f"key-{k}", 16 * max(args.blocks, 64),
                            tuple(k * 100_000 + j for j in range(args.blocks))))
        batches.append(entries)
    t0 = time.process_time()
    blobs = [encode_batch("sender", 3, 0.1, e)[0] for e in batches]
    t1 = time.process_time()
    for blob in blobs:
        decode_batch(blob, max_entries=4096)
    t2 = time.process_time()

    async def feed() -> None:
        for blob in blobs:
            await bus.handle(blob, time.monotonic())

    asyncio.run(feed())
    t3 = time.process_time()
    n = args.entries * args.rounds
    size = sum(map(len, blobs)) / len(blobs)
    print(f"entries {n} ({args.entries}/batch, {args.blocks} blocks each, {size / 1024:.1f} KiB/batch); "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"encode {1e6 * (t1 - t0) / n:.2f} us/entry, decode {1e6 * (t2 - t1) / n:.2f} us/entry, "
          f"decode+observe {1e6 * (t3 - t2) / n:.2f} us/entry; observed {bus.received[1]}")


if __name__ == "__main__":
    main()
