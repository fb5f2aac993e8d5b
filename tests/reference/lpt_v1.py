"""LPT placement as it was before equal-rate runs were placed by one merge (build1m branch
base, 057c3eb): the reference tests/unit/test_lpt_equivalence.py compares
services.core.planning.place_lpt against, key for key and bit for bit. Not used by any service."""
from __future__ import annotations

import heapq
from typing import Sequence


def place_lpt(rates: Sequence[float], sizes: Sequence[int], replicas: int,
              cold_load: float, *, rows: bool = True) -> tuple[list[tuple[int, ...]], list[float]]:
    heap = [(cold_load, i) for i in range(replicas)]
    out: list[tuple[int, ...]] = []
    replace, pop, push = heapq.heapreplace, heapq.heappop, heapq.heappush
    if not rows:
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
    loads = [0.0] * replicas
    for load, i in heap:
        loads[i] = load
    return out, loads
