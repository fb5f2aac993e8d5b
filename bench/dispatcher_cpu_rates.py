"""Dispatcher CPU in docs/peers.md's engine-bound configuration: fixed cost (CPU ms a second at
0 req/s) and marginal cost (CPU ms a request), fitted over a sweep of offered rates.

What runs (as bench/peers.py `--scale bound` with `--routers cacheroute`, one instance): 4
simulated engines (`python -m services.engine`, profile llama3-70b-fp8-h100x2, time scale 2,
2,200 KV blocks: bench/peers_procs.py start_engines), an embedded Redis, the collector and the
planner (services/local/stack.py, its control loop on), and one dispatcher per source tree with
the stack's command line and bench/peers_routers.py's environment (key tokens 128, poll every
0.5 s with a 2 s timeout, one worker, log level INFO). The load is clients/textload.py's
tenants workload (128 tenants, system prompts 1,024-4,096 words, streamed with usage, 8
output tokens), open loop (clients/openloop.py replay), one block of `--seconds` per rate.

Figure: each dispatcher's user+system CPU seconds (/proc) over a block divided by its wall
time = CPU ms per second; its achieved rate = answered requests / wall. The dispatcher that
is not driven during a block gives a 0 req/s sample of its own; `--idle` seconds of both idle
come first. Per tree a least-squares line CPU ms/s = fixed + marginal x rate over all its
samples, with the fit's standard errors (from the residuals) and the implied ms per request
at 16 and 24 req/s (marginal + fixed / rate). `--base TREE`: TREE's dispatcher ("before")
beside this tree's ("after"), the order alternating block by block. `--profile FILE`:
this tree's dispatcher under cProfile (its CPU figures are then inflated; use it alone).

    PYTHONPATH=$PWD:$PWD/protos /work/wt/cpu .venv/bin/python bench/dispatcher_cpu_rates.py \
        [--base /tmp/base] [--rates 8,16,24] [--seconds 15] [--idle 10] [--repeats 1] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import BOUND  # noqa: E402
from peers_procs import start_engines  # noqa: E402
from peers_routers import POLL_INTERVAL, POLL_TIMEOUT  # noqa: E402
from procs import ROOT, cpu_seconds  # noqa: E402

sys.path.insert(0, str(ROOT))
from clients import textload  # noqa: E402
from clients.openloop import replay  # noqa: E402
from services.local.redis_server import free_port  # noqa: E402
from services.local.stack import Stack, StackConfig, http_ready  # noqa: E402


class ControlPlane(Stack):
    """The stack's Redis, collector and planner; the dispatchers are started by `dispatcher`."""

    def start(self) -> "ControlPlane":
        from services.local.redis_server import RedisProcess   # noqa: PLC0415 - as Stack.start
        try:
            self.redis = RedisProcess(host=self.config.host, maxmemory=self.config.redis_maxmemory).start()
            self.redis_url = self.redis.url
            self._start_tier([self._collector()])
            self._start_tier([self._planner()])
        except BaseException:
            self.stop()
            raise
        return self

    def dispatcher(self, i: int, tree: Path, profile: str | None, extra_env: dict | None = None
                   ) -> tuple[subprocess.Popen, str]:
        """Dispatcher `i` of source tree `tree` with the stack's command line; (process, HTTP URL)."""
        child = self._dispatcher(i)
        port = free_port()
        cmd = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []),
               "-m", "services.dispatcher", *child.args, "--http-port", str(port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{tree}{os.pathsep}{tree / 'protos'}", **(extra_env or {}))
        with open(child.log_path, "ab") as log:
            proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not http_ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dispatcher {i} ({tree}) did not start; log {child.log_path}:\n{child.log_tail()}")
            time.sleep(0.1)
        return proc, url


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user+system) by thread name (/proc/PID/task/*/stat; same names summed)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_delta(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """CPU ms a second by thread name between two `thread_cpu` readings."""
    return {n: round((after[n] - before.get(n, 0.0)) / wall * 1e3, 1) for n in after
            if after[n] - before.get(n, 0.0) > 0}


def peers_env() -> None:
    """bench/peers_routers.py start_cacheroute's environment for the bound scale."""
    os.environ.update(CACHEROUTE_KEY_TOKENS=str(BOUND.key_tokens), CACHEROUTE_POLL_INTERVAL=str(POLL_INTERVAL),
                      CACHEROUTE_POLL_TIMEOUT=str(POLL_TIMEOUT), CACHEROUTE_HEALTH_TIMEOUT=str(POLL_TIMEOUT),
                      CACHEROUTE_WORKERS="1")


def schedule(rate: float, seconds: float, seed: int, model: str) -> list[tuple[int, float, bytes]]:
    wl = textload.tenants(qps=rate, duration=seconds, seed=seed, **BOUND.workload_knobs["tenants"])
    return [(r.rid, r.at, r.body(model)) for r in wl.requests]


def fit(samples: list[tuple[float, float]]) -> dict:
    """Least squares CPU ms/s = fixed + marginal x rate, with standard errors."""
    x = np.array([s[0] for s in samples])
    y = np.array([s[1] for s in samples])
    a = np.column_stack([np.ones_like(x), x])
    beta, *_ = np.linalg.lstsq(a, y, rcond=None)
    dof = max(1, len(x) - 2)
    s2 = float(((y - a @ beta) ** 2).sum()) / dof
    se = np.sqrt(np.diag(s2 * np.linalg.pinv(a.T @ a)))
    fixed, marginal = float(beta[0]), float(beta[1])
    return {"fixed_ms_s": fixed, "fixed_se": float(se[0]), "marginal_ms_req": marginal, "marginal_se": float(se[1]),
            "n": len(x), "implied_ms_req": {r: marginal + fixed / r for r in (16, 24)}}


class Sweep:
    """The dispatchers under measurement and their samples: (rate, CPU ms/s) per tree, the
    driven blocks, and this tree's CPU by thread per block."""

    def __init__(self, procs: dict[str, subprocess.Popen], urls: dict[str, str]) -> None:
        self.procs, self.urls = procs, urls
        self.samples: dict[str, list[tuple[float, float]]] = {n: [] for n in procs}
        self.blocks: list[dict] = []
        self.threads: dict[str, dict[str, float]] = {}

    async def measure(self, label: str, driven: str | None, work) -> None:
        """CPU of every dispatcher over `await work()` (None: its answered count is 0)."""
        procs = self.procs
        c0 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        th0 = thread_cpu(procs["after"].pid)
        t0 = time.monotonic()
        ok, errors = await work()
        wall = time.monotonic() - t0
        if driven in (None, "after"):
            self.threads[label] = thread_delta(th0, thread_cpu(procs["after"].pid), wall)
        for n, p in procs.items():
            ms_s = (cpu_seconds(p.pid) - c0[n]) / wall * 1e3
            self.samples[n].append((ok / wall if n == driven else 0.0, ms_s))
            if n == driven:
                self.blocks.append({"tree": n, "offered": float(label.split()[0]), "achieved": ok / wall,
                                    "errors": errors, "cpu_ms_s": ms_s, "ms_req": ms_s / (ok / wall) if ok else None})

    async def idle(self, seconds: float) -> None:
        async def work():
            await asyncio.sleep(seconds)
            return 0, 0
        await self.measure("idle", None, work)

    async def block(self, name: str, rate: float, sched: list) -> None:
        async def work():
            outcomes = await replay(self.urls[name] + "/v1/chat/completions", sched, timeout=BOUND.timeout)
            ok = sum(1 for o in outcomes if o.ok)
            if ok < len(outcomes):
                bad = next(o for o in outcomes if not o.ok)
                print(f"{name} at {rate:g} req/s: {len(outcomes) - ok} failed, e.g. {bad.status} {bad.error[:200]}",
                      file=sys.stderr)
            return ok, len(outcomes) - ok
        await self.measure(f"{rate:g} req/s", name, work)


def profiler(args, pid: int, phase: str) -> subprocess.Popen | None:
    """The tool for `phase` on this tree's dispatcher: from "idle" on, `--spy` (py-spy); from "loaded"
    on, `--perf` (perf) or `--strace` (syscall counts)."""
    if phase == "idle" and args.spy:
        cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-r", "200", "-f", "raw",
               "-o", args.spy, "--threads", *(["--native"] if args.native else ["--gil"])]
    elif phase == "loaded" and args.perf:
        cmd = ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", args.perf]
    elif phase == "loaded" and args.strace:
        cmd = ["strace", "-c", "-f", "-p", str(pid), "-o", args.strace]
    else:
        return None
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run(args) -> dict:
    peers_env()
    log_dir = Path(tempfile.mkdtemp(prefix="dcpu-rates-"))
    engines = await start_engines(BOUND, log_dir)
    trees = {"before": Path(args.base or ROOT).resolve()} if args.base or args.before_env else {}
    before_env = dict(kv.split("=", 1) for kv in args.before_env)
    trees["after"] = ROOT
    procs: dict[str, subprocess.Popen] = {}
    plane, tools = None, []
    try:
        model = await engines.model_id()
        cfg = StackConfig(engines=len(engines.urls), dispatchers=1, engine_kind="vllm", engine_urls=tuple(engines.urls),
                          log_dir=str(log_dir / "cacheroute"), metrics=False, seed=0)
        plane = await asyncio.to_thread(lambda: ControlPlane(cfg).start())
        urls = {}
        for i, (name, tree) in enumerate(trees.items(), 1):
            procs[name], urls[name] = await asyncio.to_thread(
                plane.dispatcher, i, tree, args.profile if name == "after" else None,
                before_env if name == "before" else None)
        for name in trees:   # warm: connections, key memo, the first plan
            await replay(urls[name] + "/v1/chat/completions", schedule(8.0, 3.0, args.seed + 99, model))
        sweep = Sweep(procs, urls)
        tools.append(profiler(args, procs["after"].pid, "idle"))
        await sweep.idle(args.idle)
        tools.append(profiler(args, procs["after"].pid, "loaded"))
        k = 0
        for rep in range(args.repeats):
            for rate in args.rates:
                for name in (list(trees) if k % 2 == 0 else list(trees)[::-1]):   # alternating AB, BA
                    k += 1
                    await sweep.block(name, rate, schedule(rate, args.seconds, args.seed + rep, model))
    finally:
        for tool in tools:
            if tool is not None:
                tool.send_signal(signal.SIGINT)
                tool.wait(30)
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if plane is not None:
            plane.stop()
        engines.stop()
    return {"loadavg": os.getloadavg(), "trees": {n: str(t) for n, t in trees.items()}, "blocks": sweep.blocks,
            "samples": sweep.samples, "fits": {n: fit(s) for n, s in sweep.samples.items()}, "seconds": args.seconds,
            "threads": sweep.threads}


def table(doc: dict) -> str:
    load = " ".join(f"{x:.2f}" for x in doc["loadavg"])
    lines = [f"dispatcher CPU, engine-bound peers configuration, blocks of {doc['seconds']:g} s (load average {load} "
             f"at the end); trees: " + ", ".join(f"{n} = {t}" for n, t in doc["trees"].items()),
             f"{'tree':>6} {'offered':>7} {'achieved':>8} {'errors':>6} {'CPU ms/s':>8} {'ms/req':>7}"]
    for b in doc["blocks"]:
        lines.append(f"{b['tree']:>6} {b['offered']:>7g} {b['achieved']:>8.2f} {b['errors']:>6} {b['cpu_ms_s']:>8.1f} "
                     f"{b['ms_req'] or float('nan'):>7.2f}")
    for n, s in doc["samples"].items():
        idle = [y for x, y in s if x == 0.0]
        lines.append(f"{n}: idle samples {len(idle)}: " + ", ".join(f"{y:.1f}" for y in idle) + " ms/s")
    for label, by in doc.get("threads", {}).items():
        lines.append(f"after, CPU ms/s by thread, {label}: " + ", ".join(f"{k} {v:g}" for k, v in
                                                                       sorted(by.items(), key=lambda kv: -kv[1])))
    for n, f in doc["fits"].items():
        imp = f["implied_ms_req"]
        lines.append(f"{n}: fixed {f['fixed_ms_s']:.1f} ± {f['fixed_se']:.1f} ms/s, marginal {f['marginal_ms_req']:.2f} "
                     f"± {f['marginal_se']:.2f} ms/req ({f['n']} samples); implied {imp[16]:.2f} ms/req at 16 req/s, "
                     f"{imp[24]:.2f} at 24")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="another source tree (git archive REV | tar -x): its dispatcher beside this one's")
    parser.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the 'before' dispatcher only (with no --base: this tree "
                             "twice, e.g. a knob's cost)")
    parser.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[8.0, 16.0, 24.0])
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of traffic per block")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of both dispatchers idle first")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--profile", help="run this tree's dispatcher under cProfile, stats to FILE")
    parser.add_argument("--spy", help="py-spy record this tree's dispatcher (idle and loaded blocks), raw stacks to FILE")
    parser.add_argument("--native", action="store_true", help="with --spy: native frames too")
    parser.add_argument("--perf", help="perf record -g this tree's dispatcher over the loaded blocks, to FILE")
    parser.add_argument("--strace", help="strace -c -f this tree's dispatcher over the loaded blocks (syscall counts, "
                        "e.g. accept4 per request), to FILE; not with --perf")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2, default=str) if args.json else table(result))
    if args.profile and os.path.exists(args.profile):
        pstats.Stats(args.profile).sort_stats("tottime").print_stats(30)
