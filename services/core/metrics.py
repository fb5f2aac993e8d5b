"""Run metrics (SPEC section 6), defined once and used by the simulator, the shadow replay,
benchmarks and the live stack.

  hit rate     served and token-weighted: sum cached prompt tokens / sum prompt tokens over
               the requests whose first token was produced in the measured window.
  TTFT         arrival at the replica's queue -> end of the step that finished its prefill;
               p50 / p99 over requests arriving after the warm-up window. Percentiles
               interpolate linearly between order statistics (numpy's default), so a p99 over
               fewer than 100 samples lies between the two largest.
  imbalance    max / mean over replicas of requests served (routed) in the window, all
               replicas counted (a replica that served nothing pulls the mean down).
  SLO capacity the highest offered QPS on the sweep grid such that it and every lower grid
               point meet p99 TTFT <= SLO. Censoring: "left" when the lowest point already
               fails (capacity reported as 0: below the grid), "right" when every point
               passes (the true capacity may be higher), "none" otherwise. Requiring every
               lower point to pass keeps a noisy pass above the knee from inflating the
               figure; `monotone` says whether any point above the knee passed again.

Requests lost to a replica failure are counted in `RunMetrics.failed` (their TTFT counts
if they got a first token before the failure). Requests still without a first token when the
run stopped are `unfinished`; any of them makes p99 = inf, so an overloaded run cannot pass
an SLO by leaving its slowest requests out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np


def hit_rate(cached_tokens: Sequence[int] | np.ndarray, prompt_tokens: Sequence[int] | np.ndarray) -> float:
    """Token-weighted hit rate; 0 when nothing was served."""
    total = float(np.sum(prompt_tokens))
    return float(np.sum(cached_tokens)) / total if total > 0 else 0.0


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """q-th percentile (0..100), linear interpolation; nan for no values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q))


def imbalance(served: Sequence[int] | np.ndarray) -> float:
    """max/mean requests served per replica; nan when nothing was served."""
    arr = np.asarray(served, dtype=np.float64)
    if arr.size == 0 or arr.sum() <= 0:
        return math.nan
    return float(arr.max() / arr.mean())


@dataclass(frozen=True, slots=True)
class RunMetrics:
    hit_rate: float
    ttft_p50: float
    ttft_p99: float
    ttft_mean: float
    imbalance: float
    requests: int            # measured requests (arrived after warm-up)
    served: int              # of those, with a first token
    failed: int              # lost to replica failures
    unfinished: int          # still without a first token at the end of the run
    qps: float               # measured arrival rate in the window
    served_per_replica: tuple[int, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(arrival: np.ndarray, replica: np.ndarray, ttft: np.ndarray, cached: np.ndarray,
              prompt: np.ndarray, failed: np.ndarray, *, replicas: int, warmup: float,
              end: float) -> RunMetrics:
    """Metrics over requests arriving in [warmup, end). Arrays are per request: `replica` is
    the routed replica (-1: never routed), `ttft` nan without a first token, `failed` True
    when a replica failure lost the request."""
    window = (arrival >= warmup) & (arrival < end)
    routed = window & (replica >= 0)
    served_mask = window & ~np.isnan(ttft)
    failed_n = int(np.count_nonzero(window & failed))
    measured = int(np.count_nonzero(window))
    served_n = int(np.count_nonzero(served_mask))
    unfinished = int(np.count_nonzero(window & ~failed & np.isnan(ttft)))
    ttfts = ttft[served_mask]
    counts = np.bincount(replica[routed], minlength=replicas)[:replicas] if replicas else np.zeros(0, int)
    p99 = percentile(ttfts, 99)
    if unfinished > 0:
        p99 = math.inf   # the slowest requests are the ones missing
    span = max(end - warmup, 1e-12)
    return RunMetrics(
        hit_rate=hit_rate(cached[served_mask], prompt[served_mask]),
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=p99,
        ttft_mean=float(ttfts.mean()) if ttfts.size else math.nan,
        imbalance=imbalance(counts),
        requests=measured,
        served=served_n,
        failed=failed_n,
        unfinished=unfinished,
        qps=measured / span,
        served_per_replica=tuple(int(c) for c in counts),
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    capacity: float
    censored: str            # "none" | "left" | "right"
    monotone: bool           # no grid point above the knee passes again


def slo_capacity(points: Iterable[tuple[float, float]], slo: float) -> Capacity:
    """SLO capacity from (offered qps, p99 ttft) grid points (module header)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("no grid points")
    passes = [p99 <= slo for _, p99 in pts]
    if not passes[0]:
        return Capacity(0.0, "left", not any(passes))
    knee = 0
    while knee + 1 < len(pts) and passes[knee + 1]:
        knee += 1
    if knee == len(pts) - 1:
        return Capacity(pts[-1][0], "right", True)
    return Capacity(pts[knee][0], "none", not any(passes[knee + 1:]))


MISS_KINDS = ("first_sight", "first_on_replica", "evicted", "spilled")


def miss_accounting(keys: Sequence[str], replica: Sequence[int], spilled: Sequence[bool],
                    cached: Sequence[int], bound: Sequence[int], prompt: Sequence[int],
                    measured: Sequence[bool]) -> dict[str, float]:
    """Where a served hit rate falls short of the infinite-cache bound, in points of hit rate.

    Per request, in routing (arrival) order: the gap is max(0, bound - cached) tokens, `bound`
    being what one infinite cache that saw every earlier request would hit
    (services.core.traces.ideal_hits). Each request's gap goes to exactly one kind:
      first_sight       the key's first request anywhere (nothing to route it towards)
      spilled           the router sent it off its home (`spilled`: a FALLBACK pick)
      first_on_replica  the key had not been routed to this replica before
      evicted           the key had used this replica before: its prefix was evicted meanwhile
    Every request updates the key's history (warm-up included); only `measured` ones (served, in
    the measured window) count. Returned: each kind's gap and the bound and achieved hit rates,
    all as shares of the measured prompt tokens, so bound - hit = the sum of the four kinds
    (a request hitting more than its bound, which the engine's cap rules out, counts 0)."""
    seen: dict[str, set[int]] = {}
    gap = dict.fromkeys(MISS_KINDS, 0)
    total = hit = best = 0
    for key, r, spill, c, b, p, m in zip(keys, replica, spilled, cached, bound, prompt, measured):
        used = seen.get(key)
        if m:
            total += p
            hit += c
            best += b
            miss = b - c
            if miss > 0:
                if used is None:
                    gap["first_sight"] += miss
                elif spill:
                    gap["spilled"] += miss
                elif r not in used:
                    gap["first_on_replica"] += miss
                else:
                    gap["evicted"] += miss
        if r >= 0:
            if used is None:
                seen[key] = {r}
            else:
                used.add(r)
    out = {kind: (v / total if total else 0.0) for kind, v in gap.items()}
    out["bound"] = best / total if total else 0.0
    out["hit_rate"] = hit / total if total else 0.0
    return out


MAX_GAP_CV = 10.0       # gap_cv clips to [1/MAX_GAP_CV, MAX_GAP_CV]


def gap_cv(gaps: Sequence[float]) -> float | None:
    """Coefficient of variation of an inter-arrival sample (1: Poisson; the paper's bursty test
    1.9), clipped to [1/MAX_GAP_CV, MAX_GAP_CV]; None for fewer than 30 positive gaps."""
    x = [g for g in gaps if g > 0 and math.isfinite(g)]
    if len(x) < 30:
        return None
    mean = sum(x) / len(x)
    sd = math.sqrt(sum((g - mean) ** 2 for g in x) / len(x))
    return min(MAX_GAP_CV, max(1.0 / MAX_GAP_CV, sd / mean))
