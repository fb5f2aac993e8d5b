"""The engine set's transitions (services/core/engines.py): slots are stable, ids never reused,
drain before remove, and DNS reconciliation that never drains on an empty answer."""

from __future__ import annotations

import pytest

from services.core.engines import (
    EngineConflict, EngineNotFound, EngineSet, add_engine, drain_engine, engines_from_dict, engines_to_dict,
    reconcile, remove_engine, seed,
)


def three() -> EngineSet:
    s = seed(EngineSet(), [("a", "h:1"), ("b", "h:2")], now=1.0)
    return add_engine(s, "h:3", now=2.0)


def test_slots_are_stable_and_ids_never_reused():
    s = three()
    assert [(e.slot, e.id, e.source) for e in s.engines] == [(0, "a", "config"), (1, "b", "config"), (2, "e2", "manual")]
    assert s.version == 3
    s = remove_engine(drain_engine(s, "b", now=3.0), "b", now=4.0)
    assert s.placeable_ids() == ("a", "e2") and [e.id for e in s.live()] == ["a", "e2"]
    s = add_engine(s, "h:2", now=5.0)                       # same address again: a new slot, a new id
    assert [(e.slot, e.id, e.state) for e in s.engines][1:] == [(1, "b", "removed"), (2, "e2", "active"),
                                                               (3, "e3", "active")]
    with pytest.raises(EngineConflict) as err:
        add_engine(s, "h:9", engine_id="b", now=6.0)        # a removed id stays taken
    assert err.value.exists


@pytest.mark.parametrize("change, error", [
    (lambda s: add_engine(s, "h:1", now=0), EngineConflict),          # address in use
    (lambda s: add_engine(s, "", now=0), ValueError),                 # no address
    (lambda s: add_engine(s, "h:9", engine_id="bad id", now=0), ValueError),
    (lambda s: remove_engine(s, "a", now=0), EngineConflict),         # active: drain first
    (lambda s: drain_engine(s, "zz", now=0), EngineNotFound),
])
def test_bad_changes_are_refused(change, error):
    with pytest.raises(error):
        change(three())


def test_the_last_active_engine_cannot_be_drained_and_repeats_are_idempotent():
    s = drain_engine(three(), "a", now=1.0)
    assert drain_engine(s, "a", now=2.0) is s                        # draining already: same version
    s = drain_engine(s, "h:2", now=2.0)                              # by address
    with pytest.raises(EngineConflict, match="last active"):
        drain_engine(s, "e2", now=3.0)
    s = remove_engine(s, "a", now=3.0)
    assert remove_engine(s, "a", now=4.0) is s
    assert remove_engine(three(), "a", now=1.0, force=True).by_id("a").state == "removed"


def test_reconcile_adds_drains_removes_and_ignores_an_empty_answer():
    src = "dns:engines.default.svc:8000"
    s = reconcile(EngineSet(), src, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"], now=1.0)
    assert [(e.id, e.address, e.source) for e in s.engines] == [
        ("e0", "10.0.0.1:8000", src), ("e1", "10.0.0.2:8000", src), ("e2", "10.0.0.3:8000", src)]
    assert reconcile(s, src, [], now=2.0) is s                        # failed lookup: nothing changes
    gone = reconcile(s, src, ["10.0.0.1:8000", "10.0.0.3:8000"], now=3.0)
    assert gone.by_id("e1").state == "draining"
    still = reconcile(gone, src, ["10.0.0.1:8000", "10.0.0.3:8000"], now=4.0, planned=lambda rid: rid == "e1")
    assert still is gone                                              # keys still planned there: stays
    left = reconcile(gone, src, ["10.0.0.1:8000", "10.0.0.3:8000"], now=5.0, planned=lambda rid: False)
    assert left.by_id("e1").state == "removed"
    back = reconcile(gone, src, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"], now=6.0)
    assert back.by_id("e1").state == "active"                         # resolves again while draining
    manual = add_engine(EngineSet(), "10.0.0.9:8000", now=0.0)
    assert reconcile(manual, src, ["10.0.0.1:8000"], now=1.0).by_id("e0").state == "active"   # other sources untouched


def test_the_stored_form_round_trips_and_bad_forms_are_refused():
    s = drain_engine(three(), "b", now=7.0)
    assert engines_from_dict(engines_to_dict(s)) == s
    bad = engines_to_dict(s)
    bad["engines"][1]["slot"] = 5
    with pytest.raises(ValueError):
        engines_from_dict(bad)
