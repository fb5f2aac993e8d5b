"""An idle dispatcher's CPU in the engine-bound peers configuration (one dispatcher, as
bench/peers.py's tier of 1): what it spends a second with no request, on polls, the record bus,
the engine-set feed, telemetry and timers.

What runs: bench/dispatcher_cpu_rates.py's stack (4 simulated engines, embedded Redis, collector,
planner from this tree) and ONE dispatcher at a time, of this tree or of `--base TREE`, the trees
alternating (`--rounds` each); each is warmed with 3 s of traffic, left idle 3 s, then its
user and system CPU (/proc, 10 ms ticks) read over `--seconds`. `--env NAME=VALUE` sets a variable
of the measured dispatchers; `--before-env NAME=VALUE` of the "before" one only, and without
`--base` "before" is this tree too: a part's cost (CACHEROUTE_POLL_INTERVAL=5 takes the polls
out, CACHEROUTE_RECORD_BUS=0 the bus).

    PYTHONPATH=$PWD:$PWD/protos /work/wt/quiet .venv/bin/python bench/dispatcher_idle.py --base /tmp/base [--seconds 20] [--rounds 2]
    PYTHONPATH=$PWD:$PWD/protos /work/wt/quiet .venv/bin/python bench/dispatcher_idle.py --before-env CACHEROUTE_POLL_INTERVAL=5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dispatcher_cpu_rates as rates  # noqa: E402
from peers import BOUND  # noqa: E402
from peers_procs import start_engines  # noqa: E402
from procs import ROOT, user_system_seconds  # noqa: E402

sys.path.insert(0, str(ROOT))
from clients.openloop import replay  # noqa: E402
from services.local.stack import StackConfig  # noqa: E402


async def run(args) -> list[tuple[str, float, float]]:
    rates.peers_env()
    extra = dict(kv.split("=", 1) for kv in args.env)
    before_extra = {**extra, **dict(kv.split("=", 1) for kv in args.before_env)}
    log_dir = Path(tempfile.mkdtemp(prefix="dispatcher-idle-"))
    engines = await start_engines(BOUND, log_dir)
    plane, rows = None, []
    base = Path(args.base).resolve() if args.base else (ROOT if args.before_env else None)
    trees = ([("before", base)] if base is not None else []) + [("after", ROOT)]
    try:
        model = await engines.model_id()
        cfg = StackConfig(engines=len(engines.urls), dispatchers=1, engine_kind="vllm", engine_urls=tuple(engines.urls),
                          log_dir=str(log_dir / "cacheroute"), metrics=False, seed=0)
        plane = await asyncio.to_thread(lambda: rates.ControlPlane(cfg).start())
        for _ in range(args.rounds):
            for name, tree in trees:
                proc, url = await asyncio.to_thread(plane.dispatcher, 1, tree, None,
                                                    before_extra if name == "before" else extra)
                try:
                    await replay(url + "/v1/chat/completions", rates.schedule(8.0, 3.0, args.seed, model))
                    await asyncio.sleep(3.0)
                    (u0, s0), t0 = user_system_seconds(proc.pid), time.monotonic()
                    await asyncio.sleep(args.seconds)
                    (u1, s1), wall = user_system_seconds(proc.pid), time.monotonic() - t0
                    rows.append((name, (u1 - u0) / wall * 1e3, (s1 - s0) / wall * 1e3))
                    print(f"{name}: user {rows[-1][1]:.1f} sys {rows[-1][2]:.1f} ms/s", file=sys.stderr)
                finally:
                    proc.terminate()
                    proc.wait(30)
    finally:
        if plane is not None:
            plane.stop()
        engines.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="another source tree (git archive REV | tar -x): measured alternately")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable of the 'before' dispatcher only (with no --base: this tree twice, a knob's cost)")
    args = ap.parse_args()
    rows = asyncio.run(run(args))
    print(f"idle dispatcher CPU, peers bound configuration (poll 0.5 s), {args.seconds:g} s a reading; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end")
    for name in dict.fromkeys(r[0] for r in rows):
        got = [r for r in rows if r[0] == name]
        print(f"{name:>6}: " + ", ".join(f"{u + s:.1f} (user {u:.1f} sys {s:.1f})" for _, u, s in got) + " ms/s")


if __name__ == "__main__":
    main()
