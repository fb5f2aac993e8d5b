"""Trace files -> workloads: opens a Mooncake JSONL or Azure LLM inference CSV file and hands
its lines to the pure parsers in services/core/traces.py (format, modelling choices and knobs
are described there). An unreadable file raises ValueError naming the file."""

from __future__ import annotations

from typing import IO

from services.core.traces import azure_arrivals, azure_workload, mooncake_workload, replay_arrivals
from services.core.workloads import Workload


def load_mooncake(path: str, *, qps: float | None = None, key_blocks: int = 2,
                  limit: int | None = None) -> Workload:
    """Load a Mooncake JSONL trace (first `limit` requests if given)."""
    with _open(path) as f:
        return mooncake_workload(f, path, qps=qps, key_blocks=key_blocks, limit=limit)


def load_azure(path: str, *, qps: float | None = None, seed: int = 0, keys: int = 2000,
               sigma: float = 1.65, prefix_share: float = 0.5, limit: int | None = None) -> Workload:
    """Load an Azure LLM inference CSV, attaching seeded synthetic keys (core.traces header)."""
    with _open(path) as f:
        return azure_workload(f, path, qps=qps, seed=seed, keys=keys, sigma=sigma, prefix_share=prefix_share,
                              limit=limit)


def replayed_arrivals(path: str, *, qps: float, duration: float) -> list[float]:
    """An Azure CSV's recorded arrival times at mean rate `qps` on [0, duration)
    (core.traces.replay_arrivals: looped if short, time-scaled)."""
    with _open(path) as f:
        stamps = azure_arrivals(f, path)
    return replay_arrivals(stamps, qps, duration).tolist()


def _open(path: str) -> IO[str]:
    try:
        return open(path, encoding="utf-8", newline="")
    except OSError as e:
        raise ValueError(f"cannot read trace {path}: {e.strerror or e}") from None
