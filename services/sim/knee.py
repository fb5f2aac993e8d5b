"""q_cap, measured: the knee search on the simulated engine (SPEC section 1).

q_cap: req/s one replica carries at its latency knee, measured, never derived from a formula
(the paper measures it on a real engine under increasing load). We measure it on the
simulated engine:
  1. Slice the workload the way a plan slices it: keys ranked by request count, replica 0's
     share is every R-th key (ranks 0, R, 2R, ...), so the slice mixes hot and cold keys
     like an LPT placement and carries ~1/R of the traffic.
  2. Replay the slice's requests, in order, on one replica as a Poisson stream at rate q
     (seeded), `samples` requests per run (the slice is cycled if shorter), and measure
     p99 TTFT over all but the first 20% (cache warm-up).
  3. The baseline is p99 at a light load (`q_low`). Double q until p99 exceeds
     `knee_factor` x baseline, then bisect `iterations` times: q_cap is the highest rate
     that stayed under the bound ("where tail latency starts to blow up").
Defaults (knee 3x, 1,200 samples, 6 bisections: ~3% resolution) take a few seconds per
profile and workload and are cached per process.

The search takes the one-replica run as a function (`run`), so it imports nothing of the
simulator; services/sim/calibrate.py binds it to the simulator for every other caller.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from services.core.engine import EngineProfile
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import BLOCK_TOKENS, Request

_CACHE: dict[tuple, float] = {}


def replica_slice(requests: Sequence[Request], replicas: int) -> list[Request]:
    """Replica 0's share under a placement that deals ranked keys round-robin."""
    counts = Counter(q.key for q in requests)
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    mine = set(ranked[::max(1, replicas)])
    return [q for q in requests if q.key in mine]


class Single:
    """The policy of a one-replica cluster."""

    name = "single"

    def pick(self, request: Request, state: ClusterState) -> Pick:
        return Pick(0, Reason.FALLBACK)

    def set_plan(self, plan: object | None) -> None:
        pass


RunAlone = Callable[[EngineProfile, Sequence[Request], dict], float]
"""(profile, timed requests, SimConfig keywords) -> p99 TTFT of one replica serving them under
`Single`: the simulator passes it in (services.sim.simulator.p99_alone), so this module sits
below the simulator and the simulator can calibrate itself without an import circle."""


def p99_at(profile: EngineProfile, stream: Sequence[Request], qps: float, *, run: RunAlone, seed: int = 0,
           kv_blocks: int | None = None, warm_share: float = 0.2) -> float:
    """p99 TTFT of one replica fed `stream` (in order) as a Poisson process at `qps`."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / qps, len(stream))).tolist()
    reqs = [replace(q, rid=i, arrival=t) for i, (q, t) in enumerate(zip(stream, times))]
    warmup = times[int(len(times) * warm_share)]
    options = dict(kv_blocks=kv_blocks, warmup=warmup, end=times[-1] + 1e-9, drain_limit=math.inf,
                   prefix_oracle=False)
    return run(profile, reqs, options)


def calibrate_q_cap(profile: EngineProfile, requests: Sequence[Request], replicas: int, *, run: RunAlone,
                    kv_blocks: int | None = None, knee_factor: float = 3.0, q_low: float = 0.25,
                    samples: int = 1200, iterations: int = 6, seed: int = 0) -> float:
    """Measure q_cap (module header)."""
    mine = replica_slice(requests, replicas)
    if not mine:
        raise ValueError("no requests to calibrate on")
    fitting = [q for q in mine if math.ceil((q.prompt_tokens + q.output_tokens) / BLOCK_TOKENS)
               <= (kv_blocks or profile.kv_blocks)]
    stream = [fitting[j % len(fitting)] for j in range(samples)]
    bound = knee_factor * p99_at(profile, stream, q_low, run=run, seed=seed, kv_blocks=kv_blocks)
    ok = lambda q: p99_at(profile, stream, q, run=run, seed=seed, kv_blocks=kv_blocks) <= bound  # noqa: E731
    lo, hi = q_low, 2 * q_low
    while ok(hi):
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return lo
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def q_cap_for(profile: EngineProfile, requests: Sequence[Request], replicas: int, *, run: RunAlone,
              kv_blocks: int | None = None, **knobs) -> float:
    """calibrate_q_cap, cached per process by profile and a fingerprint of the workload."""
    fingerprint = (len(requests), sum(q.prompt_tokens for q in requests[:2000]),
                   len({q.key for q in requests[:2000]}))
    key = (profile, kv_blocks, replicas, fingerprint, tuple(sorted(knobs.items())))
    if key not in _CACHE:
        _CACHE[key] = calibrate_q_cap(profile, requests, replicas, run=run, kv_blocks=kv_blocks, **knobs)
    return _CACHE[key]
