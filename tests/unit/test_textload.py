"""Text workloads for bench/peers.py: seeded, byte-identical shared parts, unique turns, the
trace's prefix structure carried over exactly."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from clients import textload as tl
from services.core import routing


def test_same_arguments_same_bytes():
    a = tl.tenants(qps=20, duration=10, seed=3, tenants=30)
    b = tl.tenants(qps=20, duration=10, seed=3, tenants=30)
    assert [q.body("m") for q in a.requests] == [q.body("m") for q in b.requests]
    c = tl.tenants(qps=20, duration=10, seed=4, tenants=30)
    assert [q.body("m") for q in a.requests] != [q.body("m") for q in c.requests]


def test_tenant_system_prompt_is_byte_identical_and_turns_unique():
    wl = tl.tenants(qps=50, duration=20, seed=1, tenants=20)
    by_tenant: dict[str, set[str]] = {}
    turns = []
    for q in wl.requests:
        system, user = q.messages()
        assert system["role"] == "system" and user["role"] == "user"
        by_tenant.setdefault(q.group, set()).add(system["content"])
        turns.append(user["content"])
    assert all(len(texts) == 1 for texts in by_tenant.values())
    systems = [next(iter(t)) for t in by_tenant.values()]
    assert len(set(systems)) == len(systems)            # tenants never share a system prompt
    assert len(set(turns)) == len(turns)                # every user turn is unique
    for text in systems:
        assert 1024 <= routing.count_tokens(text) <= 4096
    for text in turns:
        assert 16 <= routing.count_tokens(text) <= 128


def test_tenant_prompt_and_length_do_not_depend_on_rate():
    lo = tl.tenants(qps=10, duration=30, seed=1, tenants=10)
    hi = tl.tenants(qps=40, duration=30, seed=1, tenants=10)
    sys_lo = {q.group: q.messages()[0]["content"] for q in lo.requests}
    sys_hi = {q.group: q.messages()[0]["content"] for q in hi.requests}
    common = set(sys_lo) & set(sys_hi)
    assert common and all(sys_lo[g] == sys_hi[g] for g in common)


def test_popularity_is_skewed_and_arrivals_match_the_rate():
    wl = tl.tenants(qps=100, duration=60, seed=2, tenants=400)
    n = len(wl.requests)
    assert abs(n - 6000) < 6 * 6000 ** 0.5
    assert all(0 <= q.at < 60 for q in wl.requests)
    assert [q.at for q in wl.requests] == sorted(q.at for q in wl.requests)
    d = wl.describe()
    assert 0.04 < d["top_group_share"] < 0.15              # sigma 1.65 over 400 tenants: the top one ~8%


def test_whales_carry_their_share():
    wl = tl.tenants(qps=100, duration=60, seed=5, tenants=100, whales=2, whale_share=0.6)
    whale = sum(1 for q in wl.requests if q.group.startswith("w"))
    assert abs(whale / len(wl.requests) - 0.6) < 0.03
    assert {q.group for q in wl.requests if q.group.startswith("w")} == {"w0", "w1"}


@pytest.mark.parametrize("knobs", [dict(tenants=0), dict(whales=2, whale_share=0.0), dict(whales=0, whale_share=0.3),
                                   dict(system_words=tl.WordRange(0, 10))])
def test_bad_tenant_knobs(knobs):
    with pytest.raises(ValueError):
        tl.tenants(qps=1, duration=1, seed=0, **knobs)


TRACE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 1000, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 2000, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]},
    {"timestamp": 4000, "input_length": 300, "output_length": 5, "hash_ids": [7]},
]


def _rows():
    return tl.read_mooncake([orjson.dumps(r) for r in TRACE])


def test_mooncake_prefixes_follow_the_hash_ids():
    wl = tl.mooncake(_rows(), qps=1.0, duration=100, block_words=32)
    texts = [q.messages()[0]["content"] for q in wl.requests]
    assert [routing.count_tokens(t) for t in texts] == [round(r["input_length"] * 32 / 512) for r in TRACE]
    # shared ids -> shared words, exactly: [0,1,2] vs [0,1,2,3] share 3 blocks (the first is cut at 1100/512)
    assert tl.shared_prefix_words(texts[0], texts[2]) == round(1100 * 32 / 512)
    assert tl.shared_prefix_words(texts[1], texts[2]) == round(700 * 32 / 512)
    assert tl.shared_prefix_words(texts[0], texts[3]) == 32            # block 0 only
    assert tl.shared_prefix_words(texts[0], texts[4]) < 4              # nothing (a chance word at most)
    assert [q.group for q in wl.requests] == ["0-1", "0-1", "0-1", "0-9", "7"]


def test_mooncake_rescales_arrivals_and_cuts_at_duration():
    wl = tl.mooncake(_rows(), qps=2.0, duration=1.6, block_words=32)  # native 1 req/s -> 2 req/s
    assert [q.at for q in wl.requests] == [0.0, 0.5, 1.0, 1.5]
    short = tl.mooncake(_rows(), qps=1.0, duration=100, block_words=32, max_words=40)
    assert [routing.count_tokens(q.messages()[0]["content"]) for q in short.requests] == [38, 19]


@pytest.mark.parametrize("line", [b"{}", b"not json", b'{"timestamp": 0, "input_length": 0, "hash_ids": [1]}',
                                  b'{"timestamp": 0, "input_length": 5, "hash_ids": []}'])
def test_bad_trace_lines_name_the_line(line):
    with pytest.raises(ValueError, match=r"trace:2"):
        tl.read_mooncake([orjson.dumps(TRACE[0]), line])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 600))
def test_words_is_a_pure_function(seed, n):
    text = tl.words(seed, n)
    assert text == tl.words(seed, n)
    assert routing.count_tokens(text) == n
    assert all(w in tl.WORDS for w in text.split())


def test_body_asks_for_usage_and_fixed_output():
    q = tl.tenants(qps=5, duration=2, seed=0, tenants=3, max_tokens=6).requests[0]
    doc = orjson.loads(q.body("m"))
    assert doc["stream"] is True and doc["stream_options"] == {"include_usage": True}
    assert doc["max_tokens"] == 6 and doc["ignore_eos"] is True and doc["model"] == "m"


def test_drift_rotates_the_popularity_ranks_every_period():
    base = tl.tenants(qps=60, duration=180, seed=5, tenants=40)
    wl = tl.tenants(qps=60, duration=180, seed=5, tenants=40, drift_period=60.0, drift_shift=10)
    assert wl.name == "drift" and [q.at for q in wl.requests] == [q.at for q in base.requests]
    for q, b in zip(wl.requests, base.requests):
        period = int(q.at // 60)
        rank = int(b.group[1:])                         # the base workload's tenant index is its rank
        assert q.group == f"t{(rank + 10 * period) % 40:04d}"
    def top(lo, hi):
        counts = {}
        for q in wl.requests:
            if lo <= q.at < hi:
                counts[q.group] = counts.get(q.group, 0) + 1
        return max(counts, key=counts.get)
    assert top(0, 60) == "t0000" and top(60, 120) == "t0010" and top(120, 180) == "t0020"
    # a tenant's system prompt does not change when its rank does
    prompts = {}
    for q in wl.requests:
        prompts.setdefault(q.group, set()).add(q.messages()[0]["content"])
    assert all(len(v) == 1 for v in prompts.values())
    with pytest.raises(ValueError, match="drift"):
        tl.tenants(qps=1, duration=10, drift_period=60.0)
