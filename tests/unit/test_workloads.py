import math

import numpy as np
import pytest

from services.core.request import BLOCK_TOKENS
from services.core.workloads import (
    PAPER_KEYS,
    WORKLOADS,
    arrival_times,
    gini,
    lognormal_shares,
    make_workload,
)


def test_paper_population_matches_the_papers_statistics():
    shares = lognormal_shares(PAPER_KEYS, 1.65)
    assert len(shares) == 128_824
    assert shares.sum() == pytest.approx(1.0)
    assert gini(shares) == pytest.approx(0.756, abs=0.005)
    top4 = shares[: int(0.04 * PAPER_KEYS)].sum()
    assert top4 == pytest.approx(0.47, abs=0.015)
    assert shares.max() <= 0.003
    assert np.all(np.diff(shares) <= 0)          # hottest first


def test_gini_of_known_vectors():
    assert gini(np.ones(10)) == pytest.approx(0.0)
    one_hot = np.zeros(1000)
    one_hot[0] = 1.0
    assert gini(one_hot) == pytest.approx(0.999)


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_is_deterministic_and_sorted(name):
    a = make_workload(name, qps=50, duration=60, seed=7)
    b = make_workload(name, qps=50, duration=60, seed=7)
    c = make_workload(name, qps=50, duration=60, seed=8)
    assert [(r.arrival, r.key, r.prompt_tokens, r.output_tokens) for r in a.requests] == \
           [(r.arrival, r.key, r.prompt_tokens, r.output_tokens) for r in b.requests]
    assert [r.arrival for r in a.requests] != [r.arrival for r in c.requests]
    arrivals = [r.arrival for r in a.requests]
    assert arrivals == sorted(arrivals)
    assert all(0 <= t < 60 for t in arrivals)
    assert [r.rid for r in a.requests] == list(range(len(a.requests)))


@pytest.mark.parametrize("name", WORKLOADS)
def test_requests_of_a_key_share_one_blocks_tuple(name):
    w = make_workload(name, qps=50, duration=60, seed=1)
    by_key = {}
    for r in w.requests:
        first = by_key.setdefault(r.key, r.blocks)
        assert r.blocks is first
        assert len(r.blocks) * BLOCK_TOKENS == w.prefix_tokens[r.key]
        assert r.prompt_tokens > w.prefix_tokens[r.key]          # unique suffix exists
        assert r.prefix_tokens == w.prefix_tokens[r.key]
        assert r.output_tokens >= 1
    shared = w.knobs.get("shared_tokens", 0) // BLOCK_TOKENS     # flagship: one prefix every key shares
    seen = set()
    for chain in by_key.values():       # distinct keys never share a block hash beyond that prefix
        assert chain[:shared] == next(iter(by_key.values()))[:shared]
        assert not seen & set(chain[shared:])
        seen |= set(chain[shared:])


def test_request_count_follows_qps_and_key_mix_follows_rates():
    w = make_workload("paper", qps=200, duration=300, seed=3)
    n = len(w.requests)
    assert n == pytest.approx(60_000, rel=0.02)
    counts = {}
    for r in w.requests:
        counts[r.key] = counts.get(r.key, 0) + 1
    hot = w.keys[0]
    assert counts[hot] / 300 == pytest.approx(w.rates[hot], rel=0.1)
    assert sum(w.rates.values()) == pytest.approx(200)
    assert len(w.keys) == 128 and set(counts) <= set(w.keys)


def test_active_set_selects_the_top_keys():
    w = make_workload("paper", qps=100, duration=30, seed=1, active_set=256)
    assert len(w.keys) == 256
    rates = [w.rates[k] for k in w.keys]
    assert rates == sorted(rates, reverse=True)
    assert w.describe()["knobs"]["active_set"] == 256


@pytest.mark.parametrize("cv", [1.0, 1.9])
def test_arrival_cv(cv):
    rng = np.random.default_rng(0)
    t = arrival_times(rng, 100.0, 500.0, cv)
    gaps = np.diff(t)
    assert len(t) == pytest.approx(50_000, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.07)


def test_paper_regime_sizing():
    """Flat-LB's working set (all active prefixes) must exceed a 70B replica's cache
    (225,600 tokens) while a planned replica's ~4.3 keys fit easily (SPEC section 5)."""
    w = make_workload("paper", qps=100, duration=30, seed=1)
    total_prefix = sum(w.prefix_tokens.values())
    assert total_prefix > 1.5 * 14_100 * BLOCK_TOKENS
    assert total_prefix / 30 < 0.15 * 14_100 * BLOCK_TOKENS
    assert w.describe()["reusable_token_share"] > 0.85


def test_low_reuse_has_little_recoverable_prefix():
    d = make_workload("low-reuse", qps=100, duration=30, seed=1).describe()
    assert d["reusable_token_share"] < 0.2


def test_whales_exceed_a_per_replica_capacity():
    w = make_workload("whale", qps=240, duration=30, seed=1)
    whale_rates = [w.rates[f"w{i}"] for i in range(4)]
    assert sum(whale_rates) == pytest.approx(0.35 * 240)
    q_cap = 500 / 30
    assert all(math.ceil(r / q_cap) > 1 for r in whale_rates)
    base_max = max(v for k, v in w.rates.items() if k.startswith("k"))
    assert base_max < q_cap


def test_drift_rates_walk_with_sigma_and_stream_follows_them():
    w = make_workload("drift", qps=200, duration=600, seed=5, interval=100.0)
    assert len(w.epochs) == 6
    r0 = np.array([w.epochs[0].rates[k] for k in w.keys])
    r1 = np.array([w.epochs[1].rates[k] for k in w.keys])
    assert r0.sum() == pytest.approx(200) and r1.sum() == pytest.approx(200)
    steps = np.diff(np.log([[e.rates[k] for k in w.keys] for e in w.epochs]), axis=0)
    steps -= steps.mean(axis=1, keepdims=True)      # renormalisation shifts every key equally
    assert steps.std() == pytest.approx(0.3, rel=0.1)
    assert w.rates_at(150.0) is w.epochs[1].rates
    # the request stream follows each epoch's rates: compare the most-changed key
    k = w.keys[int(np.argmax(np.abs(r1 - r0)))]
    n0 = sum(1 for r in w.requests if r.key == k and r.arrival < 100)
    n1 = sum(1 for r in w.requests if r.key == k and 100 <= r.arrival < 200)
    assert np.sign(n1 - n0) == np.sign(w.epochs[1].rates[k] - w.epochs[0].rates[k])


def test_unknown_workload_and_knob_errors_list_the_valid_ones():
    with pytest.raises(ValueError, match="paper, whale, low-reuse, drift"):
        make_workload("nope", qps=1, duration=1, seed=0)
    with pytest.raises(ValueError, match="active_set"):
        make_workload("paper", qps=1, duration=1, seed=0, bogus=3)
    with pytest.raises(ValueError):
        make_workload("paper", qps=0, duration=1, seed=0)


def test_generation_at_scale_has_the_offered_count():
    # its speed is a benchmark figure (bench/sim_speed.py prints the generation time), not a test
    w = make_workload("paper", qps=1000, duration=100, seed=0)
    assert len(w.requests) == pytest.approx(100_000, rel=0.02)


def test_flagship_draws_the_whole_population_behind_one_shared_prefix():
    w = make_workload("flagship", qps=200, duration=60, seed=2, shared_tokens=1024, context_median=512)
    ranks = [int(r.key[1:]) for r in w.requests]
    assert max(ranks) > 100_000                        # the cold tail of the 128,824 keys sends traffic
    assert sum(k < 5_153 for k in ranks) / len(ranks) == pytest.approx(0.46, abs=0.03)   # top 4%
    assert max(w.rates.values()) / 200 < 0.003                                          # no key > 0.3%
    shared = w.requests[0].blocks[:64]
    assert all(r.blocks[:64] == shared for r in w.requests)
    assert all(r.prefix_tokens >= 1024 + 16 for r in w.requests)


def test_mmpp_bursts_keep_their_cv_after_thinning_to_one_replica():
    from services.core.workloads import arrival_times, mmpp_ratio

    assert mmpp_ratio(1.0) == pytest.approx(1.0)
    r = mmpp_ratio(1.9)
    assert (1 + r) ** 2 / (2 * r) - 1 == pytest.approx(1.9 ** 2)
    rng = np.random.default_rng(0)
    t = arrival_times(rng, 100.0, 1500.0, 1.9, burst_dwell=10.0)
    gaps = np.diff(t)
    assert len(t) / 1500.0 == pytest.approx(100.0, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.9, rel=0.1)
    one = np.diff(t[rng.random(len(t)) < 1 / 30])           # one replica's share
    assert one.std() / one.mean() > 1.5                       # gamma gaps thin to ~1.04
    w = make_workload("paper", qps=50, duration=30, seed=1, cv=1.9, burst_dwell=5.0)
    assert w.knobs["burst_dwell"] == 5.0
    assert [q.arrival for q in w.requests] == [q.arrival for q in
                                               make_workload("paper", qps=50, duration=30, seed=1, cv=1.9,
                                                             burst_dwell=5.0).requests]


def test_flagship_active_set_draws_the_top_keys_only_and_defaults_to_the_population():
    w = make_workload("flagship", qps=200, duration=30, seed=2, active_set=512)
    ranks = [int(r.key[1:]) for r in w.requests]
    assert max(ranks) < 512 and len(set(ranks)) > 400
    assert w.knobs["active_set"] == 512
    assert sum(w.rates.values()) <= 200 + 1e-6 and max(w.rates.values()) / 200 > 0.01   # renormalised
    full = make_workload("flagship", qps=50, duration=10, seed=2)
    same = make_workload("flagship", qps=50, duration=10, seed=2, active_set=0)
    assert full.knobs["active_set"] == 128_824
    assert [(q.key, q.arrival, q.prompt_tokens) for q in full.requests] == \
        [(q.key, q.arrival, q.prompt_tokens) for q in same.requests]
    # context lengths do not depend on the active set: key k's prefix is the same in both
    top = make_workload("flagship", qps=50, duration=10, seed=2, active_set=1024)
    common = set(top.prefix_tokens) & set(full.prefix_tokens)
    assert common and all(top.prefix_tokens[k] == full.prefix_tokens[k] for k in common)
    with pytest.raises(ValueError, match="active_set"):
        make_workload("flagship", qps=50, duration=10, seed=2, active_set=200_000)
