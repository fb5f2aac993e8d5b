"""Plan codecs: JSON files and protobuf round-trips (hypothesis), plus decode errors."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.wire.codec import (plan_from_json, plan_from_proto, plan_summary, plan_to_dict, plan_to_json,
                            plan_to_proto, read_plan_file, write_plan_file)
from services.core.plan import ShadowReport, SwitchDecision
from services.core.planning import build_plan

finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
text = st.text(min_size=1, max_size=12)  # any unicode: keys are opaque strings


@st.composite
def plans(draw):
    keys = draw(st.lists(text, min_size=1, max_size=30, unique=True))
    rates = draw(st.lists(finite, min_size=len(keys), max_size=len(keys)))
    replica_ids = draw(st.lists(text, min_size=1, max_size=6, unique=True))
    plan = build_plan(keys, rates, replica_ids, q_cap=draw(st.floats(0.1, 100.0)),
                      warm_slots=draw(st.integers(1, 10)), version=draw(st.integers(1, 2**40)),
                      created_at=draw(finite), rates_snapshot_id=draw(st.text(max_size=8)),
                      window_seconds=draw(finite))
    decision = draw(st.none() | st.builds(SwitchDecision, st.booleans(), st.text(max_size=20), finite, finite, finite))
    shadow = draw(st.none() | st.builds(ShadowReport, st.booleans(), st.booleans(), st.text(max_size=20),
                                        st.integers(0, 2**40), finite, finite, finite, finite, finite,
                                        finite, finite, finite, st.integers(0, 2**31)))
    churn = draw(st.none() | finite)
    return dataclasses.replace(plan, decision=decision, shadow=shadow, churn=churn,
                               parent_version=draw(st.integers(0, 2**40)),
                               builder=draw(st.sampled_from(["lpt", "incremental", "repair"])),
                               extra=draw(st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**63 - 1) | st.text(max_size=5), max_size=3)))


@settings(max_examples=200, deadline=None)
@given(plans())
def test_json_round_trip(plan):
    assert plan_from_json(plan_to_json(plan)) == plan


@settings(max_examples=200, deadline=None)
@given(plans())
def test_proto_round_trip(plan):
    wire = plan_to_proto(plan).SerializeToString()
    from cacheroute.v1 import common_pb2

    decoded = plan_from_proto(common_pb2.Plan.FromString(wire))
    assert decoded == dataclasses.replace(plan, extra={})  # extra has no wire field
    assert list(decoded.table) == list(plan.table)


def test_plan_file_layout(tmp_path):
    plan = build_plan(["a", "b", "c"], [5.0, 1.0, 2.0], ["x", "y"], q_cap=3.0, warm_slots=1, version=3)
    path = tmp_path / "plan.json"
    write_plan_file(path, plan)
    raw = orjson.loads(path.read_bytes())
    assert raw["version"] == 3 and raw["replicas"] == ["x", "y"]
    assert raw["table"] == {"a": [0, 1]} and raw["expected_load"] == list(plan.expected_load)
    # every field but `layout` (the builder's in-process record of the table, never written)
    assert set(raw) >= {f.name for f in dataclasses.fields(plan)} - {"replica_ids", "layout"}
    assert read_plan_file(path) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temp file left behind


def test_plan_summary():
    plan = build_plan(["a", "b"], [5.0, 1.0], ["x", "y"], q_cap=3.0, warm_slots=1, version=9)
    plan = dataclasses.replace(plan, decision=SwitchDecision(True, "shift", 1.0, 2.0, 0.5))
    msg = plan_summary(plan, active=True, pinned=False)
    assert (msg.version, msg.replicas, msg.admitted_keys, msg.active, msg.pinned) == (9, 2, 1, True, False)
    assert msg.decision.reason == "shift" and not msg.HasField("shadow")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("table"), "missing field 'table'"),
    (lambda d: d.update(format="other/9"), "unsupported plan format"),
    (lambda d: d["table"].update(a=[0, 0]), "row for key 'a'"),
    (lambda d: d["table"].update(a=[5]), "row for key 'a'"),
    (lambda d: d.update(expected_load=[1.0]), "1 expected loads for 2 replicas"),
])
def test_json_decode_errors(mutate, message):
    plan = build_plan(["a", "b"], [5.0, 1.0], ["x", "y"], q_cap=3.0, warm_slots=1)
    data = plan_to_dict(plan)
    mutate(data)
    with pytest.raises(ValueError, match=message):
        plan_from_json(orjson.dumps(data))


def test_json_decode_garbage():
    with pytest.raises(ValueError, match="not valid JSON"):
        plan_from_json(b"{nope")
    with pytest.raises(ValueError, match="JSON object"):
        plan_from_json(b"[1, 2]")


def test_unbounded_shadow_p99_survives_json():
    from services.core.plan import Plan, ShadowReport

    shadow = ShadowReport(ran=True, candidate_ttft_p99=float("inf"), flat_ttft_p99=2.5, reason="inf")
    plan = Plan(1, 0, 0.0, ("a",), 10.0, 4, {"k": (0,)}, {"k": 1.0}, (1.0,), 1.0, 1, 1, 1.0, shadow=shadow)
    back = plan_from_json(plan_to_json(plan)).shadow
    assert back.candidate_ttft_p99 == float("inf") and back.flat_ttft_p99 == 2.5 and back.reason == "inf"


def test_a_plans_columns_are_computed_once_per_plan_object():
    """The planner writes a plan (encode_plan computes its columns) and then sends the same
    object to its watchers: the second table_columns is the first one's result. A plan
    derived from it (dataclasses.replace) gets columns of its own table."""
    from services.wire import codec
    from services.store.keys import decode_plan, encode_plan

    keys = [f"key-{i}" for i in range(3000)]
    plan = build_plan(keys, [1.0 + i % 5 for i in range(3000)], ("a", "b", "c"), q_cap=1e6, warm_slots=3000)
    blob = encode_plan(plan)
    cols = codec.table_columns(plan)
    assert codec.table_columns(plan) is cols
    assert decode_plan(blob).table == plan.table
    first = keys[0]
    other = dataclasses.replace(plan, table={**plan.table, first: (2,) if plan.table[first] != (2,) else (1,)})
    theirs = codec.table_columns(other)
    assert theirs is not cols and theirs.members.tolist() != cols.members.tolist()
    assert codec.table_columns(plan) is cols
