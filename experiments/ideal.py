"""Ideal hit rate of a trace over a simulator's measured window (experiment f).

`services.core.traces.ideal_hit_rate` feeds the whole stream to one infinite cache. The
simulator measures only arrivals in [warm-up, end), whose predecessors (the warm-up included)
have already been seen, so the comparable ceiling counts hits and prompt tokens of the window's
requests only, with every earlier request's blocks in the cache.
"""

from __future__ import annotations

from typing import Sequence

from services.core.request import Request
from services.core.traces import window_hit_bound


def ideal_window_hit_rate(requests: Sequence[Request], start: float, end: float) -> float:
    """Token hit rate of one infinite cache over requests arriving in [start, end); requests
    before `start` only fill the cache (services.core.traces.window_hit_bound)."""
    return window_hit_bound(requests, start, end)
