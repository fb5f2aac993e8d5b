"""Plans in the store: a large one in columns (services/store/keys.py), read back equal."""

from __future__ import annotations

import pytest

from services.core.plan import Plan
from services.core.table import ColumnarTable
from services.store.keys import COLUMNS_FROM_KEYS, PLAN_COLUMNS_MAGIC, decode_plan, encode_plan


def plan(n: int, rated: int | None = None) -> Plan:
    table = {f"tenant-{i}-é": (i % 5, (i + 2) % 5) if i % 3 == 0 else (i % 5,) for i in range(n)}
    keys = list(table)[: n if rated is None else rated]
    return Plan(version=7, parent_version=6, created_at=12.5, replica_ids=tuple(f"r{i}" for i in range(5)),
                q_cap=40.0, warm_slots=n, table=table, rates={k: 0.25 + i for i, k in enumerate(keys)},
                expected_load=(1.0, 2.0, 3.0, 4.0, 5.5), predicted_imbalance=1.8, total_keys=n + 9,
                admitted_keys=n, admitted_rate_share=0.75, churn=0.125, builder="incremental",
                extra={"note": "x"})


def test_a_large_plan_is_stored_in_columns_and_reads_back_equal():
    p = plan(COLUMNS_FROM_KEYS)
    blob = encode_plan(p)
    assert blob.startswith(PLAN_COLUMNS_MAGIC)
    back = decode_plan(blob)
    assert isinstance(back.table, ColumnarTable)
    assert back == p
    assert list(back.table) == list(p.table) and dict(back.rates) == dict(p.rates)
    assert back.table["tenant-3-é"] == (3, 0)


@pytest.mark.parametrize("p", [plan(COLUMNS_FROM_KEYS - 1), plan(COLUMNS_FROM_KEYS, rated=10)],
                         ids=["small", "rates-for-some-keys"])
def test_small_plans_and_partly_rated_ones_stay_json(p):
    blob = encode_plan(p)
    assert blob.startswith(b"{")
    assert decode_plan(blob) == p


def test_a_damaged_plan_in_columns_is_refused():
    blob = encode_plan(plan(COLUMNS_FROM_KEYS))
    for bad in (blob[:-1], blob[:20], blob + b"x"):
        with pytest.raises(ValueError):
            decode_plan(bad)


def _old_table_columns(p: Plan):
    """codec._table_columns for a dict table as it was at d474fed (per-key encode, rows by
    iteration): the reference for the fast paths."""
    import itertools

    import numpy as np

    keys = list(p.table)
    encoded = [k.encode("utf-8") for k in keys]
    rows = list(p.table.values())
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    members = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(counts.sum()))
    rates = np.fromiter((p.rates.get(k, 0.0) for k in keys), dtype=np.float64, count=len(keys))
    return b"".join(encoded), [len(e) for e in encoded], counts.tolist(), members.tolist(), rates.tolist()


@pytest.mark.parametrize("ascii_keys", [True, False])
@pytest.mark.parametrize("with_layout", [True, False])
def test_columns_of_a_built_plan_are_the_per_key_ones(ascii_keys, with_layout):
    """The write step's fast paths (ASCII keys joined and encoded once; rows from the builder's
    record, Plan.layout) give the bytes the per-key path gave, so the stored plan is unchanged."""
    import dataclasses

    import numpy as np

    from services.core.planning import build_plan
    from services.core.replan import replan_incremental
    from services.wire import codec

    rng = np.random.default_rng(5)
    n = 3000
    keys = [f"k{i}" if ascii_keys or i % 7 else f"k{i}-é☃" for i in range(n)]
    rates = rng.lognormal(0.0, 1.65, n)
    ids = tuple(f"r{i}" for i in range(6))
    active = build_plan(keys, rates, ids, 0.6, 300)
    p = replan_incremental(active, tuple(keys), rates * np.exp(rng.normal(0, 0.3, n)), ids, 0.6, 300, version=2)
    assert p.layout_of() is not None and any(len(r) > 1 for r in p.table.values())
    if not with_layout:
        p = dataclasses.replace(p, layout=None)
    cols = codec._table_columns(p)
    got = (cols.keys, cols.key_lengths.tolist(), cols.counts.tolist(), cols.members.tolist(), cols.rates.tolist())
    assert got == _old_table_columns(p)
    assert encode_plan(dataclasses.replace(p, table=dict(p.table))) == encode_plan(p)
