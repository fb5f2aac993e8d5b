"""Per-key rate history: an exponentially weighted average over a horizon (pure).

The paper's planner plans from aggregated per-key rate data, not from one short window. A
planner (the service's control loop, or the simulator's planned policies) folds each
interval's arrival counts into a `RateHistory`:

    counts_b <- e^(-w/H) counts_b + new_b        T <- e^(-w/H) T + w        rate_b = counts_b / T

with w the seconds the new counts cover and H the horizon. Dividing by the weighted time T
(not by H) removes the start-up bias: the first fold gives exactly the window's rates, and a
steady stream's estimate stays unbiased while its variance falls as T grows towards H. A key
whose weighted count decays below `floor` (default 0.05 requests) is dropped, so keys that
stopped sending traffic leave the history. `seeded` starts from rates known beforehand
(aggregated logs), weighted as `seconds` of observation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class RateHistory:
    horizon: float
    counts: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    seconds: float = 0.0
    floor: float = 0.05

    def __post_init__(self) -> None:
        if not (self.horizon > 0 and math.isfinite(self.horizon)):
            raise ValueError(f"rate horizon must be a positive number of seconds, got {self.horizon}")

    @classmethod
    def seeded(cls, horizon: float, rates: Mapping[str, float], seconds: float, floor: float = 0.05) -> RateHistory:
        """A history that already holds `seconds` of observation at `rates` (req/s)."""
        if seconds < 0:
            raise ValueError("seeded history needs seconds >= 0")
        counts = {k: r * seconds for k, r in rates.items() if r * seconds >= floor}
        return cls(horizon, MappingProxyType(counts), float(seconds) if counts else 0.0, floor)

    def fold(self, counts: Mapping[str, float], seconds: float) -> RateHistory:
        """The history after `counts` arrivals per key over the next `seconds`."""
        if seconds < 0:
            raise ValueError("fold needs seconds >= 0")
        decay = math.exp(-seconds / self.horizon)
        out: dict[str, float] = {}
        for k, v in self.counts.items():
            v *= decay
            if v >= self.floor or k in counts:
                out[k] = v
        for k, c in counts.items():
            out[k] = out.get(k, 0.0) + c
        return RateHistory(self.horizon, MappingProxyType(out), self.seconds * decay + seconds, self.floor)

    def rates(self) -> dict[str, float]:
        """Per-key req/s (empty before any observation)."""
        if self.seconds <= 0:
            return {}
        return {k: v / self.seconds for k, v in self.counts.items()}


def nested_window_rates(windows: Sequence[tuple[float, Mapping[str, float]]], horizon: float) -> dict[str, float]:
    """Per-key EWMA rates from nested telemetry windows, statelessly (what the planner service
    computes from the collector's buckets): `windows` are (span seconds, arrival counts per
    key over the last `span` seconds), spans increasing, each window containing the previous.
    Consecutive windows give disjoint slices [span_{k-1}, span_k) of the past; each slice's
    counts are weighted by e^(-age/H) at its midpoint age, and the weighted counts divided by
    the weighted time, so a steady stream's rate is unbiased. Negative slice counts (a key
    counted in a shorter window but not fully in a longer one, from bucket rounding) clip to 0."""
    if not (horizon > 0 and math.isfinite(horizon)):
        raise ValueError(f"rate horizon must be a positive number of seconds, got {horizon}")
    weighted: dict[str, float] = {}
    time_w = 0.0
    prev_span, prev = 0.0, {}
    for span, counts in windows:
        if span <= prev_span:
            raise ValueError("window spans must increase")
        w = math.exp(-(prev_span + span) / 2.0 / horizon)
        for k, c in counts.items():
            slice_count = c - prev.get(k, 0.0)
            if slice_count > 0:
                weighted[k] = weighted.get(k, 0.0) + w * slice_count
        time_w += w * (span - prev_span)
        prev_span, prev = span, counts
    return {k: v / time_w for k, v in weighted.items()} if time_w > 0 else {}
