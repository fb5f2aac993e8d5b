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
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

from cacheroute.v1 import common_pb2
from services import codec
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


def plan_page(plan: Plan, budget: int, offset: int = 0) -> common_pb2.Plan:
    """The plan as one message of at most `budget` bytes: whole when it fits, else the
    entries from `offset` that fit, with table_offset/table_size set. ResourceExhausted when
    not even the header and one entry fit (a budget below MIN_BUDGET, or a huge header)."""
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


def plan_chunks(plan: Plan, budget: int) -> list[common_pb2.Plan]:
    """Every slice of the plan, in order (one message when it fits)."""
    first = plan_page(plan, budget)
    out = [first]
    done = len(first.table)
    while first.table_size and done < first.table_size:
        page = plan_page(plan, budget, done)
        out.append(page)
        done += len(page.table)
    return out


class SliceAssembler:
    """Collects table slices back into one Plan message. `add(msg)` returns the complete
    message (a whole plan is returned as is) or None while slices are missing; ValueError
    for a slice that does not continue the one being collected (the partial one is dropped)."""

    def __init__(self) -> None:
        self._head: common_pb2.Plan | None = None
        self._entries: list[common_pb2.PlanEntry] = []

    @property
    def pending(self) -> bool:
        return self._head is not None

    def reset(self) -> None:
        self._head, self._entries = None, []

    def add(self, msg: common_pb2.Plan) -> common_pb2.Plan | None:
        if not msg.table_size:
            self.reset()
            return msg
        if msg.table_offset == 0:
            self._head, self._entries = msg, list(msg.table)
        elif self._head is None or msg.version != self._head.version or msg.table_offset != len(self._entries):
            got = (msg.version, msg.table_offset)
            self.reset()
            raise ValueError(f"plan slice v{got[0]}@{got[1]} does not continue the plan being received")
        else:
            self._entries.extend(msg.table)
        head = self._head
        if len(self._entries) < msg.table_size:
            return None
        if len(self._entries) > msg.table_size or msg.table_size != head.table_size:
            self.reset()
            raise ValueError(f"plan v{msg.version}: slices hold more entries than its table_size {msg.table_size}")
        whole = common_pb2.Plan()
        whole.CopyFrom(head)
        del whole.table[:]
        whole.table.extend(self._entries)
        whole.table_offset = 0
        whole.table_size = 0
        self.reset()
        return whole
