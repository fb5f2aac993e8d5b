"""CPU of one caller-budget call through the store (services/store/redis.py take_budget) on the
dispatcher's loop (uvloop), against a local redis-server: what the HTTP API paid per request
before its arrivals were budgeted in batches (services/dispatcher/budget.py DeferredArrivals).
Process CPU (getrusage) over `--calls` sequential calls, beside a bare EVALSHA and a PING.

    PYTHONPATH=$PWD:$PWD/protos /work/wt/cpu .venv/bin/python bench/redis_budget_cpu.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from services.local.redis_server import RedisProcess  # noqa: E402
from services.store import RedisStore  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(url: str, calls: int) -> dict[str, float]:
    store = RedisStore(url)
    await store.take_budget("c", 1, rate=100.0, burst=200.0, now=time.time())      # connect, load the script
    redis, sha = store._redis, store._budget.sha
    steps = {"RedisStore.take_budget": lambda: store.take_budget("c", 1, rate=1e9, burst=1e9, now=time.time()),
             "bare EVALSHA": lambda: redis.evalsha(sha, 1, "x", 1, "1e9", "1e9", int(time.time() * 1000)),
             "PING": redis.ping}
    out = {}
    try:
        for name, step in steps.items():
            start = cpu()
            for _ in range(calls):
                await step()
            out[name] = (cpu() - start) / calls * 1e6
    finally:
        await store.close()
    return out


if __name__ == "__main__":
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    server = RedisProcess(host="127.0.0.1").start()
    try:
        for name, us in uvloop.run(measure(server.url, args.calls)).items():
            print(f"{name}: {us:.0f} us CPU a call")
    finally:
        server.stop()
