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
from typing import Mapping


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
