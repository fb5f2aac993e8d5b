"""Ideal hit rate of a trace over a simulator's measured window (experiment f).

`services.core.traces.ideal_hit_rate` feeds the whole stream to one infinite cache. The
simulator measures only arrivals in [warm-up, end), whose predecessors (the warm-up included)
have already been seen, so the comparable ceiling counts hits and prompt tokens of the window's
requests only, with every earlier request's blocks in the cache.
"""

from __future__ import annotations

from typing import Sequence

from services.core.request import BLOCK_TOKENS, Request


def ideal_window_hit_rate(requests: Sequence[Request], start: float, end: float) -> float:
    """Token hit rate of one infinite cache over requests arriving in [start, end); requests
    before `start` only fill the cache."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        if r.arrival >= end:
            break
        if r.arrival >= start:
            limit = min(len(r.blocks), (r.prompt_tokens - 1) // BLOCK_TOKENS)
            n = 0
            while n < limit and r.blocks[n] in seen:
                n += 1
            hit += n * BLOCK_TOKENS
            total += r.prompt_tokens
        seen.update(r.blocks)
    return hit / total if total else 0.0
