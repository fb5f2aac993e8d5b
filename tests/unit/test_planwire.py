"""Table slices of plans above the message limit (services.wire.planwire)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from services.wire import codec
from services.core.planning import build_plan
from services.core.table import ColumnarTable
from services.errors import InvalidArgument
from services.wire.planwire import MIN_BUDGET, SliceAssembler, plan_chunks, plan_page


def make_plan(n: int, key_len: int = 40):
    keys = [f"{i:06d}" + "k" * key_len for i in range(n)]
    return build_plan(keys, [1.0 + i % 5 for i in range(n)], ("r0", "r1", "r2"), q_cap=1e6, warm_slots=n)


def test_a_plan_that_fits_is_one_whole_message():
    plan = make_plan(20)
    (only,) = plan_chunks(plan, 1 << 20)
    assert only.table_size == 0 and only.table_offset == 0
    assert only == codec.plan_to_proto(plan)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 1500), key_len=st.integers(0, 250), budget=st.integers(MIN_BUDGET, 200_000))
def test_slices_fit_their_budget_and_reassemble_to_the_whole(n, key_len, budget):
    plan = make_plan(n, key_len)
    chunks = plan_chunks(plan, budget)
    assert all(c.ByteSize() <= budget for c in chunks)
    assembler = SliceAssembler()
    results = [assembler.add(c) for c in chunks]
    assert all(r is None for r in results[:-1])
    assert results[-1] == codec.plan_to_proto(plan)
    assert codec.plan_from_proto(results[-1]).table == plan.table


def test_a_slice_out_of_order_is_refused_and_the_partial_plan_dropped():
    plan = make_plan(3000)
    chunks = plan_chunks(plan, MIN_BUDGET)
    assert len(chunks) > 3
    assembler = SliceAssembler()
    assembler.add(chunks[0])
    with pytest.raises(ValueError, match="does not continue"):
        assembler.add(chunks[2])
    assert not assembler.pending
    with pytest.raises(ValueError):
        assembler.add(chunks[1])          # no first slice any more


def test_pages_from_any_offset_and_offsets_beyond_the_table():
    plan = make_plan(500)
    page = plan_page(plan, MIN_BUDGET, 123)
    assert page.table_offset == 123 and page.table_size == 500
    assert page.table[0].key == list(plan.table)[123]
    with pytest.raises(InvalidArgument):
        plan_page(plan, MIN_BUDGET, 501)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 1500), key_len=st.integers(0, 250), budget=st.integers(MIN_BUDGET, 200_000))
def test_column_slices_fit_their_budget_and_decode_to_the_same_plan(n, key_len, budget):
    plan = make_plan(n, key_len)
    cols = codec.table_columns(plan)
    chunks = plan_chunks(plan, budget, cols)
    assert all(c.ByteSize() <= budget and not c.table for c in chunks)
    assembler = SliceAssembler()
    results = [assembler.add_slices(c) for c in chunks]
    assert all(r is None for r in results[:-1]) and results[-1] == chunks
    for columnar in (True, False):
        got = codec.plan_from_slices(results[-1], columnar=columnar)
        assert dict(got.table.items()) == dict(plan.table) and dict(got.rates.items()) == dict(plan.rates)
        assert dataclasses.replace(got, table={}, rates={}) == dataclasses.replace(plan, table={}, rates={})
    joined = SliceAssembler()
    whole = [joined.add(c) for c in chunks][-1]
    assert whole.table_size == 0 and codec.plan_from_proto(whole).table == plan.table


def test_a_columnar_plan_round_trips_and_bad_columns_are_refused():
    plan = make_plan(200)
    msg = codec.plan_to_proto(plan, columnar=True)
    back = codec.plan_from_proto(msg, columnar=True)
    assert isinstance(back.table, ColumnarTable) and back.table == plan.table
    assert codec.plan_to_proto(back, columnar=True) == msg and codec.plan_to_proto(back) == codec.plan_to_proto(plan)
    bad = type(msg)()
    bad.CopyFrom(msg)
    bad.columns.replicas = bad.columns.replicas[:-2]
    with pytest.raises(ValueError, match="do not match"):
        codec.plan_from_proto(bad)
    bad.CopyFrom(msg)
    bad.columns.replicas = b"\x07\x00" + bad.columns.replicas[2:]      # replica 7 of 3
    with pytest.raises(ValueError, match="replica index"):
        codec.plan_from_proto(bad, columnar=True)
    bad.CopyFrom(msg)
    bad.table.add(key="x", replicas=[0])
    with pytest.raises(ValueError, match="both"):
        codec.plan_from_proto(bad)
