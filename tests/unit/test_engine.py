"""Engine model: hand-computed step times, prefix hits, eviction order, preemption, and the
decode fast-forward against plain stepping."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.engine import PROFILES, EngineModel, EngineProfile, get_profile, steps_until
from services.core.request import Request

P8 = PROFILES["llama3-8b-h100"]
P70 = PROFILES["llama3-70b-fp8-h100x2"]


def req(rid, prompt, output=1, blocks=(), arrival=0.0, key="k"):
    return Request(rid, arrival, key, prompt, output, tuple(blocks))


def chain(start, n):
    return tuple(range(start, start + n))


def refs(engine, blocks):
    """Per-block ref counts of the cached leading blocks."""
    _, _, path = engine._pool.lookup(blocks, len(blocks))
    out, pos = [], 0
    for node, end in path:
        out += [node.ref] * (end - pos)
        pos = end
    return out


def run_to_idle(engine, now=0.0):
    """Step until idle; return (end time, {rid: ttft}, {rid: cached}, finish order)."""
    ttft, cached, order = {}, {}, []
    arrivals = {s.rid: s.arrival for s in engine._seqs.values()}
    while (res := engine.step(now)) is not None:
        now += res.duration
        for rid, c in res.first_tokens:
            ttft[rid] = now - arrivals[rid]
            cached[rid] = c
        order += res.finished
    return now, ttft, cached, order


# -- step time ------------------------------------------------------------------------------

@pytest.mark.parametrize("profile, expected_ms", [(P8, 53), (P70, 167), (PROFILES["qwen2.5-32b-fp8-h100"], 155)])
def test_idle_ttft_of_2048_tokens_matches_formula_and_spec(profile, expected_ms):
    e = EngineModel(profile)
    e.add(req(1, 2048, 5), 0.0)
    res = e.step(0.0)
    exact = profile.t0 + max(profile.t_w, profile.a * 2048) + profile.b * 2048 ** 2 / 2
    assert res.duration == pytest.approx(exact, rel=1e-12)
    assert res.first_tokens == [(1, 0)]
    assert res.duration * 1e3 == pytest.approx(expected_ms, abs=1.0)


def test_hand_computed_values():
    # 8B: 1 ms + 2048*24us + 1.2ns*2048^2/2 = 52.6686 ms; 70B: 1.5 + 159.744 + 6.0817 ms
    assert P8.prefill_time(2048) == pytest.approx(0.0526685824, rel=1e-9)
    assert P70.prefill_time(2048) == pytest.approx(0.1673257408, rel=1e-9)


def test_long_prompt_is_chunked_at_the_token_budget():
    e = EngineModel(P8)
    e.add(req(1, 10_000, 2), 0.0)
    r1 = e.step(0.0)
    assert r1.first_tokens == [] and r1.decoded == []
    assert r1.duration == pytest.approx(P8.t0 + P8.a * 8192 + P8.b * 8192 ** 2 / 2)
    assert e.prefill_backlog == 10_000 - 8192
    r2 = e.step(r1.duration)
    n, c = 10_000 - 8192, 8192
    assert r2.duration == pytest.approx(P8.t0 + P8.a * n + P8.b * (n * c + n * n / 2))
    assert r2.first_tokens == [(1, 0)] and e.prefill_backlog == 0


def test_decode_step_time_uses_context_and_min_forward_time():
    e = EngineModel(P8)
    e.add(req(1, 100, 3), 0.0)
    e.add(req(2, 300, 3), 0.0)
    e.step(0.0)
    r = e.step(1.0)
    # two decodes: N=2 -> t_w dominates; K_dec = 100 + 300
    assert r.decoded == [1, 2]
    assert r.duration == pytest.approx(P8.t0 + P8.t_w + P8.d * 400)


def test_token_budget_shared_between_requests_in_fcfs_order():
    e = EngineModel(P8)
    e.add(req(1, 6000, 2), 0.0)
    e.add(req(2, 6000, 2), 0.0)
    r = e.step(0.0)
    assert r.first_tokens == [(1, 0)]
    # request 2 got the remaining 2192 tokens as its first chunk
    assert e.prefill_backlog == 6000 - 2192
    r = e.step(1.0)
    assert r.first_tokens == [(2, 0)] and r.decoded == [1, 2]


def test_max_running_limits_admission():
    e = EngineModel(dataclasses.replace(P8, max_running=2))
    for rid in (1, 2, 3):
        e.add(req(rid, 50, 4), 0.0)
    r = e.step(0.0)
    assert [rid for rid, _ in r.first_tokens] == [1, 2]
    assert e.running == 2 and e.waiting == 1


# -- prefix cache -----------------------------------------------------------------------------

def test_second_request_of_a_key_hits_the_shared_prefix():
    e = EngineModel(P8)
    prefix = chain(1000, 64)                       # 1024 shareable tokens
    e.add(req(1, 2048, 1, prefix), 0.0)
    assert e.step(0.0).finished == [1]
    e.add(req(2, 2048, 1, prefix), 1.0)
    r = e.step(1.0)
    assert r.first_tokens == [(2, 1024)]
    n, c = 1024, 1024
    assert r.duration == pytest.approx(P8.t0 + P8.a * n + P8.b * (n * c + n * n / 2))
    assert (e.requests, e.prompt_tokens, e.cached_tokens) == (2, 4096, 1024)


def test_hit_is_capped_so_one_token_is_computed():
    e = EngineModel(P8)
    prefix = chain(0, 8)
    e.add(req(1, 128, 1, prefix), 0.0)             # the prompt is exactly 8 full blocks
    e.step(0.0)
    e.add(req(2, 128, 1, prefix), 1.0)
    assert e.step(1.0).first_tokens == [(2, 7 * 16)]
    e.add(req(3, 129, 1, prefix), 2.0)             # one token more: all 8 blocks may hit
    assert e.step(2.0).first_tokens == [(3, 8 * 16)]


def test_concurrent_requests_share_blocks_with_ref_counts():
    e = EngineModel(P8)
    prefix = chain(0, 10)
    e.add(req(1, 200, 3, prefix), 0.0)
    e.step(0.0)
    e.add(req(2, 200, 3, prefix), 0.0)
    r = e.step(1.0)
    assert r.first_tokens == [(2, 160)]
    assert refs(e, prefix) == [2] * 10
    used = e.active_blocks
    # 10 shared + 2 private blocks each (200 tokens + decode -> 13 blocks per request)
    assert used == 10 + 2 * 3
    run_to_idle(e, 2.0)
    assert refs(e, prefix) == [0] * 10 and e.free_blocks == e.kv_blocks


def test_free_order_evicts_anonymous_tail_then_deepest_prefix_block_first():
    e = EngineModel(P8, kv_blocks=20)
    prefix = chain(100, 4)
    e.add(req(1, 80, 1, prefix), 0.0)              # 4 hashed blocks + 1 anonymous
    e.step(0.0)
    assert e.match(prefix) == 4 and e.free_blocks == 20
    # 15 never-used blocks sit ahead of request 1's; 17 new blocks take those, its anonymous
    # block and then its deepest hashed block
    e.add(req(2, 17 * 16, 1), 1.0)
    e.step(1.0)
    assert e.match(prefix) == 3 and e.cached_block_count() == 3
    # LRU: request 1's older blocks sit ahead of request 2's freshly freed ones
    e.add(req(3, 2 * 16, 1), 2.0)
    e.step(2.0)
    assert e.match(prefix) == 1 and e.cached_block_count() == 1


def test_hit_blocks_leave_the_free_queue_and_are_not_evicted():
    e = EngineModel(P8, kv_blocks=12)
    prefix = chain(0, 6)
    e.add(req(1, 6 * 16 + 8, 1, prefix), 0.0)      # 7 blocks
    e.step(0.0)
    e.add(req(2, 6 * 16 + 8, 20, prefix), 1.0)     # hits 6, holds 7
    e.step(1.0)
    e.add(req(3, 5 * 16, 1), 2.0)                  # 5 new blocks: all from the free queue, no hit block
    r = e.step(2.0)
    assert (3, 0) in r.first_tokens
    assert e.match(prefix) == 6


def test_eviction_from_the_lru_head_keeps_recently_used_prefixes():
    e = EngineModel(P8, kv_blocks=16)
    a, b = chain(0, 4), chain(50, 4)
    e.add(req(1, 64 + 16, 1, a), 0.0)
    e.step(0.0)
    e.add(req(2, 64 + 16, 1, b), 1.0)
    e.step(1.0)
    e.add(req(3, 64 + 16, 1, a), 2.0)              # touches a again -> a is most recent
    e.step(2.0)
    e.add(req(4, 16 * 12, 1), 3.0)                 # needs 12 blocks: 6 never used + anonymous + b's
    e.step(3.0)
    assert e.match(a) == 4 and e.match(b) < 4


# -- preemption ---------------------------------------------------------------------------------

def test_out_of_blocks_preempts_the_newest_running_request():
    e = EngineModel(P8, kv_blocks=8)
    e.add(req(1, 48, 40), 0.0)       # 3 blocks, grows by one block every 16 tokens
    e.add(req(2, 48, 40), 0.0)
    r = e.step(0.0)
    assert len(r.first_tokens) == 2 and e.free_blocks == 2
    preempted = []
    now = r.duration
    while (r := e.step(now)) is not None:
        now += r.duration
        preempted += r.preempted
        if preempted:
            break
    assert preempted == [2] and e.waiting == 1 and e.preemptions == 1
    end, ttft, _, order = run_to_idle(e, now)
    assert order == [1, 2] and e.requests == 2          # the first token is not counted twice
    assert ttft == {} and e.prefill_backlog == 0 and e.free_blocks == 8


def test_preempted_request_recomputes_prompt_and_generated_tokens():
    e = EngineModel(P8, kv_blocks=8)
    e.add(req(1, 48, 40), 0.0)
    e.add(req(2, 48, 40), 0.0)
    now = 0.0
    while not (r := e.step(now)).preempted:
        now += r.duration
    seq = e._seqs[2]
    assert seq.computed == 0 and seq.target == 48 + seq.generated and seq.generated > 1
    assert e.prefill_backlog == seq.target


def test_request_larger_than_the_pool_is_rejected():
    e = EngineModel(P8, kv_blocks=4)
    with pytest.raises(ValueError, match="more KV blocks"):
        e.add(req(1, 100, 1), 0.0)


def test_abort_frees_blocks_and_backlog():
    e = EngineModel(P8)
    e.add(req(1, 4000, 10, chain(0, 100)), 0.0)
    e.add(req(2, 9000, 10), 0.0)
    e.step(0.0)
    assert e.abort(2) and e.abort(1) and not e.abort(1)
    assert e.idle and e.free_blocks == e.kv_blocks and e.prefill_backlog == 0
    assert e.match(chain(0, 100)) == 100     # released blocks keep their hashes


def test_profiles_and_lookup():
    assert set(PROFILES) == {"llama3-8b-h100", "llama3-70b-fp8-h100x2", "qwen2.5-32b-fp8-h100"}
    assert get_profile("llama3-8b-h100").kv_blocks == 27_500
    with pytest.raises(ValueError, match="llama3-8b-h100"):
        get_profile("gpt-9")


# -- decode fast-forward ------------------------------------------------------------------------

@given(first=st.floats(1e-3, 0.1), growth=st.floats(0, 1e-3), dt=st.floats(0, 5), k_max=st.integers(1, 400))
def test_steps_until_is_the_first_boundary_at_or_after_dt(first, growth, dt, k_max):
    j = steps_until(first, growth, dt, k_max)
    end = lambda k: k * first + growth * k * (k - 1) / 2   # noqa: E731
    brute = next((k for k in range(1, k_max + 1) if end(k) >= dt), k_max)
    assert j == brute


def _trace(engine, reqs, fast):
    """Drive an engine through timed arrivals; return the event log and the counters."""
    pending = sorted(reqs, key=lambda r: (r.arrival, r.rid))
    log, now, i = [], 0.0, 0
    while i < len(pending) or not engine.idle:
        while i < len(pending) and pending[i].arrival <= now:
            engine.add(pending[i], pending[i].arrival)
            i += 1
        if engine.idle:
            now = pending[i].arrival
            continue
        if fast and engine.decode_only:
            k = engine.decode_horizon()
            if k >= 1:
                first, growth = engine.decode_step_params()
                if i < len(pending):   # stop at the boundary where the next arrival joins
                    k = steps_until(first, growth, pending[i].arrival - now, k)
                r = engine.advance_decode(k)
                now += r.duration
                log += [(round(now, 9), rid) for rid in r.finished]
                continue
        r = engine.step(now)
        now += r.duration
        log += [(round(now, 9), rid) for rid in r.finished]
    return log, (engine.requests, engine.cached_tokens, engine.preemptions, engine.free_blocks)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(1, 3), st.integers(1, 600), st.integers(1, 120)),
                min_size=1, max_size=12),
       st.sampled_from([40, 80, 2000]))
def test_fast_forward_matches_plain_stepping(specs, kv_blocks):
    reqs = []
    for rid, (arrival, key, prompt, output) in enumerate(specs):
        blocks = chain(key * 1000, min(prompt // 16, 8))
        reqs.append(req(rid, prompt, output, blocks, arrival=arrival, key=str(key)))
    reqs = [r for r in reqs if math.ceil((r.prompt_tokens + r.output_tokens) / 16) <= kv_blocks]
    slow = _trace(EngineModel(P8, kv_blocks), reqs, fast=False)
    fast = _trace(EngineModel(P8, kv_blocks), reqs, fast=True)
    assert [rid for _, rid in fast[0]] == [rid for _, rid in slow[0]]
    # both logs round times to 9 decimals, so they may differ by one unit in the last place
    assert [t for t, _ in fast[0]] == pytest.approx([t for t, _ in slow[0]], rel=1e-9, abs=2e-9)
    assert fast[1] == slow[1]


def test_decode_horizon_stops_at_first_finish_and_block_shortage():
    e = EngineModel(P8, kv_blocks=12)
    e.add(req(1, 16, 100), 0.0)
    e.add(req(2, 16, 5), 0.0)
    e.add(req(3, 16, 100), 0.0)
    e.step(0.0)                      # all prefilled: 1 block each, computed 16
    assert e.decode_only and e.decode_horizon() == 4
    r = e.advance_decode(4)
    assert r.finished == [2] and r.steps == 4 and r.decoded == [1, 2, 3]
    # requests 1 and 3: computed 20, 2 blocks each; the 8 free blocks let each grow to 6
    # blocks = 96 tokens, i.e. 76 more steps; the 77th needs a preemption
    assert e.decode_horizon() == 76
    e.advance_decode(76)
    assert e.decode_horizon() == 0 and e.free_blocks == 0
    assert e.step(1.0).preempted == [3]


def test_advance_decode_rejects_running_past_a_finish():
    e = EngineModel(P8)
    e.add(req(1, 16, 3), 0.0)
    e.step(0.0)
    with pytest.raises(ValueError):
        e.advance_decode(5)


def test_profile_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        P8.t0 = 0  # type: ignore[misc]
    assert isinstance(P8, EngineProfile)


def test_finished_requests_count_their_output_tokens_stepped_and_fast_forwarded():
    """The reporter's completion counters (the capacity advisor's mean output length)."""
    stepped, forwarded = EngineModel(P8), EngineModel(P8)
    for e in (stepped, forwarded):
        e.add(req(1, 100, 7), 0.0)
        e.add(req(2, 300, 30), 0.0)
    run_to_idle(stepped)
    now = 0.0
    while not forwarded.idle:
        if forwarded.decode_only and (k := forwarded.decode_horizon()) >= 1:
            now += forwarded.advance_decode(k).duration
        else:
            now += forwarded.step(now).duration
    for e in (stepped, forwarded):
        assert (e.finished_requests, e.output_tokens) == (2, 37)
    e = EngineModel(P8)
    e.add(req(3, 100, 50), 0.0)
    e.step(0.0)
    assert e.abort(3) and (e.finished_requests, e.output_tokens) == (0, 0)     # aborted: not counted
