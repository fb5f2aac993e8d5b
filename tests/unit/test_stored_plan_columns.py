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
