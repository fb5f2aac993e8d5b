"""Plans above the gRPC message limit: cut into table slices, put back together.

A plan message is one table entry per admitted key; a million-key plan is tens of MB, more
than one gRPC message may carry (`--max-message-bytes`, 8 MiB by default). Such a plan
travels as consecutive `Plan` messages whose `table` holds a slice of the whole, marked by
`table_offset` and `table_size` (protos/cacheroute/v1/common.proto): WatchPlans sends the
chunks of one update back to back, GetPlan answers one page per call (the caller asks for
the next offset), BuildPlan answers with the first slice. The first slice also carries
every other field of the plan; later ones only the version and their entries. A plan that
fits is sent whole, exactly as before (offset and size stay 0).

Slices are cut by an upper bound of each entry's encoded size (key bytes + 5 bytes per
replica index + framing), so every message fits its budget without encoding it twice.
Plans are immutable, so pages of one version read at different times agree.

In columns (the reader asked, `columnar`): the same slicing over `Plan.columns` instead of
`Plan.table`, by the exact bytes each key adds (codec.Columns.entry_bytes) and one numpy
search per slice; the caller computes the plan's Columns once and passes them to every page.
The assembler hands the slices back as they came (`add_slices`), so a reader can decode them
in one pass off its event loop (codec.plan_from_slices) without joining them first.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import numpy as np

from cacheroute.v1 import common_pb2
from services.wire import codec
from services.core.plan import Plan
from services.errors import InvalidArgument, ResourceExhausted

# room left for the wrapper around a Plan (PlanUpdate fields, BuildPlanResponse framing)
WRAPPER_BYTES = 1024
# smallest useful slice budget: a header plus at least a few entries of the longest key
MIN_BUDGET = 16 * 1024


def entry_bound(key: str, replicas: int) -> int:
    """Upper bound of one PlanEntry's bytes inside a Plan: outer tag and length (<= 4), key
    field (<= 3 + key), packed replicas (<= 4 + 5 each), rate (9)."""
    return len(key.encode("utf-8")) + 5 * replicas + 20


def budget_for(limit: int, requested: int = 0) -> int:
    """Bytes one Plan message may take inside a message of at most `limit` bytes (the
    server's limit), or of `requested` when the caller asked for less."""
    cap = min(limit, requested) if requested > 0 else limit
    return max(MIN_BUDGET, cap - WRAPPER_BYTES)


def _header(plan: Plan, table_size: int) -> common_pb2.Plan:
    msg = codec.plan_to_proto(dataclasses.replace(plan, table={}, rates={}))
    msg.table_size = table_size
    return msg


def _entries(plan: Plan, start: int) -> Iterator[tuple[str, tuple[int, ...], float]]:
    rates = plan.rates
    for key, row in itertools.islice(plan.table.items(), start, None):
        yield key, row, rates.get(key, 0.0)


COLUMN_FRAMING = 32     # the columns field and its five length-delimited fields


def plan_page(plan: Plan, budget: int, offset: int = 0, columns: codec.Columns | None = None) -> common_pb2.Plan:
    """The plan as one message of at most `budget` bytes: whole when it fits, else the
    entries from `offset` that fit, with table_offset/table_size set. ResourceExhausted when
    not even the header and one entry fit (a budget below MIN_BUDGET, or a huge header).
    `columns` (codec.table_columns(plan)): the table as Plan.columns."""
    if columns is not None:
        return _column_page(plan, columns, budget, offset)
    size = len(plan.table)
    if offset > size:
        raise InvalidArgument(f"table offset {offset} is beyond the plan's {size} entries")
    if offset == 0:
        whole = codec.plan_to_proto(plan)
        if whole.ByteSize() <= budget:
            return whole
    msg = _header(plan, size) if offset == 0 else common_pb2.Plan(version=plan.version, table_size=size)
    msg.table_offset = offset
    used = msg.ByteSize() + 12     # the two slice fields may grow by a few bytes
    if used > budget:
        raise ResourceExhausted(f"plan v{plan.version}: {used} bytes without its table exceed the {budget}-byte budget")
    entries = []
    for key, row, rate in _entries(plan, offset):
        need = entry_bound(key, len(row))
        if used + need > budget:
            break
        used += need
        entries.append(common_pb2.PlanEntry(key=key, replicas=row, rate=rate))
    if not entries and offset < size:
        raise ResourceExhausted(f"plan v{plan.version}: entry {offset} does not fit the {budget}-byte budget")
    msg.table.extend(entries)
    return msg


def _column_page(plan: Plan, cols: codec.Columns, budget: int, offset: int) -> common_pb2.Plan:
    size = len(cols)
    if offset > size:
        raise InvalidArgument(f"table offset {offset} is beyond the plan's {size} entries")
    if offset == 0:
        head = codec.plan_header_proto(plan)
        if head.ByteSize() + int(cols.entry_bytes.sum()) + COLUMN_FRAMING + 16 <= budget:
            head.columns.CopyFrom(cols.to_proto())
            return head
        head.table_size = size
    else:
        head = common_pb2.Plan(version=plan.version, table_size=size)
    head.table_offset = offset
    room = budget - head.ByteSize() - 12 - COLUMN_FRAMING
    # the last key that fits: cumulative entry bytes from `offset` within `room`
    cum = np.cumsum(cols.entry_bytes[offset:])
    stop = offset + int(np.searchsorted(cum, room, side="right"))
    if stop == offset and offset < size:
        raise ResourceExhausted(f"plan v{plan.version}: entry {offset} does not fit the {budget}-byte budget")
    head.columns.CopyFrom(cols.to_proto(offset, stop))
    return head


def slice_entries(msg: common_pb2.Plan) -> int:
    """Entries one plan message carries (table entries, or keys in columns)."""
    return len(msg.columns.key_lengths) // 4 if msg.HasField("columns") else len(msg.table)


def plan_chunks(plan: Plan, budget: int, columns: codec.Columns | None = None) -> list[common_pb2.Plan]:
    """Every slice of the plan, in order (one message when it fits)."""
    first = plan_page(plan, budget, 0, columns)
    out = [first]
    done = slice_entries(first)
    while first.table_size and done < first.table_size:
        page = plan_page(plan, budget, done, columns)
        out.append(page)
        done += slice_entries(page)
    return out


class SliceAssembler:
    """Collects table slices back into one plan. `add(msg)` returns the complete message (a
    whole plan is returned as is) or None while slices are missing; `add_slices(msg)` the
    same as the list of slices, for codec.plan_from_slices. ValueError for a slice that does
    not continue the one being collected (the partial one is dropped)."""

    def __init__(self) -> None:
        self._slices: list[common_pb2.Plan] = []
        self._have = 0

    @property
    def pending(self) -> bool:
        return bool(self._slices)

    def reset(self) -> None:
        self._slices, self._have = [], 0

    def add_slices(self, msg: common_pb2.Plan) -> list[common_pb2.Plan] | None:
        if not msg.table_size:
            self.reset()
            return [msg]
        if msg.table_offset == 0:
            self._slices, self._have = [msg], 0
        elif not self._slices or msg.version != self._slices[0].version or msg.table_offset != self._have \
                or msg.HasField("columns") != self._slices[0].HasField("columns"):
            got = (msg.version, msg.table_offset)
            self.reset()
            raise ValueError(f"plan slice v{got[0]}@{got[1]} does not continue the plan being received")
        else:
            self._slices.append(msg)
        self._have += slice_entries(msg)
        head = self._slices[0]
        if self._have < msg.table_size:
            return None
        if self._have > msg.table_size or msg.table_size != head.table_size:
            self.reset()
            raise ValueError(f"plan v{msg.version}: slices hold more entries than its table_size {msg.table_size}")
        out = self._slices
        self.reset()
        return out

    def add(self, msg: common_pb2.Plan) -> common_pb2.Plan | None:
        slices = self.add_slices(msg)
        if slices is None:
            return None
        if len(slices) == 1 and not slices[0].table_size:
            return slices[0]
        return join_slices(slices)


def join_slices(slices: list[common_pb2.Plan]) -> common_pb2.Plan:
    """One whole Plan message from its consecutive slices."""
    whole = common_pb2.Plan()
    whole.CopyFrom(slices[0])
    whole.table_offset = 0
    whole.table_size = 0
    if slices[0].HasField("columns"):
        parts = [s.columns for s in slices]
        whole.columns.CopyFrom(common_pb2.PlanColumns(**{f: b"".join(getattr(p, f) for p in parts)
                                                          for f in ("keys", "key_lengths", "replica_counts",
                                                                    "replicas", "rates")}))
    else:
        for s in slices[1:]:
            whole.table.extend(s.table)
    return whole
