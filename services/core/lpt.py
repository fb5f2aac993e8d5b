"""LPT placement (the planning core's third step, services/core/planning.py): keys in placement
order, each to the k_b least-loaded distinct replicas (ties: lowest index), adding
lambda_b / k_b to each; every replica starts at the cold-tail load.

Speed: a binary heap of (load, replica) over R replicas, touched once per admitted key, except
runs of at least `_RUN` consecutive one-replica keys of equal rate (windowed counts make long
ties: a million keys of a 300 s window hold a few hundred distinct rates), which `_equal_run`
places at once with the heap's result, bit for bit (tests/unit/test_lpt_equivalence.py against
tests/reference/lpt_v1.py). `_RUN` only moves work between the two paths; the result is the same.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np


def place_lpt(rates: Sequence[float] | np.ndarray, sizes: Sequence[int] | np.ndarray, replicas: int,
              cold_load: float, *, rows: bool = True) -> tuple[list[tuple[int, ...]], list[float]]:
    """LPT over keys given in placement order: (replica indices per key, ascending; loads).
    rows=False: the loads only (the same floats; the rows list stays empty).

    Keys go through a binary heap of (load, replica) one by one, except runs of at least
    `_RUN` consecutive one-replica keys of equal rate (windowed counts make long ties: a
    million keys of a 300 s window hold a few thousand distinct rates), which `_equal_run`
    places at once with the heap's result (see there)."""
    lam = np.asarray(rates, dtype=np.float64)
    k = np.asarray(sizes, dtype=np.int64)
    n = len(lam)
    loads = [float(cold_load)] * replicas
    out: list[tuple[int, ...]] | None = [] if rows else None
    start = 0
    for s, e in _equal_runs(lam, k):
        if s > start:
            loads = _heap_span(lam[start:s].tolist(), k[start:s].tolist(), loads, out)
        placed = _equal_run(loads, float(lam[s]), e - s)
        if placed is None:
            loads = _heap_span(lam[s:e].tolist(), k[s:e].tolist(), loads, out)
        else:
            loads, reps = placed
            if out is not None:
                single = [(r,) for r in range(replicas)]
                out.extend(map(single.__getitem__, reps.tolist()))
        start = e
    if start < n:
        loads = _heap_span(lam[start:].tolist(), k[start:].tolist(), loads, out)
    return (out if out is not None else []), loads


_RUN = 256      # the shortest run `_equal_run` places (shorter ones: the heap, no numpy overhead)


def _equal_runs(lam: np.ndarray, k: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of >= _RUN consecutive one-replica keys with one positive rate."""
    n = len(lam)
    if n < _RUN:
        return []
    brk = np.flatnonzero((lam[1:] != lam[:-1]) | (k[1:] != k[:-1])) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [n]))
    keep = (ends - starts >= _RUN) & (k[starts] == 1) & (lam[starts] > 0)
    return list(zip(starts[keep].tolist(), ends[keep].tolist()))


def _heap_span(rates: list[float], sizes: list[int], loads: list[float],
               out: list[tuple[int, ...]] | None) -> list[float]:
    """The plain LPT step over one span of keys from `loads`: the heap of (load, replica)."""
    heap = [(load, i) for i, load in enumerate(loads)]
    heapq.heapify(heap)
    replace, pop, push = heapq.heapreplace, heapq.heappop, heapq.heappush
    if out is None:
        for lam, k in zip(rates, sizes):
            if k == 1:
                replace(heap, (heap[0][0] + lam, heap[0][1]))
                continue
            share = lam / k
            for load, i in [pop(heap) for _ in range(k)]:
                push(heap, (load + share, i))
    else:
        for lam, k in zip(rates, sizes):
            if k == 1:
                load, i = heap[0]
                replace(heap, (load + lam, i))
                out.append((i,))
                continue
            share = lam / k
            picked = [pop(heap) for _ in range(k)]
            for load, i in picked:
                push(heap, (load + share, i))
            out.append(tuple(sorted(i for _, i in picked)))
    loads = [0.0] * len(loads)
    for load, i in heap:
        loads[i] = load
    return loads


def _equal_run(loads: list[float], x: float, n: int) -> tuple[list[float], np.ndarray] | None:
    """n one-replica keys of rate x > 0 placed by LPT from `loads`, as the heap places them:
    (the loads after, each key's replica in order), or None when the run is too short for the
    loads' spread (then the heap does it).

    The heap gives each key the replica of least (load, index) and adds x; replica r's load
    after t keys is S[r, t] = (...(loads[r] + x) + x ...) + x, a non-decreasing sequence, so
    the keys take the first n entries of the R sequences merged in (load, r, t) order. The
    first T + 1 entries of each sequence are one cumsum (numpy accumulates in order, so each
    float is the heap's), their merge one stable sort; the n taken are the merge's first n
    exactly when no replica took all of its T + 1 entries (its next one, not generated, could
    come earlier), else T doubles."""
    R = len(loads)
    L = np.array(loads, dtype=np.float64)
    level = (float(L.sum()) + n * x) / R                 # the water level the run fills to
    T = int(math.ceil(max(level - float(L.min()), 0.0) / x)) + 2
    while R * (T + 1) <= 4 * n + 4 * R:
        seq = np.empty((R, T + 1), dtype=np.float64)
        seq[:, 0] = L
        seq[:, 1:] = x
        np.cumsum(seq, axis=1, out=seq)
        taken = np.argsort(seq.ravel(), kind="stable")[:n]      # ties: r (row-major) then t
        reps = taken // (T + 1)
        counts = np.bincount(reps, minlength=R)
        if (counts <= T).all():
            return seq[np.arange(R), counts].tolist(), reps
        T *= 2
    return None
