"""The plan's trip from activation to a dispatcher routing by it, step by step, in CPU seconds.

One process, a private redis-server: a plan of `--keys` keys (32 replicas, every seventh
key on two; keys shaped like the control loop bench's) is written by one store (the bench's
writer, as `bench/control_loop.py` does), then each step a new version costs on its way to a
dispatcher is timed in process CPU seconds (`time.process_time`: every thread of this
process; Redis's own CPU is not counted), `--repeats` times, median and range:

  planner   read      a fresh store's `get_plan` (the planner did not write the plan)
            columns   `codec.table_columns` (the table as the wire's arrays)
            cut       `planwire.plan_chunks` at the 8 MiB message limit
            encode    each chunk as a PlanUpdate, serialised (what grpc sends)
  dispatcher parse    each PlanUpdate parsed from those bytes (what grpc hands the watch)
            decode    `codec.plan_from_slices(columnar=True)` (arrays, the table's index)
            prepare   `Router.prepare` (re-index, the policy's checks of every row)

A dispatcher routing by the plan then only swaps one reference (`Router.install`). The wall
time of the real trip adds the transfer, the planner's notification and, with several
dispatcher workers on few cores, their decodes competing for the CPU.

    PYTHONPATH=$PWD:$PWD/protos .venv/bin/python bench/plan_trip.py [--keys 128824] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cacheroute.v1 import planner_pb2  # noqa: E402
from services.wire import codec, planwire  # noqa: E402
from services.core.plan import Plan  # noqa: E402
from services.dispatcher.router import Router  # noqa: E402
from services.local.redis_server import RedisProcess  # noqa: E402
from services.model import Replica  # noqa: E402
from services.store import RedisStore  # noqa: E402

STEPS = ("read", "columns", "cut", "encode", "parse", "decode", "prepare")
REPLICAS = tuple(f"r{i}" for i in range(32))


def make_plan(version: int, n: int) -> Plan:
    table = {f"tenant-{i}": (i % 32, (i + 5) % 32) if i % 7 == 0 else (i % 32,) for i in range(n)}
    rates = {k: 1.0 + (i % 13) * 0.25 for i, k in enumerate(table)}
    return Plan(version=version, parent_version=0, created_at=1.0, replica_ids=REPLICAS, q_cap=100.0,
                warm_slots=n, table=table, rates=rates, expected_load=(1.0,) * len(REPLICAS),
                predicted_imbalance=1.0, total_keys=n, admitted_keys=n, admitted_rate_share=1.0)


def timed(out: dict[str, list[float]], name: str, fn, *args):
    c = time.process_time()
    result = fn(*args)
    out.setdefault(name, []).append(time.process_time() - c)
    return result


async def one(url: str, version: int, n: int, out: dict[str, list[float]]) -> None:
    writer = RedisStore(url)
    await writer.put_plan(make_plan(version, n))
    await writer.close()
    reader = RedisStore(url)
    c = time.process_time()
    plan = await reader.get_plan(version)
    out.setdefault("read", []).append(time.process_time() - c)
    await reader.close()
    cols = timed(out, "columns", codec.table_columns, plan)
    chunks = timed(out, "cut", planwire.plan_chunks, plan, planwire.budget_for(8 * 1024 * 1024), cols)
    wire = timed(out, "encode", lambda: [planner_pb2.PlanUpdate(active_version=version, plan=c).SerializeToString()
                                         for c in chunks])
    updates = timed(out, "parse", lambda: [planner_pb2.PlanUpdate.FromString(b) for b in wire])
    got = timed(out, "decode", codec.plan_from_slices, [u.plan for u in updates], True)
    router = Router([Replica(r, f"127.0.0.1:{9 + i}") for i, r in enumerate(REPLICAS)])
    prepared = timed(out, "prepare", router.prepare, got)
    router.install(prepared, flat=False, source="watch")
    assert router.plan_version == version and len(router.plan.table) == n
    out.setdefault("chunks", []).append(len(chunks))
    out.setdefault("bytes", []).append(sum(map(len, wire)))


async def run(args: argparse.Namespace) -> None:
    with RedisProcess() as redis:
        for n in args.keys:
            out: dict[str, list[float]] = {}
            for r in range(args.repeats):
                await one(redis.url, 1 + r + 100 * n, n, out)
            print(f"\n{n:,} keys: {out['chunks'][0]} chunk(s), {out['bytes'][0] / 2**20:.1f} MiB on the wire; "
                  f"CPU seconds, median (min-max) of {args.repeats}")
            for s in STEPS:
                v = out[s]
                print(f"  {s:<8} {statistics.median(v):7.3f}  ({min(v):.3f}-{max(v):.3f})")
            planner = [sum(out[s][i] for s in STEPS[:4]) for i in range(args.repeats)]
            disp = [sum(out[s][i] for s in STEPS[4:]) for i in range(args.repeats)]
            print(f"  planner  {statistics.median(planner):7.3f}   dispatcher {statistics.median(disp):7.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=lambda t: [int(x) for x in t.split(",")], default=[128_824])
    ap.add_argument("--repeats", type=int, default=3)
    asyncio.run(run(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
