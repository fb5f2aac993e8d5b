"""The keep-or-switch rule on scripted rate histories."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from services.core.planning import build_plan
from services.core.replan import replan_incremental
from services.core.switching import (SwitchConfig, decide_switch, grows_only, loads_under, overload, queueing,
                                     rewarm_penalty, staleness_penalty)

IDS = [f"r{i}" for i in range(8)]
KEYS = [f"k{i}" for i in range(2000)]
Q_CAP, W = 200.0, 25
CONFIG = SwitchConfig()


def base_rates(seed=1) -> np.ndarray:
    rates = np.random.default_rng(seed).lognormal(0.0, 1.65, len(KEYS))
    return rates * (600.0 / rates.sum())


def as_map(rates: np.ndarray) -> dict[str, float]:
    return dict(zip(KEYS, rates.tolist()))


def decide(active, rates, *, candidate=None, now=1000.0, last=0.0, tokens=2048.0, config=CONFIG):
    if candidate is None:
        candidate = replan_incremental(active, KEYS, rates, IDS, Q_CAP, W, version=active.version + 1)
    return decide_switch(active, candidate, as_map(rates), tokens, now=now, last_switch_at=last, config=config)


def test_no_active_plan_switches():
    plan = build_plan(KEYS, base_rates(), IDS, Q_CAP, W)
    assert decide_switch(None, plan, as_map(base_rates()), 2048.0, now=0.0, last_switch_at=0.0,
                         config=CONFIG).switch


def test_small_drift_keeps_the_active_plan():
    rates = base_rates()
    active = build_plan(KEYS, rates, IDS, Q_CAP, W)
    drifted = rates * np.exp(np.random.default_rng(2).normal(0.0, 0.05, len(KEYS)))
    for candidate in (None, build_plan(KEYS, drifted, IDS, Q_CAP, W, version=2)):
        d = decide(active, drifted, candidate=candidate)
        assert not d.switch and d.reason.startswith("keep")
        assert d.staleness_penalty * CONFIG.horizon_seconds <= d.rewarm_penalty * (1 + CONFIG.hysteresis)


def test_new_hot_keys_switch():
    rates = base_rates()
    active = build_plan(KEYS, rates, IDS, Q_CAP, W)
    shifted = rates.copy()
    cold_keys = [i for i, k in enumerate(KEYS) if k not in active.table][:30]
    shifted[cold_keys] = np.sort(rates)[-30:]  # thirty cold keys become as hot as the hottest
    d = decide(active, shifted)
    assert d.switch and d.reason.startswith("switch")
    assert d.staleness_penalty > 0 and d.churn > 0
    # the same shift, but too soon after the last switch
    early = decide(active, shifted, now=100.0, last=50.0)
    assert not early.switch and "dwell" in early.reason


def test_a_young_plan_grows_within_the_dwell():
    """A plan built from the first seconds of traffic knows a quarter of the keys; the rest
    arrive. A candidate that only adds them passes the cost rule before the dwell ends; the same
    traffic with rebalancing moves (warm keys moved) waits for the dwell."""
    keys = [f"t{i}" for i in range(400)]
    rates = np.random.default_rng(3).lognormal(0.0, 1.65, len(keys))
    rates *= 50.0 / rates.sum()
    seen = np.zeros(len(keys))
    seen[::4] = rates[::4]
    ids = [f"e{i}" for i in range(8)]
    young = build_plan(keys, seen, ids, 20.0, 64, version=1)
    assert len(young.table) == 100
    grown = replan_incremental(young, keys, rates, ids, 20.0, 64, version=2, max_moves=0)
    assert len(grown.table) == 400 and grows_only(young, grown)
    d = decide_switch(young, grown, dict(zip(keys, rates.tolist())), 2200.0, now=30.0, last_switch_at=10.0)
    assert d.switch and "growth only" in d.reason, d.reason

    moved = dict(grown.table)
    warm = next(k for k in young.table if len(young.table[k]) == 1)
    moved[warm] = ((young.table[warm][0] + 1) % 8,)
    shuffled = dataclasses.replace(grown, table=moved)
    assert not grows_only(young, shuffled)
    d = decide_switch(young, shuffled, dict(zip(keys, rates.tolist())), 2200.0, now=30.0, last_switch_at=10.0)
    assert not d.switch and "dwell" in d.reason


def test_grows_only_allows_shrinking_not_dropping():
    ids = ["a", "b", "c"]
    active = build_plan(["x", "y", "z"], [50.0, 1.0, 1.0], ids, 20.0, 4)
    assert len(active.table["x"]) == 3
    table = dict(active.table)
    table["x"] = table["x"][:2]          # k_b shrank: a subset of its replicas
    assert grows_only(active, dataclasses.replace(active, table=table))
    del table["z"]                       # dropped: its traffic moves to its cold-tail replica
    assert not grows_only(active, dataclasses.replace(active, table=table))


def count_switches(config: SwitchConfig) -> int:
    """40 intervals (60 s apart) of rates alternating between two noisy versions of one shape."""
    rng = np.random.default_rng(5)
    rates = base_rates(3)
    noise = [rng.normal(0.0, 0.2, len(KEYS)) for _ in range(2)]
    active = build_plan(KEYS, rates * np.exp(noise[0]), IDS, Q_CAP, W)
    last, switches = 0.0, 0
    for step in range(1, 41):
        now = step * 60.0
        current = rates * np.exp(noise[step % 2])
        candidate = replan_incremental(active, KEYS, current, IDS, Q_CAP, W, version=active.version + 1)
        d = decide(active, current, candidate=candidate, now=now, last=last, config=config)
        if d.switch:
            active, last, switches = candidate, now, switches + 1
    return switches


def test_alternating_noise_does_not_flap():
    assert count_switches(CONFIG) <= 2
    # the history is a real trap: without hysteresis the rule chases the noise
    assert count_switches(dataclasses.replace(CONFIG, hysteresis=0.0)) > 10


def test_a_lasting_shift_switches_once():
    rates = base_rates(4)
    active = build_plan(KEYS, rates, IDS, Q_CAP, W)
    shifted = rates[::-1].copy()  # a different set of hot keys, then it stays
    last, switches = 0.0, 0
    for step in range(1, 21):
        now = step * 60.0 + 1000.0
        candidate = replan_incremental(active, KEYS, shifted, IDS, Q_CAP, W, version=active.version + 1)
        d = decide(active, shifted, candidate=candidate, now=now, last=last)
        if d.switch:
            active, last, switches = candidate, now, switches + 1
    assert switches == 1


def test_replica_set_change_overrides_dwell():
    rates = base_rates()
    active = build_plan(KEYS, rates, IDS, Q_CAP, W)
    candidate = build_plan(KEYS, rates, IDS[:-1], Q_CAP, W, version=2)
    d = decide(active, rates, candidate=candidate, now=10.0, last=5.0)
    assert d.switch and "replica set changed" in d.reason and "r7" in d.reason


def test_overload_counts_toward_staleness():
    keys = ["hot", "a", "b", "c"]
    ids = ["x", "y"]
    active = build_plan(keys, [1.0, 1.0, 1.0, 1.0], ids, q_cap=5.0, warm_slots=4)
    now = {"hot": 20.0, "a": 1.0, "b": 1.0, "c": 1.0}  # hot grows past q_cap on one replica
    candidate = build_plan(keys, list(now.values()), ids, q_cap=5.0, warm_slots=4, version=2)
    assert len(candidate.table["hot"]) == 2
    assert overload(loads_under(active, now), 5.0) > overload(loads_under(candidate, now), 5.0)
    stale = staleness_penalty(active, candidate, now, 1000.0, CONFIG)
    assert stale.overload > 0 and stale.cache == 0.0


def test_rewarm_counts_new_owners_by_replica_id():
    rates = base_rates()
    active = build_plan(KEYS, rates, IDS, Q_CAP, W)
    assert rewarm_penalty(active, active, as_map(rates), 2048.0, CONFIG) == 0.0
    same_ids_reordered = build_plan(KEYS, rates, IDS, Q_CAP, W)
    assert rewarm_penalty(active, same_ids_reordered, as_map(rates), 2048.0, CONFIG) == 0.0
    one = dict(active.table)
    key = next(iter(one))
    moved = dataclasses.replace(active, table={**one, key: tuple((i + 1) % 8 for i in one[key])})
    lam = rates[KEYS.index(key)]
    k = len(one[key])  # every owner is new: the whole rate runs cold for rewarm_seconds
    expected = 2048.0 * (k + lam * CONFIG.rewarm_seconds) * CONFIG.prefill_seconds_per_token
    assert rewarm_penalty(active, moved, as_map(rates), 2048.0, CONFIG) == pytest.approx(expected)
    # a prefix-token mapping: keys without an entry use the default
    assert rewarm_penalty(active, moved, as_map(rates), {key: 4096.0}, CONFIG) == pytest.approx(2 * expected, rel=1e-3)


def test_config_validation():
    with pytest.raises(ValueError, match="hysteresis"):
        SwitchConfig(hysteresis=-1.0)


def first_switch_peak(config: SwitchConfig) -> float:
    """Peak predicted load / q_cap of the active plan when the rule first switches, as the eight
    keys sharing replica 0 grow 4% per interval (total rate held): slow drift toward overload."""
    keys, q_cap, slots = [f"s{i}" for i in range(256)], 12.0, 64
    base = np.full(len(keys), 0.25)                     # mean load 8 = 0.67 q_cap
    active = build_plan(keys, base, IDS, q_cap, slots)
    growing = [i for i, key in enumerate(keys) if 0 in active.table[key]]
    for step in range(1, 40):
        rates = base.copy()
        rates[growing] *= 1.04 ** step
        rates *= base.sum() / rates.sum()
        now = dict(zip(keys, rates.tolist()))
        candidate = replan_incremental(active, keys, rates, IDS, q_cap, slots, version=2)
        d = decide_switch(active, candidate, now, 2048.0, now=1000.0 + 60.0 * step, last_switch_at=0.0,
                          config=config)
        if d.switch:
            return max(loads_under(active, now)) / q_cap
    return math.inf


def test_slow_drift_toward_overload_switches_before_any_replica_passes_q_cap():
    assert first_switch_peak(CONFIG) < 0.9
    # the old rule (no queueing term) priced load only past q_cap: it waited for overload
    assert first_switch_peak(dataclasses.replace(CONFIG, queue_weight=0.0)) > 1.0


def test_queueing_grows_smoothly_below_the_knee_and_is_capped():
    q = [queueing([rho * 10.0], 10.0, CONFIG.queue_cap) for rho in (0.0, 0.3, 0.5, 0.7, 0.8, 0.9)]
    assert q[0] == 0.0 and all(a < b for a, b in zip(q, q[1:]))
    assert q[2] == pytest.approx(0.5) and q[4] == pytest.approx(3.2)        # M/M/1 L_q = rho^2 / (1 - rho)
    assert queueing([9.9, 10.0, 50.0], 10.0, CONFIG.queue_cap) == pytest.approx(3 * CONFIG.queue_cap)
    assert queueing([5.0, 5.0], 0.0, CONFIG.queue_cap) == 0.0
