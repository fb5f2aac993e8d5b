"""`RedisStore.window_rates` on a full window of the paper's key count.

A private redis-server (no persistence) is filled with `--keys` keys (default 128,824) in
every bucket of a `--window` second window (default 300 s = 31 buckets of 10 s, the
planner's default read), i.e. the worst case: every key seen in every bucket. Counts are
log-normal (sigma 1.65), like the paper's rates. The read is timed best of `--repeats`.
Baseline, same run: the bare transfer, a redis-py pipeline of HGETALL over the same hashes
with no decoding or summing (what any client pays to move the data).

    .venv/bin/python bench/window_rates.py [--keys 128824] [--window 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from services.local.redis_server import RedisProcess
from redis.utils import HIREDIS_AVAILABLE

from services.store import ArrivalRecord, RedisStore, TelemetryConfig

# Fills one bucket's three hashes server-side: ARGV = n, then per key (count, prompt, prefix).
_FILL_LUA = """
local n = tonumber(ARGV[1])
for s = 0, n - 1, 500 do
  local a, b, c = {}, {}, {}
  for i = s, math.min(s + 499, n - 1) do
    local f = 'tenant-' .. i
    local j = 2 + 3 * i
    a[#a + 1] = f; a[#a + 1] = ARGV[j]
    b[#b + 1] = f; b[#b + 1] = ARGV[j + 1]
    c[#c + 1] = f; c[#c + 1] = ARGV[j + 2]
  end
  redis.call('HSET', KEYS[1], unpack(a))
  redis.call('HSET', KEYS[2], unpack(b))
  redis.call('HSET', KEYS[3], unpack(c))
end
return n
"""


async def fill(store: RedisStore, keys: int, first: int, last: int) -> None:
    rng = random.Random(7)
    args: list[object] = [keys]
    for _ in range(keys):
        n = 1 + int(rng.lognormvariate(0, 1.65))
        args += (n, n * rng.randrange(500, 4000), n * rng.randrange(0, 500))
    r = store._redis
    names = [store.keys.tb(first, h) for h in ("n", "pt", "xt")]
    await r.register_script(_FILL_LUA)(keys=names, args=args)
    for idx in range(first + 1, last + 1):
        for h in ("n", "pt", "xt"):
            await r.copy(store.keys.tb(first, h), store.keys.tb(idx, h))
    for idx in range(first, last + 1):
        await r.set(store.keys.tb(idx, "v"), f"fill-{idx}")    # as the write script leaves it


async def bare_transfer(store: RedisStore, first: int, last: int) -> int:
    pipe = store._redis.pipeline(transaction=False)
    for i in range(first, last + 1):
        for h in ("n", "pt", "xt"):
            pipe.hgetall(store.keys.tb(i, h))
    return sum(len(row) for row in await pipe.execute())


async def run(args: argparse.Namespace) -> None:
    cfg = TelemetryConfig(bucket_seconds=10, retention_seconds=3600)
    with RedisProcess() as redis:
        store = RedisStore(redis.url, telemetry=cfg, timeout=120)
        now = time.time()
        first, last = cfg.bucket(now - args.window), cfg.bucket(now)
        t0 = time.perf_counter()
        await fill(store, args.keys, first, last)
        pipe = store._redis.pipeline(transaction=False)
        for i in range(first, last + 1):
            for h in ("n", "pt", "xt"):
                pipe.hlen(store.keys.tb(i, h))
        fields = sum(await pipe.execute())
        print(f"window_rates: {args.keys:,} keys in each of {last - first + 1} buckets ({args.window:g} s window), "
              f"{fields:,} hash fields; filled in {time.perf_counter() - t0:.1f} s")
        bare, cold, warm = [], [], []
        for _ in range(args.repeats):       # before any read: the hashes as the collector wrote them
            t0 = time.perf_counter()
            await bare_transfer(store, first, last)
            bare.append(time.perf_counter() - t0)
        used_hashes = (await store._redis.info("memory"))["used_memory"]
        fresh = RedisStore(redis.url, telemetry=cfg, timeout=120)
        t0 = time.perf_counter()
        await fresh.window_rates(now, args.window)       # reads the hashes, seals the closed buckets
        sealing = time.perf_counter() - t0
        await fresh.close()
        used_sealed = (await store._redis.info("memory"))["used_memory"]
        for _ in range(args.repeats):
            fresh = RedisStore(redis.url, telemetry=cfg, timeout=120)   # empty bucket cache
            t0 = time.perf_counter()
            snap = await fresh.window_rates(now, args.window)
            cold.append(time.perf_counter() - t0)
            # the planner's next interval: the current bucket changed, the others did not
            await fresh.record_arrivals("", [ArrivalRecord("tenant-0", now, 100, 50)])
            t0 = time.perf_counter()
            again = await fresh.window_rates(now, args.window)
            warm.append(time.perf_counter() - t0)
            await fresh.close()
        assert len(snap.keys) == args.keys and again.total_arrivals == snap.total_arrivals + 1
        print(f"  redis-py {'with' if HIREDIS_AVAILABLE else 'WITHOUT'} hiredis")
        print(f"  bare HGETALL pipeline over the unsealed hashes (no summing): {min(bare):.2f} s (best of {args.repeats})")
        print(f"  store.window_rates over the unsealed hashes (it seals the closed buckets): {sealing:.2f} s; "
              f"Redis used_memory {used_hashes / 2**20:.0f} MiB before, {used_sealed / 2**20:.0f} MiB after")
        print(f"  store.window_rates, cold cache, sealed buckets: {min(cold):.2f} s ({min(cold) / min(bare):.2f}x the bare "
              f"transfer of the hashes); {snap.total_arrivals:,} arrivals")
        print(f"  store.window_rates, next read with one bucket changed: {min(warm):.2f} s "
              f"({min(warm) / min(bare):.2f}x the bare transfer)")
        await store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=128_824)
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--repeats", type=int, default=3)
    asyncio.run(run(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
