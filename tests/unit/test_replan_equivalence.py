"""The vectorised re-planner and switching rule decide exactly what the per-key Python ones did
(tests/reference/*_v1.py, main at 9a5bbe9): same table key for key, bit-identical loads, same
churn and move count, same switching figures and verdicts, on seeded inputs that exercise
k_b > 1, shrinking and growing k_b, dropped, renamed and new replicas, homes, move caps and
forced rebalancing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from services.core import replan, switching
from services.core.planning import build_plan
from tests.reference import replan_v1, switching_v1


def same_plan(a, b) -> None:
    assert dict(a.table) == dict(b.table)
    assert list(a.table) == list(b.table)
    assert dict(a.rates) == dict(b.rates)
    assert list(a.rates.items()) == list(b.rates.items())      # the order the write step stores
    assert a.expected_load == b.expected_load
    assert a.predicted_imbalance == b.predicted_imbalance
    assert a.churn == b.churn
    assert a.admitted_rate_share == b.admitted_rate_share
    assert dict(a.extra) == dict(b.extra)
    assert (a.version, a.parent_version, a.builder, a.admitted_keys, a.total_keys, a.replica_ids) == \
           (b.version, b.parent_version, b.builder, b.admitted_keys, b.total_keys, b.replica_ids)


def workload(n: int, seed: int, sigma: float = 1.65):
    rng = np.random.default_rng(seed)
    keys = [f"t{seed}-{i}" for i in range(n)]
    return keys, rng.lognormal(0.0, sigma, n), rng


def drift(keys, rates, rng, sigma=0.3, new=0.05, drop=0.05, tag="new"):
    out = rates * np.exp(rng.normal(0.0, sigma, len(rates)))
    keep = rng.random(len(keys)) >= drop
    fresh = [f"{k}-{tag}" for k in np.array(keys)[rng.random(len(keys)) < new].tolist()]
    k2 = [k for k, x in zip(keys, keep) if x] + fresh
    r2 = np.concatenate([out[keep], rng.lognormal(0.0, 1.65, len(fresh))])
    perm = rng.permutation(len(k2))
    return [k2[i] for i in perm], r2[perm]


IDS = tuple(f"r{i}" for i in range(8))
CASES = [
    # (keys, replica ids after, q_cap, warm slots, tolerance, max_moves, homes)
    (3000, IDS, 4.0, 100, 0.05, None, False),
    (3000, IDS, 0.4, 60, 0.05, None, False),          # hot keys need k_b = 2..8; k_b changes
    (3000, IDS, 0.4, 2000, 0.0, None, False),         # all admitted, tolerance 0: rebalancing moves
    (3000, IDS, 1e9, 1000, 0.0, None, False),         # all admitted, k_b = 1: many moves
    (3000, IDS, 1e9, 1000, 0.0, 3, False),            # capped moves
    (3000, IDS[:6], 0.7, 80, 0.05, None, False),      # two replicas gone
    (3000, IDS + ("r8", "r9"), 0.7, 80, 0.05, None, False),   # two added
    (3000, tuple(reversed(IDS)), 0.7, 80, 0.05, None, False),  # same ids, another order
    (3000, IDS, 2.0, 400, 0.02, None, True),          # homes (cold-tail ring)
    (2000, IDS, 1e9, 1000, 0.05, None, True),         # every key admitted, all k_b = 1, homes
    (500, ("a",), 1.0, 1000, 0.05, None, False),      # one replica
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replan_incremental_matches_the_per_key_reference(case, seed):
    n, ids, q_cap, warm, tol, max_moves, use_homes = CASES[case]
    keys, rates, rng = workload(n, seed)
    active = build_plan(keys, rates, IDS, q_cap, warm)
    keys2, rates2 = drift(keys, rates, rng, sigma=1.0 if tol == 0 else 0.3)
    homes = replan.ring_homes(len(ids)) if use_homes else None
    kw = dict(version=2, created_at=5.0, tolerance=tol, max_moves=max_moves, homes=homes)
    new = replan.replan_incremental(active, keys2, rates2, ids, q_cap, warm, **kw)
    old = replan_v1.replan_incremental(active, keys2, rates2, ids, q_cap, warm, **kw)
    same_plan(new, old)
    # a second interval from each chain's own plan (anchors of k_b > 1 rows, earlier moves)
    keys3, rates3 = drift(keys2, rates2, rng, sigma=0.5, tag="later")
    same_plan(replan.replan_incremental(new, keys3, rates3, ids, q_cap, warm, **kw),
              replan_v1.replan_incremental(old, keys3, rates3, ids, q_cap, warm, **kw))


def test_the_cases_do_rebalance_shrink_and_grow():
    """The fixtures reach the code paths they are meant to (else equality proves little)."""
    n, ids, q_cap, warm, *_ = CASES[2]
    keys, rates, rng = workload(n, 1)
    active = build_plan(keys, rates, IDS, q_cap, warm)
    keys2, rates2 = drift(keys, rates, rng, sigma=1.0)
    plan = replan.replan_incremental(active, keys2, rates2, ids, q_cap, warm, version=2, tolerance=0.0)
    assert plan.extra["moves"] > 0
    before = {k: len(r) for k, r in active.table.items()}
    grew = sum(1 for k, r in plan.table.items() if k in before and len(r) > before[k])
    shrank = sum(1 for k, r in plan.table.items() if k in before and 1 < before[k] and len(r) < before[k])
    assert grew > 0 and shrank > 0


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("q_cap", [1e9, 0.5])
def test_build_at_home_matches_the_reference(seed, q_cap):
    keys, rates, _ = workload(2500, seed)
    homes = replan.ring_homes(len(IDS))
    kw = dict(version=1, created_at=1.0, tolerance=0.05)
    same_plan(replan.build_at_home(keys, rates, IDS, q_cap, 800, homes, **kw),
              replan_v1.build_at_home(keys, rates, IDS, q_cap, 800, homes, **kw))


@pytest.mark.parametrize("dead", [("r0",), ("r1", "r5"), IDS[:7]])
def test_repair_plan_matches_the_reference(dead):
    keys, rates, _ = workload(3000, 4)
    active = build_plan(keys, rates, IDS, 0.5, 60)
    same_plan(replan.repair_plan(active, dead, version=2), replan_v1.repair_plan(active, dead, version=2))


def _decisions(active, candidate, rates, tokens, now, last):
    cfg = switching.SwitchConfig()
    old_cfg = switching_v1.SwitchConfig(**dataclasses.asdict(cfg))
    return (switching.decide_switch(active, candidate, rates, tokens, now=now, last_switch_at=last, config=cfg),
            switching_v1.decide_switch(active, candidate, rates, tokens, now=now, last_switch_at=last, config=old_cfg))


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [1, 2])
def test_switching_rule_matches_the_reference(case, seed):
    n, ids, q_cap, warm, tol, max_moves, use_homes = CASES[case]
    keys, rates, rng = workload(n, seed)
    active = build_plan(keys, rates, IDS, q_cap, warm, version=1)
    keys2, rates2 = drift(keys, rates, rng)
    candidates = [
        replan.replan_incremental(active, keys2, rates2, ids, q_cap, warm, version=2, tolerance=tol,
                                  max_moves=max_moves),
        build_plan(keys2, rates2, ids, q_cap, warm, version=2),                  # from scratch: no churn set
        replan.replan_incremental(active, keys2, rates2, ids, q_cap, warm, version=2, max_moves=0),
    ]
    rate_map = dict(zip(keys2, rates2.tolist()))
    rate_map["not-in-any-plan"] = 0.25
    token_map = {k: float(t) for k, t in zip(keys2[::3], rng.integers(0, 4000, len(keys2[::3])).tolist())}
    for cand in candidates:
        for tokens in (token_map, 1500.0):
            for now, last in ((1000.0, 0.0), (1000.0, 990.0)):
                new, old = _decisions(active, cand, rate_map, tokens, now, last)
                assert new == old
            assert switching.grows_only(active, cand) == switching_v1.grows_only(active, cand)
            assert switching.loads_under(cand, rate_map) == switching_v1.loads_under(cand, rate_map)
            assert switching.rewarm_penalty(active, cand, rate_map, tokens, switching.SwitchConfig()) == \
                switching_v1.rewarm_penalty(active, cand, rate_map, tokens, switching_v1.SwitchConfig())
    # a plan that only grows the active one (extra keys, extra replicas): grows_only holds in both
    grown = dataclasses.replace(active, version=2, table={**active.table, "extra-key": (0,)})
    assert switching.grows_only(active, grown) and switching_v1.grows_only(active, grown)
    assert _decisions(active, grown, rate_map, token_map, 1000.0, 990.0)[0] == \
        _decisions(active, grown, rate_map, token_map, 1000.0, 990.0)[1]


def test_no_rates_and_empty_plans():
    empty = dataclasses.replace(build_plan(["a"], [1.0], IDS, 1.0, 1), table={}, rates={})
    for rates in ({}, {"a": 0.0}, {"a": 2.0}):
        new, old = _decisions(empty, empty, rates, 100.0, 1000.0, 0.0)
        assert new == old
        assert math.isfinite(new.staleness_penalty)


def test_an_empty_candidate_against_a_full_active_plan():
    keys, rates, _ = workload(300, 5)
    active = build_plan(keys, rates, IDS, 1.0, 100, version=1)
    empty = dataclasses.replace(active, version=2, table={}, rates={})
    rate_map = dict(zip(keys, rates.tolist()))
    for a, c in ((active, empty), (empty, active)):
        new, old = _decisions(a, c, rate_map, {keys[0]: 10.0}, 1000.0, 0.0)
        assert new == old


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_rule_on_window_columns_matches_the_reference(case):
    """decide_switch_window (the loop's: the window's rates and tokens in columns, one index)
    decides what the per-key reference decides with the same rates and tokens as dicts, for
    candidates inside the window and for one holding a key outside it."""
    n, ids, q_cap, warm, tol, max_moves, _ = CASES[case]
    keys, rates, rng = workload(n, 7)
    active = build_plan(keys, rates, IDS, q_cap, warm, version=1)
    keys2, rates2 = drift(keys, rates, rng)              # some active keys left the window, some are new
    tokens2 = rng.integers(0, 4000, len(keys2)).astype(np.float64)
    window = switching.WindowColumns(keys2, rates2, tokens2)
    rate_map, token_map = dict(zip(keys2, rates2.tolist())), dict(zip(keys2, tokens2.tolist()))
    outside = build_plan(keys2, rates2, ids, q_cap, warm, version=2)
    dropped = next(k for k in active.table if k not in rate_map)     # in the active plan, not in the window
    outside = dataclasses.replace(outside, table={**outside.table, "not-in-the-window": (0,),
                                                  dropped: (0,)})
    candidates = [
        replan.replan_incremental(active, keys2, rates2, ids, q_cap, warm, version=2, tolerance=tol,
                                  max_moves=max_moves),
        build_plan(keys2, rates2, ids, q_cap, warm, version=2),
        outside,
    ]
    old_cfg = switching_v1.SwitchConfig()
    for cand in candidates:
        for now, last in ((1000.0, 0.0), (1000.0, 990.0)):
            got = switching.decide_switch_window(active, cand, window, now=now, last_switch_at=last)
            want = switching_v1.decide_switch(active, cand, rate_map, token_map, now=now, last_switch_at=last,
                                              config=old_cfg)
            assert got == want
    assert switching.decide_switch_window(None, candidates[0], window, now=1.0, last_switch_at=0.0).switch
    empty = switching.WindowColumns([], np.zeros(0), np.zeros(0))
    assert switching.decide_switch_window(active, candidates[1], empty, now=1000.0, last_switch_at=0.0) == \
        switching_v1.decide_switch(active, candidates[1], {}, {}, now=1000.0, last_switch_at=0.0, config=old_cfg)


def _window_inputs(keys, rates, tokens, ids, q_cap, warm):
    from services.planner.candidate import BuildInputs
    keys = tuple(keys)
    return BuildInputs(keys, rates, dict(zip(keys, tokens.tolist())), tuple(ids), q_cap, warm,
                       window=switching.WindowColumns(keys, rates, tokens))


def _same_columns(a, b):
    assert a.lens.tolist() == b.lens.tolist() and a.one.tolist() == b.one.tolist()
    assert dict(a.multi) == {p: tuple(r) for p, r in b.multi.items()}


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [1, 2])
def test_recorded_positions_decide_what_lookups_decide(case, seed):
    """The loop's path: a churn-aware candidate records where its rows and its parent's keys sit
    in the window (Plan.layout), and the rule aligns the two tables by those positions instead
    of a dict over the window. Same verdict and figures as the per-key reference and as the
    same candidate without its record (the lookup path), over two intervals (the second's
    active plan carries its own record), k_b > 1 rows, dropped and changed replicas, homes."""
    from services.core.planning import RowColumns
    from services.planner.candidate import build_candidate, decide
    n, ids, q_cap, warm, tol, max_moves, use_homes = CASES[case]
    keys, rates, rng = workload(n, seed)
    active = build_plan(keys, rates, IDS, q_cap, warm, version=1)
    old_cfg = switching_v1.SwitchConfig()
    for step in range(2):
        keys, rates = drift(keys, rates, rng, tag=f"s{step}")
        tokens = rng.integers(0, 4000, len(keys)).astype(np.float64)
        inputs = _window_inputs(keys, rates, tokens, ids, q_cap, warm)
        cand = build_candidate(inputs, active, version=step + 2, created_at=1.0, incremental=True, max_moves=max_moves)
        lay = cand.layout_of()
        assert lay is not None and lay.window is inputs.keys and lay.parent is active.table
        table_keys = list(cand.table)
        assert [inputs.keys[i] for i in lay.positions.tolist()] == table_keys
        where = {k: i for i, k in enumerate(inputs.keys)}
        assert lay.parent_positions.tolist() == [where.get(k, -1) for k in active.table]
        _same_columns(RowColumns.of(cand), RowColumns.of(dataclasses.replace(cand, layout=None)))
        rate_map, token_map = dict(zip(inputs.keys, rates.tolist())), dict(zip(inputs.keys, tokens.tolist()))
        for now, last in ((1000.0, 0.0), (1000.0, 990.0)):
            got = decide(active, cand, inputs, now=now, last_switch_at=last, config=None)
            plain = decide(active, dataclasses.replace(cand, layout=None), inputs, now=now, last_switch_at=last,
                           config=None)
            want = switching_v1.decide_switch(active, cand, rate_map, token_map, now=now, last_switch_at=last,
                                              config=old_cfg)
            assert got == plain == want
        active = cand


def test_a_record_for_another_table_or_window_is_not_used():
    """A plan whose table was replaced (dataclasses.replace) drops its record; a window other than
    the one the candidate was built from (an equal copy) takes the lookup path: same verdict."""
    keys, rates, rng = workload(2000, 3)
    active = replan.replan_incremental(build_plan(keys, rates, IDS, 0.7, 80), keys, rates, IDS, 0.7, 80, version=2)
    keys2, rates2 = drift(keys, rates, rng)
    cand = replan.replan_incremental(active, tuple(keys2), rates2, IDS, 0.7, 80, version=3)
    assert cand.layout_of() is not None and active.layout_of() is not None
    assert dataclasses.replace(cand, table=dict(cand.table)).layout_of() is None
    assert dataclasses.replace(cand, decision=None).layout_of() is cand.layout       # same table: kept
    tokens = rng.integers(0, 4000, len(keys2)).astype(np.float64)
    for window_keys in (tuple(keys2), list(keys2)):       # equal, not the same object
        window = switching.WindowColumns(window_keys, rates2, tokens)
        got = switching.decide_switch_window(active, cand, window, now=1000.0, last_switch_at=0.0)
        want = switching_v1.decide_switch(active, cand, dict(zip(keys2, rates2.tolist())),
                                          dict(zip(keys2, tokens.tolist())), now=1000.0, last_switch_at=0.0,
                                          config=switching_v1.SwitchConfig())
        assert got == want
