"""Dispatcher instructions per request (valgrind --tool=callgrind): a repeatable figure for
comparing two source trees' request paths on a loaded machine (issue 22 item 4).

What runs: bench/dispatcher_cpu.py's setup (fake OpenAI engines in this process, the client,
the peers' tenants-shaped chat bodies), but the dispatcher (`python -m services.dispatcher`,
kind vllm, one worker) runs under callgrind with PYTHONHASHSEED=0. For each tree in turn
(`--base TREE` first, then this one): the dispatcher is warmed (`--warm` streamed requests), its
counters are zeroed (`callgrind_control -z`), `--idle` seconds pass and are dumped (the fixed
cost: health and /metrics polls, telemetry, timers), then each phase (streamed: `--events`
SSE chunks plus the usage chunk the dispatcher adds and strips; whole: one JSON answer) is
zeroed, driven (`--requests`, closed loop at `--concurrency`) and dumped.

Figure: instructions per request = (the phase's instructions - the idle rate x the phase's
wall time) / requests, in thousands (K instr/req). Instruction counts do not depend on the
machine's load (wall time enters only through the idle subtraction, printed beside it), so
unlike CPU seconds they can be compared between runs on a shared machine; they are not CPU
time (cache misses, syscalls' kernel side are not in them). Valgrind makes the dispatcher
~50x slower, so keep `--requests` small (200 takes ~1-2 min a phase).

    PYTHONPATH=$PWD:$PWD/protos /work/wt/cpu .venv/bin/python bench/dispatcher_instr.py \
        [--base /tmp/base] [--requests 200] [--events 24] [--engines 4] [--key-tokens 128] \
        [--poll-interval 0.5] [--metrics-page bench/results/sim_engine_metrics.txt] [--keep DIR]

`--keep DIR` keeps the callgrind files (callgrind_annotate them for where the instructions go).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dispatcher_cpu import body, closed_loop, system_prompts  # noqa: E402
from procs import ROOT, stop, wait_healthy  # noqa: E402

sys.path.insert(0, str(ROOT))
from services.local.redis_server import free_port  # noqa: E402
from tests.faults.fake_engine import FakeEngine  # noqa: E402


def spawn(tree: Path, replicas: str, port: int, out: str, args) -> subprocess.Popen:
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
           sys.executable, "-m", "services.dispatcher", "--metrics-port", "-1", "--log-level", "WARNING",
           "--port", str(free_port()), "--http-port", str(port), "--replicas", replicas, "--engine-kind", "vllm",
           "--seed", "1", "--workers", "1"]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'protos'}",
           "CACHEROUTE_KEY_TOKENS": str(args.key_tokens), "CACHEROUTE_POLL_INTERVAL": str(args.poll_interval),
           "CACHEROUTE_POLL_TIMEOUT": "5"}
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def dumped(out: str, seen: set[str]) -> int:
    """The instruction total of the newest dump of `out` not in `seen`."""
    for _ in range(200):
        files = sorted(set(glob.glob(out + ".*")) - seen, key=os.path.getmtime)
        if files:
            path = files[-1]
            seen.add(path)
            for _ in range(50):
                text = Path(path).read_text(errors="replace")
                m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                if m:
                    return int(m.group(1))
                time.sleep(0.1)
        time.sleep(0.1)
    raise RuntimeError(f"no callgrind dump of {out}")


async def measure(tree: Path, engines: list, args, workdir: str, tag: str) -> dict:
    replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
    port, out = free_port(), os.path.join(workdir, f"callgrind.{tag}")
    proc = spawn(tree, replicas, port, out, args)
    prompts = system_prompts(args.tenants, *args.system_words, args.seed)
    seen: set[str] = set()
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=600)) as session:
            url = f"http://127.0.0.1:{port}"
            await wait_healthy(session, url, timeout=300.0)
            await closed_loop(session, url, [body(prompts, i, True) for i in range(args.warm)], args.concurrency)
            await loop.run_in_executor(None, control, "-z", proc.pid)
            t0 = time.monotonic()
            await asyncio.sleep(args.idle)
            await loop.run_in_executor(None, control, "-d", proc.pid)
            idle_wall = time.monotonic() - t0
            idle = await loop.run_in_executor(None, dumped, out, seen) / idle_wall
            rows = {"idle_per_s": idle}
            for stream in (True, False):
                for e in engines:
                    e.mode = ("slow" if args.event_gap > 0 else "stream") if stream else "ok"
                bodies = [body(prompts, 10_000 + i, stream) for i in range(args.requests)]
                await loop.run_in_executor(None, control, "-z", proc.pid)
                t0 = time.monotonic()
                _, errors = await closed_loop(session, url, bodies, args.concurrency)
                wall = time.monotonic() - t0
                await loop.run_in_executor(None, control, "-d", proc.pid)
                total = await loop.run_in_executor(None, dumped, out, seen)
                if errors:
                    raise RuntimeError(f"{tag}: {errors} errors")
                rows["stream" if stream else "whole"] = {
                    "instr": total, "wall": wall, "per_req": (total - idle * wall) / len(bodies),
                    "idle_share": idle * wall / total}
    finally:
        stop(proc, grace=60.0)
    return rows


async def main(args) -> dict:
    engines = [await FakeEngine("stream", events=args.events, chunk_bytes=24).start() for _ in range(args.engines)]
    for e in engines:
        e.slow_seconds = args.event_gap
    if args.metrics_page:
        page = Path(args.metrics_page).read_text()
        for e in engines:
            e.metrics_page = page
    workdir = args.keep or tempfile.mkdtemp(prefix="dinstr-")
    os.makedirs(workdir, exist_ok=True)
    trees = ([("before", Path(args.base).resolve())] if args.base else []) + [("after", ROOT)]
    results = {}
    try:
        for tag, tree in trees:
            results[tag] = await measure(tree, engines, args, workdir, tag)
    finally:
        for e in engines:
            await e.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def table(results: dict, args) -> str:
    lines = [f"dispatcher instructions per request (callgrind, PYTHONHASHSEED=0), {args.requests} requests a phase, "
             f"{args.engines} fake engines, {args.events} events, key tokens {args.key_tokens}, "
             f"poll {args.poll_interval:g} s, concurrency {args.concurrency}",
             f"{'tree':>7} {'idle K/s':>10} {'stream K/req':>13} {'(idle share)':>12} {'whole K/req':>12} {'(idle share)':>12}"]
    for tag, r in results.items():
        lines.append(f"{tag:>7} {r['idle_per_s'] / 1e3:>10.0f} {r['stream']['per_req'] / 1e3:>13.1f} "
                     f"{r['stream']['idle_share']:>12.1%} {r['whole']['per_req'] / 1e3:>12.1f} "
                     f"{r['whole']['idle_share']:>12.1%}")
    if "before" in results:
        b, a = results["before"], results["after"]
        lines.append(f"{'a/b':>7} {'':>10} {a['stream']['per_req'] / b['stream']['per_req']:>13.3f} {'':>12} "
                     f"{a['whole']['per_req'] / b['whole']['per_req']:>12.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="another source tree (git archive REV | tar -x): measured first")
    parser.add_argument("--requests", type=int, default=200, help="per phase (streamed, whole)")
    parser.add_argument("--warm", type=int, default=40, help="streamed requests before counting")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--events", type=int, default=24, help="SSE chunks per streamed answer")
    parser.add_argument("--event-gap", type=float, default=0.0, help="seconds between a stream's events")
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--system-words", type=lambda t: tuple(int(x) for x in t.split(",")), default=(1000, 4000))
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle counted first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--key-tokens", type=int, default=128)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--metrics-page", help="a Prometheus page every fake engine serves at /metrics")
    parser.add_argument("--keep", help="keep the callgrind files in this directory")
    args = parser.parse_args()
    print(table(asyncio.run(main(args)), args))
