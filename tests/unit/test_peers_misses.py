"""bench/peers_misses.py: the miss accounting's categories and identity, the infinite-cache bound,
the hit-rate series and the dip after an event, on hand-made prompts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from clients import textload as tl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pm():
    spec = importlib.util.spec_from_file_location("peers_misses", ROOT / "bench" / "peers_misses.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def chat(system_words: int, seed: int, turn_seed: int) -> list[dict]:
    return [{"role": "system", "content": tl.words(seed, system_words)},
            {"role": "user", "content": tl.words(turn_seed, 20)}]


def test_categories_follow_the_key_history(pm):
    # tenant A four times (homes e1, e1, e2, e1 via fallback), tenant B once
    shapes = [pm.prompt_shape("A", chat(320, 1, 100 + i)) for i in range(4)] + [pm.prompt_shape("B", chat(320, 2, 9))]
    reusable, bound = pm.reusable_and_bound(shapes)
    assert reusable[0] == reusable[1] > 300 and reusable[4] == 0        # B shares its prompt with no one
    assert bound[0] == 0 and bound[1] == reusable[1]                    # seen before only from the second on
    full = reusable[1]
    served = [pm.Served(0.0, True, shapes[0].tokens, 0, "e1"),
              pm.Served(1.0, True, shapes[1].tokens, full, "e1"),
              pm.Served(2.0, True, shapes[2].tokens, 0, "e2"),
              pm.Served(3.0, True, shapes[3].tokens, 0, "e3", "fallback"),
              pm.Served(4.0, True, shapes[4].tokens, 0, "e1")]
    cats = pm.classify(shapes, served)
    assert [c for c, _ in cats] == ["first_sight", "evicted", "first_on_replica", "spilled", "first_sight"]
    assert [m for _, m in cats] == [full, 0, full, full, 0]
    acc = pm.account(shapes, served, warmup=0.0)
    prompt = sum(s.tokens for s in shapes)
    assert acc["hit"] == pytest.approx(full / prompt)
    assert acc["hit"] + sum(acc["missed"].values()) == pytest.approx(acc["reusable"])
    assert acc["missed_requests"] == {"first_sight": 1, "spilled": 1, "first_on_replica": 1, "evicted": 0}
    assert acc["bound"] == pytest.approx(3 * full / prompt)
    # the measured window starts later, the history does not: A's request at 2 s is still first-on-replica
    late = pm.account(shapes, served, warmup=2.0)
    assert late["missed_requests"] == {"first_sight": 0, "spilled": 1, "first_on_replica": 1, "evicted": 0}


def test_an_evicted_prefix_and_a_failed_request(pm):
    shapes = [pm.prompt_shape("A", chat(160, 1, i)) for i in range(3)]
    full = pm.reusable_and_bound(shapes)[0][1]
    served = [pm.Served(0.0, True, shapes[0].tokens, 0, "e1"), pm.Served(1.0, False, 0, 0, ""),
              pm.Served(2.0, True, shapes[2].tokens, 16, "e1")]
    cats = pm.classify(shapes, served)
    assert cats[1] == ("", 0) and cats[2] == ("evicted", full - 16)
    with pytest.raises(ValueError, match="2 prompts but 3 outcomes"):
        pm.classify(shapes[:2], served)


def test_series_bins_and_dips(pm):
    served = [pm.Served(t, t != 25.0, 100, 90 if t < 30 else 40, "e1") for t in (1.0, 5.0, 12.0, 25.0, 31.0, 45.0)]
    series = pm.time_series(served, 10.0, end=50.0)
    assert [b["t"] for b in series] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert [b["hit"] for b in series] == [0.9, 0.9, None, 0.4, 0.4]
    assert [b["errors"] for b in series] == [0, 0, 1, 0, 0]
    assert pm.worst_dip(series, [30.0]) == pytest.approx(0.5)
    assert pm.worst_dip(series, [10.0], after=2) == 0.0 and pm.worst_dip(series, [10.0]) == pytest.approx(0.5)
    assert pm.worst_dip(series, []) is None
    with pytest.raises(ValueError):
        pm.time_series(served, 0.0)


def test_paired_dip_is_the_drop_below_the_control_after_an_event(pm):
    def bins(hits):
        return [{"t": 10.0 * i, "hit": h, "requests": 1, "errors": 0} for i, h in enumerate(hits)]
    control = bins([0.8, 0.9, 0.7, 0.9, 0.9, 0.8])
    run = bins([0.8, 0.88, 0.7, 0.75, 0.85, 0.8])     # the event at 30 s costs 15 points in its bin
    got = pm.paired_dip(run, control, [30.0], start=10.0)
    assert got["dip"] == pytest.approx(0.15) and got["floor"] == pytest.approx(0.02)
    assert got["mean"] == pytest.approx((0.0 + 0.15 + 0.05 + 0.0) / 4)     # bins 20-50 s: the event's reach
    # the mix's own ups and downs (bin 2's 0.7 in both) are not a dip: only the difference counts
    assert pm.paired_dip(control, control, [20.0])["dip"] == 0.0
    assert pm.paired_dip(run, control, []) is None
    # bins before the event and more than `after` bins after it are outside the dip's reach
    assert pm.paired_dip(run, control, [0.0], after=1)["dip"] == pytest.approx(0.0)
