"""services.core.rates.RateHistory: bias-corrected EWMA of per-key rates."""

import math

import pytest

from services.core.rates import RateHistory


def test_first_fold_is_the_window_and_later_folds_decay():
    h = RateHistory(60.0).fold({"a": 30}, 30.0)
    assert h.rates() == {"a": 1.0} and h.seconds == 30.0
    h = h.fold({"b": 30}, 30.0)
    d = math.exp(-0.5)
    assert h.seconds == pytest.approx(30 * d + 30)
    assert h.rates() == pytest.approx({"a": 30 * d / h.seconds, "b": 30 / h.seconds})


def test_steady_stream_is_unbiased_and_silent_keys_leave():
    h = RateHistory(100.0)
    for _ in range(50):
        h = h.fold({"a": 20}, 10.0)
    assert h.rates()["a"] == pytest.approx(2.0)
    assert h.seconds == pytest.approx(10 * (1 - math.exp(-5.0)) / (1 - math.exp(-0.1)))
    for _ in range(200):
        h = h.fold({}, 10.0)
    assert h.rates() == {}


def test_seeded_history_and_bad_input():
    h = RateHistory.seeded(300.0, {"a": 2.0, "tiny": 1e-6}, 600.0)
    assert h.rates() == {"a": 2.0}                  # below the floor: not kept
    assert RateHistory(1.0).rates() == {}
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            RateHistory(bad)
    with pytest.raises(ValueError):
        RateHistory(1.0).fold({}, -1.0)


def test_nested_windows_weigh_older_slices_less():
    from services.core.rates import nested_window_rates

    # a steady 2 req/s key and a key that only sent in the oldest slice
    windows = [(30.0, {"a": 60}), (60.0, {"a": 120}), (120.0, {"a": 240, "old": 60})]
    r = nested_window_rates(windows, 60.0)
    assert r["a"] == pytest.approx(2.0)
    w = [math.exp(-15 / 60), math.exp(-45 / 60), math.exp(-90 / 60)]
    assert r["old"] == pytest.approx(w[2] * 60 / (30 * w[0] + 30 * w[1] + 60 * w[2]))
    assert nested_window_rates([], 10.0) == {}
    with pytest.raises(ValueError):
        nested_window_rates([(30.0, {}), (30.0, {})], 10.0)
