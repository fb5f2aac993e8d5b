"""bench/spy_shares.py: inclusive and self shares of a py-spy raw profile, one thread's samples,
a function counted once per stack however often it recurs there. Stacks are made up."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import spy_shares  # noqa: E402

RAW = [
    "thread (1): MainThread;run (a.py:1);handle (b.py:5);write (c.py:9) 6\n",
    "thread (1): MainThread;run (a.py:1);handle (b.py:5);handle (b.py:7) 3\n",     # recursion: counted once
    "thread (1): MainThread;run (a.py:2) 1\n",
    "thread (2): worker;poll (d.py:3) 50\n",                                        # another thread: left out
    "garbage line\n",
]


def test_shares_of_one_thread():
    total, inclusive, own = spy_shares.shares(RAW, "MainThread")
    assert total == 10
    assert inclusive["run (a.py)"] == 10 and inclusive["handle (b.py)"] == 9 and inclusive["write (c.py)"] == 6
    assert own == {"write (c.py)": 6, "handle (b.py)": 3, "run (a.py)": 1}
    assert "poll (d.py)" not in inclusive
