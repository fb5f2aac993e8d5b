"""bench/procs.py's capacity search: the highest accepted rate, surviving one noisy miss."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_procs", ROOT / "bench" / "procs.py")
procs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(procs)


def test_the_search_survives_one_miss_and_stops_after_two():
    offered = []

    def passes(rate):
        offered.append(rate)
        return rate in (100.0, 156.25)            # 125 is a noisy miss; 195 and 244 fail

    assert procs.highest_passing_rate(passes, 100.0, 1000.0) == 156.25
    assert offered == [100.0, 125.0, 156.25, 195.3125, 244.140625]
    assert procs.highest_passing_rate(lambda rate: False, 100.0, 1000.0) == 0.0
    assert procs.highest_passing_rate(lambda rate: True, 100.0, 150.0) == 125.0


def test_pct_by_rank():
    assert procs.pct([3.0, 1.0, 2.0], 0.5) == 2.0 and procs.pct([5.0], 0.99) == 5.0
    assert math.isnan(procs.pct([], 0.5))
