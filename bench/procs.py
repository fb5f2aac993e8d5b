"""What the process-level benchmarks share (bench/http_proxy.py, bench/route_rpc.py): start a
service module as a child, stop it, a percentile, and the capacity search over offered rates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent


def spawn(module: str, *args: str) -> subprocess.Popen:
    """`python -m module` from the repository root, metrics off, warnings only, output dropped; a
    dispatcher as one process (`--workers 1`) unless `args` name its workers."""
    one = ["--workers", "1"] if module == "services.dispatcher" else []    # one process unless args say otherwise
    cmd = [sys.executable, "-m", module, "--metrics-port", "-1", "--log-level", "WARNING", *one, *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def pct(values: list[float], q: float) -> float:
    """The q-quantile by rank (nan for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def highest_passing_rate(passes: Callable[[float], bool], start: float, end: float, *, step: float = 1.25,
                         misses: int = 2) -> float:
    """Offer start, start x step, ... up to `end`; the highest rate `passes(rate)` accepted (0.0:
    none). Stops after `misses` failures in a row: one noisy point does not end the search."""
    rate, missed, best = start, 0, 0.0
    while missed < misses and rate <= end:
        if passes(rate):
            best, missed = rate, 0
        else:
            missed += 1
        rate *= step
    return best


def user_system_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    return sum(user_system_seconds(pid))


async def wait_healthy(session, url: str, timeout: float = 60.0) -> None:
    """Poll `url`/health (an aiohttp session) until it answers 200; RuntimeError after `timeout`."""
    import aiohttp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not healthy after {timeout:g}s")
