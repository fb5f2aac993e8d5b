"""Synthetic, seeded workloads (SPEC section 5).

Key popularity. The paper's key set: 128,824 keys whose rates are log-normal with
sigma = 1.65 (Gini 0.756, top 4% of keys ~47% of requests, no key above ~0.3%). We place
the keys at Blom plotting positions of that log-normal (rate_i = exp(1.65 * z_i),
z_i = Phi^-1((i + 0.625) / (N + 0.25))), a "perfectly typical" sample: Gini 0.756,
top-4% share 0.459, largest key 0.295%, for every seed. Random draws instead put the
largest key anywhere between 0.27% and 0.67% depending on the seed. `active_set=K`
drives traffic from the top-K keys only (paper: K=128 flagship, K=256 wider), their
rates renormalised to the offered `qps`; within the top 128 the hottest key has ~9x the
rate of the 128th. `active_set=0` (or None) makes all 128,824 keys active; block hashes
are only built for keys that appear, but a long run then holds many distinct prefixes.

Lengths, chosen once for all policies and documented here, not tuned per policy:
  shared prefix per key  log-normal, median 3,072 tokens, sigma 0.5, clipped [1,024,
                         8,192], rounded down to whole 16-token blocks (mean ~3,480)
  unique suffix          log-normal, median 192 tokens, sigma 0.6, clipped [16, 2,048]
                         (mean ~230)
  output                 log-normal, median 192 tokens, sigma 0.7, clipped [8, 1,024]
The arithmetic (SPEC section 5): the 70B profile caches 14,100 blocks x 16 = 225,600
tokens per replica. Flat-LB spreads every active key over every replica, so each replica
would need 128 x 3,480 ~ 445k tokens (2.0x its cache; 4x with K=256) and keeps only the
hot part of the set; a planned replica serves 128 / 30 ~ 4.3 keys ~ 15k tokens, 7% of
its cache, leaving room for running requests. The reusable share of prompt tokens is
~3,480 / 3,710 ~ 94%, the ceiling on any policy's hit rate (paper: CacheRoute 93.2%).
The 8B profile caches 440k tokens per replica, so Flat-LB's working set there is ~1x
cache before running requests: partly warm (paper's 8B Flat-LB: 56% hit).

Variants:
  paper      the above; arrivals Poisson (cv=1) or gamma renewal with coefficient of
             variation `cv` (paper's burstiness test: 1.9). With `burst_dwell=D` the arrivals
             are instead a two-state Markov-modulated Poisson process: a high and a low rate
             state, each held for an exponential time of mean D seconds, rates r:1 with
             r = mmpp_ratio(cv) (cv 1.9: r = 7.08, i.e. 1.75x and 0.25x the mean), so the gap
             CV is `cv` but bursts are correlated over seconds and every replica sees them at
             once, where i.i.d. gamma gaps thin to near-Poisson per replica. With
             `arrivals=[t, ...]` (seconds, e.g. a real trace's times scaled to the offered
             rate by traces.replay_arrivals) those times are used as given instead (not with
             cv or burst_dwell); the knob is recorded as its count of arrivals.
  whale      paper plus `whales` extra keys (default 4) that together carry
             `whale_share` (default 0.35) of the traffic. At the 8B ablation's 240 QPS
             each whale runs at 21 req/s, above a per-replica q_cap (500 QPS / 30 ~ 17),
             so k_b > 1. Pinned with k_b = 1, a replica holding one whale carries ~11%
             of all traffic = 3.3x the mean (paper: +affinity imbalance 3.46x); our
             ring (R = 30) happens to hash two of w0..w3 together: 6.1x measured.
  low-reuse  little recoverable prefix work: prefix median 256 tokens (sigma 0.5,
             [64, 1,024]), suffix median 2,048 (sigma 0.5, [256, 8,192]); the reusable
             token share is ~11%, where affinity only buys load skew (paper's 32B
             negative regime: hit 1.1% -> 11.8% at best).
  drift      paper whose per-key rates follow a log-normal random walk, sigma = 0.3 per
             `interval` seconds (default 60; paper: six intervals), renormalised to the
             offered qps each interval so load stays matched. `epochs` holds the rates.
  flagship   one prefix shared by every key (`shared_tokens`) + the key's own context
             (log-normal, median `context_median`, sigma 0.5) + the `paper` suffix; every key of
             the population sends traffic (default), or with `active_set=K` the top-K keys, their
             rates renormalised (the context lengths are drawn for the whole population first, so
             a key's prefix does not depend on K). Defaults: issue 13's full-population calibration;
             experiments/run.py's `flagship` passes the knobs calibrated on both anchors.

Block hashes: block i of key b's prefix hashes (workload, key, i) with splitmix64, so
equal hashes mean equal prefixes, as chained engine hashes do. Requests of one key
share one `blocks` tuple.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np

from services.core.request import BLOCK_TOKENS, Request

WORKLOADS = ("paper", "whale", "low-reuse", "drift", "flagship")

PAPER_KEYS = 128_824
PAPER_SIGMA = 1.65
MASK63 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A clipped log-normal over token counts."""

    median: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        x = rng.lognormal(math.log(self.median), self.sigma, size)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)


PAPER_PREFIX = LengthDist(3072, 0.5, 1024, 8192)
PAPER_SUFFIX = LengthDist(192, 0.6, 16, 2048)
OUTPUT = LengthDist(192, 0.7, 8, 1024)
LOW_REUSE_PREFIX = LengthDist(256, 0.5, 64, 1024)
LOW_REUSE_SUFFIX = LengthDist(2048, 0.5, 256, 8192)


@dataclass(frozen=True, slots=True)
class RateEpoch:
    start: float                      # seconds
    rates: Mapping[str, float]        # key -> req/s during the epoch


@dataclass
class Workload:
    name: str
    qps: float
    duration: float
    seed: int
    requests: list[Request]                 # sorted by arrival
    keys: tuple[str, ...]                   # keys that can send traffic, hottest first
    prefix_tokens: dict[str, int]           # key -> shared prefix tokens (multiple of 16)
    rates: dict[str, float]                 # key -> true mean rate over the run (req/s)
    epochs: tuple[RateEpoch, ...]           # piecewise-constant true rates
    knobs: dict[str, Any] = field(default_factory=dict)
    population_shares: np.ndarray | None = None   # full key population (paper family)

    def rates_at(self, t: float) -> Mapping[str, float]:
        """True per-key rates in force at time t."""
        current = self.epochs[0]
        for epoch in self.epochs:
            if epoch.start > t:
                break
            current = epoch
        return current.rates

    def describe(self) -> dict[str, Any]:
        reqs = self.requests
        prompt = sum(r.prompt_tokens for r in reqs)
        reusable = sum(r.prefix_tokens for r in reqs)
        total_rate = sum(self.rates.values()) or 1.0
        return {
            "name": self.name,
            "qps": self.qps,
            "duration": self.duration,
            "seed": self.seed,
            "requests": len(reqs),
            "keys": len(self.keys),
            "mean_prefix_tokens": _mean(self.prefix_tokens[r.key] for r in reqs),
            "mean_prompt_tokens": prompt / len(reqs) if reqs else 0.0,
            "mean_output_tokens": _mean(r.output_tokens for r in reqs),
            "reusable_token_share": reusable / prompt if prompt else 0.0,
            "top_key_share": max(self.rates.values(), default=0.0) / total_rate,
            "epochs": len(self.epochs),
            "knobs": dict(self.knobs),
        }


def make_workload(name: str, *, qps: float, duration: float, seed: int, **knobs: Any) -> Workload:
    """Build a named workload; knobs are per-workload (see the module header)."""
    if qps <= 0 or duration <= 0:
        raise ValueError(f"qps and duration must be positive, got qps={qps}, duration={duration}")
    match name:
        case "paper":
            build = _paper
        case "whale":
            build = _whale
        case "low-reuse":
            build = _low_reuse
        case "drift":
            build = _drift
        case "flagship":
            build = _flagship
        case _:
            raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    valid = [p for p in inspect.signature(build).parameters if p not in ("qps", "duration", "seed")]
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown} for workload {name!r}; valid: {', '.join(valid)}")
    return build(qps, duration, seed, **knobs)


# ---------------------------------------------------------------- variants

def _paper(qps, duration, seed, *, active_set=128, cv=1.0, keys=PAPER_KEYS, sigma=PAPER_SIGMA, burst_dwell=None,
           arrivals=None):
    return _keyed("paper", PAPER_PREFIX, PAPER_SUFFIX, qps, duration, seed, active_set, cv, keys, sigma,
                  burst_dwell, arrivals)


def _low_reuse(qps, duration, seed, *, active_set=128, cv=1.0, keys=PAPER_KEYS, sigma=PAPER_SIGMA):
    return _keyed("low-reuse", LOW_REUSE_PREFIX, LOW_REUSE_SUFFIX, qps, duration, seed, active_set,
                  cv, keys, sigma)


def _keyed(name, prefix, suffix, qps, duration, seed, active_set, cv, keys, sigma, burst_dwell=None, arrivals=None):
    rng = np.random.default_rng(seed)
    population = lognormal_shares(keys, sigma)
    active = _active_count(active_set, keys)
    names = [f"k{i:06d}" for i in range(active)]
    shares = population[:active] / population[:active].sum()
    knobs = {"active_set": active, "cv": cv, "keys": keys, "sigma": sigma}
    if burst_dwell is not None:
        knobs["burst_dwell"] = burst_dwell
    if arrivals is not None:
        knobs["arrivals"] = len(arrivals)
    return _stationary(name, qps, duration, seed, rng, names, shares, cv, prefix, suffix,
                       knobs=knobs, population=population, burst_dwell=burst_dwell, replay=arrivals)


# flagship prompt structure, calibrated once (docs/experiments.md, "Flagship calibration")
FLAGSHIP_SHARED_TOKENS = 1536
FLAGSHIP_CONTEXT_MEDIAN = 512
FLAGSHIP_CONTEXT_SIGMA = 0.5


def _flagship(qps, duration, seed, *, shared_tokens=FLAGSHIP_SHARED_TOKENS, context_median=FLAGSHIP_CONTEXT_MEDIAN,
              context_sigma=FLAGSHIP_CONTEXT_SIGMA, cv=1.0, keys=PAPER_KEYS, sigma=PAPER_SIGMA, burst_dwell=None,
              arrivals=None, active_set=None):
    """Every key of the population can send traffic (or, with `active_set=K`, the top-K keys,
    their rates renormalised); prompt = one prefix shared by every key + the key's own context
    + a unique suffix (module header)."""
    if shared_tokens < 0 or context_median < BLOCK_TOKENS:
        raise ValueError("flagship needs shared_tokens >= 0 and context_median >= 16")
    rng = np.random.default_rng(seed)
    population = lognormal_shares(keys, sigma)
    active = _active_count(active_set, keys)
    shared = block_hashes("flagship", "*shared*", int(shared_tokens) // BLOCK_TOKENS)
    context = _flagship_contexts(rng, keys, context_median, context_sigma)
    replay, arrivals = arrivals, arrival_times(rng, qps, duration, cv, burst_dwell, arrivals)
    drawn = population if active == keys else population[:active] / population[:active].sum()
    key_idx = _draw(rng, drawn, len(arrivals))
    n = len(arrivals)
    suffix = PAPER_SUFFIX.sample(rng, n).tolist()
    output = OUTPUT.sample(rng, n).tolist()
    chains: dict[int, tuple[int, ...]] = {}
    prefix: dict[str, int] = {}
    requests = []
    for rid, (t, k, u, o) in enumerate(zip(arrivals.tolist(), key_idx.tolist(), suffix, output)):
        key = f"k{k:06d}"
        chain = chains.get(k)
        if chain is None:
            own = int(context[k])
            chain = chains[k] = shared + block_hashes("flagship", key, own // BLOCK_TOKENS)
            prefix[key] = len(chain) * BLOCK_TOKENS
        requests.append(Request(rid, t, key, prefix[key] + u, o, chain))
    names = tuple(f"k{k:06d}" for k in sorted(chains, key=lambda k: (-population[k], k)))
    rates = {f"k{k:06d}": float(qps * drawn[k]) for k in chains}
    knobs = {"shared_tokens": int(shared_tokens) // BLOCK_TOKENS * BLOCK_TOKENS, "context_median": context_median,
             "context_sigma": context_sigma, "cv": cv, "keys": keys, "sigma": sigma, "active_set": active}
    if replay is not None:
        knobs["arrivals"] = len(replay)
    return Workload("flagship", qps, duration, seed, requests, names, prefix, rates, (RateEpoch(0.0, rates),),
                    knobs, population)


def _flagship_contexts(rng, keys, context_median, context_sigma) -> np.ndarray:
    """One context length per key of the population (the workload's first draw from its rng)."""
    dist = LengthDist(float(context_median), float(context_sigma), BLOCK_TOKENS, int(8 * context_median))
    return _block_align(dist.sample(rng, keys))


def history_rates(name: str, *, qps: float, seconds: float, seed: int, history_seed: int,
                  **knobs: Any) -> list[tuple[str, float, int]]:
    """(key, measured req/s, prefix tokens) of an independent `seconds`-long history of workload
    `name` (same keys and prefixes as `make_workload(name, seed=seed)`, arrivals drawn with
    `history_seed`): what a planner's aggregated per-key rate data would hold. Counts are
    Poisson(rate x seconds) per key, so nothing is simulated. `paper` and `flagship` only."""
    if seconds <= 0:
        raise ValueError("history seconds must be positive")
    draw = np.random.default_rng(history_seed)
    keys = knobs.get("keys", PAPER_KEYS)
    population = lognormal_shares(keys, knobs.get("sigma", PAPER_SIGMA))
    rng = np.random.default_rng(seed)
    if name == "flagship":
        shared = int(knobs.get("shared_tokens", FLAGSHIP_SHARED_TOKENS)) // BLOCK_TOKENS * BLOCK_TOKENS
        prefix = shared + _flagship_contexts(rng, keys, knobs.get("context_median", FLAGSHIP_CONTEXT_MEDIAN),
                                             knobs.get("context_sigma", FLAGSHIP_CONTEXT_SIGMA))
        active = _active_count(knobs.get("active_set"), keys)
        shares = population if active == keys else np.concatenate(
            [population[:active] / population[:active].sum(), np.zeros(keys - active)])
    elif name == "paper":
        active = _active_count(knobs.get("active_set", 128), keys)
        prefix = _block_align(PAPER_PREFIX.sample(rng, active))
        shares = population[:active] / population[:active].sum()
    else:
        raise ValueError(f"history_rates supports paper and flagship, not {name!r}")
    counts = draw.poisson(qps * seconds * shares)
    return [(f"k{i:06d}", float(c) / seconds, int(prefix[i])) for i in np.flatnonzero(counts).tolist()
            for c in (counts[i],)]


def _whale(qps, duration, seed, *, whales=4, whale_share=0.35, active_set=128, cv=1.0,
           keys=PAPER_KEYS, sigma=PAPER_SIGMA):
    if whales < 1 or not 0.0 < whale_share < 1.0:
        raise ValueError("whale needs whales >= 1 and 0 < whale_share < 1")
    rng = np.random.default_rng(seed)
    population = lognormal_shares(keys, sigma)
    active = _active_count(active_set, keys)
    base = population[:active] / population[:active].sum() * (1.0 - whale_share)
    shares = np.concatenate([np.full(whales, whale_share / whales), base])
    names = [f"w{i}" for i in range(whales)] + [f"k{i:06d}" for i in range(active)]
    return _stationary("whale", qps, duration, seed, rng, names, shares, cv, PAPER_PREFIX,
                       PAPER_SUFFIX,
                       knobs={"whales": whales, "whale_share": whale_share,
                              "active_set": active, "cv": cv, "keys": keys, "sigma": sigma},
                       population=population)


def _drift(qps, duration, seed, *, interval=60.0, drift_sigma=0.3, active_set=128, cv=1.0,
           keys=PAPER_KEYS, sigma=PAPER_SIGMA):
    if interval <= 0:
        raise ValueError("drift interval must be positive")
    rng = np.random.default_rng(seed)
    population = lognormal_shares(keys, sigma)
    active = _active_count(active_set, keys)
    names = [f"k{i:06d}" for i in range(active)]
    epochs_n = max(1, math.ceil(duration / interval))
    log_rates = np.log(population[:active])
    steps = rng.normal(0.0, drift_sigma, size=(epochs_n - 1, active))
    walk = np.vstack([log_rates, log_rates + np.cumsum(steps, axis=0)]) if epochs_n > 1 else log_rates[None]
    shares = np.exp(walk - walk.max(axis=1, keepdims=True))
    shares /= shares.sum(axis=1, keepdims=True)

    prefix = dict(zip(names, _block_align(PAPER_PREFIX.sample(rng, active)).tolist()))
    arrivals = arrival_times(rng, qps, duration, cv)
    epoch_of = np.minimum((arrivals // interval).astype(np.int64), epochs_n - 1)
    key_idx = np.empty(len(arrivals), dtype=np.int64)
    for j in range(epochs_n):
        mask = epoch_of == j
        key_idx[mask] = _draw(rng, shares[j], int(mask.sum()))
    epochs = tuple(RateEpoch(j * interval, dict(zip(names, (qps * shares[j]).tolist())))
                   for j in range(epochs_n))
    lengths = [min(interval, duration - j * interval) for j in range(epochs_n)]
    mean_shares = (shares * np.array(lengths)[:, None]).sum(axis=0) / duration
    return _assemble("drift", qps, duration, seed, rng, names, prefix, arrivals, key_idx,
                     PAPER_SUFFIX, dict(zip(names, (qps * mean_shares).tolist())), epochs,
                     {"interval": interval, "drift_sigma": drift_sigma, "active_set": active,
                      "cv": cv, "keys": keys, "sigma": sigma},
                     population)


# ---------------------------------------------------------------- building blocks

def lognormal_shares(n: int, sigma: float) -> np.ndarray:
    """Request shares of n keys at Blom plotting positions of LogNormal(0, sigma), hottest first."""
    return _lognormal_shares(int(n), float(sigma)).copy()


@functools.lru_cache(maxsize=8)
def _lognormal_shares(n: int, sigma: float) -> np.ndarray:
    inv = NormalDist().inv_cdf
    z = np.array([inv((n - i - 0.375) / (n + 0.25)) for i in range(n)])
    w = np.exp(sigma * z)
    return w / w.sum()


def gini(shares: np.ndarray) -> float:
    x = np.sort(np.asarray(shares, dtype=float))
    n = len(x)
    cum = np.cumsum(x)
    return float((n + 1 - 2 * (cum.sum() / cum[-1])) / n)


def arrival_times(rng: np.random.Generator, qps: float, duration: float, cv: float = 1.0,
                  burst_dwell: float | None = None, replay=None) -> np.ndarray:
    """Arrivals on [0, duration). Renewal: exponential gaps (cv=1) or gamma gaps with that CV.
    With `burst_dwell` (seconds): a two-state Markov-modulated Poisson process (module header)
    whose gap CV is `cv`, bursts lasting `burst_dwell` on average. With `replay` (seconds):
    those times, sorted, as given (no draw)."""
    if cv <= 0:
        raise ValueError("cv must be positive")
    if replay is not None:
        if cv != 1.0 or burst_dwell is not None:
            raise ValueError("replayed arrivals take no cv or burst_dwell")
        times = np.sort(np.asarray(replay, dtype=float))
        if len(times) and times[0] < 0:
            raise ValueError("replayed arrivals must be >= 0")
        return times[times < duration]
    if burst_dwell is not None:
        return _mmpp_times(rng, qps, duration, cv, burst_dwell)
    shape = 1.0 / (cv * cv)
    mean_gap = 1.0 / qps
    chunks, t, expected = [], 0.0, qps * duration
    while t < duration:
        n = int(expected + 6 * math.sqrt(expected) * cv + 16)
        gaps = rng.exponential(mean_gap, n) if cv == 1.0 else rng.gamma(shape, mean_gap / shape, n)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    arrivals = np.concatenate(chunks)
    return arrivals[arrivals < duration]


def mmpp_ratio(cv: float) -> float:
    """High/low rate ratio r of the two-state MMPP whose gap CV is `cv` (equal mean dwell in
    both states, dwell >> gap): gaps are then a mixture of the two exponentials weighted by the
    arrivals in each state, so CV^2 = (1 + r)^2 / (2 r) - 1."""
    if cv < 1.0:
        raise ValueError("an MMPP's gap CV is at least 1")
    c = 2.0 * (cv * cv + 1.0)
    return ((c - 2.0) + math.sqrt((c - 2.0) ** 2 - 4.0)) / 2.0


def _mmpp_times(rng: np.random.Generator, qps: float, duration: float, cv: float, dwell: float) -> np.ndarray:
    if dwell <= 0:
        raise ValueError("burst_dwell must be positive")
    r = mmpp_ratio(cv)
    rates = (2.0 * qps * r / (1.0 + r), 2.0 * qps / (1.0 + r))     # mean of the two = qps
    state = int(rng.random() < 0.5)
    t, chunks = 0.0, []
    while t < duration:
        end = min(duration, t + rng.exponential(dwell))
        n = rng.poisson(rates[state] * (end - t))
        chunks.append(np.sort(rng.uniform(t, end, n)))
        t, state = end, 1 - state
    return np.concatenate(chunks) if chunks else np.empty(0)


def block_hashes(namespace: str, key: str, blocks: int) -> tuple[int, ...]:
    """Stable per-(namespace, key, index) 63-bit block hashes (splitmix64, vectorised)."""
    salt = int.from_bytes(hashlib.blake2b(f"{namespace}/{key}".encode(), digest_size=8).digest(), "little")
    with np.errstate(over="ignore"):
        z = np.uint64(salt) + np.arange(1, blocks + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return tuple(int(v) & MASK63 for v in z.tolist())


def _stationary(name, qps, duration, seed, rng, names, shares, cv, prefix_dist, suffix_dist,
                *, knobs, population, burst_dwell=None, replay=None):
    prefix = dict(zip(names, _block_align(prefix_dist.sample(rng, len(names))).tolist()))
    arrivals = arrival_times(rng, qps, duration, cv, burst_dwell, replay)
    key_idx = _draw(rng, shares, len(arrivals))
    rates = dict(zip(names, (qps * shares).tolist()))
    return _assemble(name, qps, duration, seed, rng, names, prefix, arrivals, key_idx,
                     suffix_dist, rates, (RateEpoch(0.0, rates),), knobs, population)


def _assemble(name, qps, duration, seed, rng, names, prefix, arrivals, key_idx, suffix_dist,
              rates, epochs, knobs, population) -> Workload:
    n = len(arrivals)
    suffix = suffix_dist.sample(rng, n).tolist()
    output = OUTPUT.sample(rng, n).tolist()
    blocks: dict[str, tuple[int, ...]] = {}
    requests = []
    for rid, (t, k, s, o) in enumerate(zip(arrivals.tolist(), key_idx.tolist(), suffix, output)):
        key = names[k]
        chain = blocks.get(key)
        if chain is None:
            chain = blocks[key] = block_hashes(name, key, prefix[key] // BLOCK_TOKENS)
        requests.append(Request(rid, t, key, prefix[key] + s, o, chain))
    return Workload(name, qps, duration, seed, requests, tuple(names), prefix, rates, epochs,
                    knobs, population)


def _draw(rng: np.random.Generator, shares: np.ndarray, n: int) -> np.ndarray:
    cdf = np.cumsum(shares)
    idx = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    return np.minimum(idx, len(shares) - 1)


def _block_align(tokens: np.ndarray) -> np.ndarray:
    return np.maximum(tokens // BLOCK_TOKENS, 1) * BLOCK_TOKENS


def _active_count(active_set: int | None, keys: int) -> int:
    if active_set is None or active_set == 0:
        return keys
    if not 0 < active_set <= keys:
        raise ValueError(f"active_set must be in 1..{keys}, got {active_set}")
    return int(active_set)


def _mean(values) -> float:
    total = n = 0
    for v in values:
        total += v
        n += 1
    return total / n if n else 0.0
