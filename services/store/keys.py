"""The key schema and the codecs of what the keys hold: the only code that knows Redis key
names and hash-field layouts.

The key schema (every key, its type and content; prefix `--key-prefix`, default "cr"; `{...}`
is the Redis Cluster hash tag, so every script or transaction touches one slot) is written
once, in docs/architecture.md, section "Store and key schema"; `Keys` builds the names.

Cache-counter fields: one per replica and counter, "REPLICA|p" (prompt tokens), "REPLICA|c"
(cached tokens), "REPLICA|r" (requests), "REPLICA|f" (requests whose output length is known)
and "REPLICA|o" (their output tokens); so a replica id must not contain the separator
(`replica_id_problem` says so; the collector asks it before anything is stored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections import defaultdict
from typing import Sequence

import numpy as np
import orjson

from services.wire import codec
from services.core.engines import EngineSet, engines_from_dict, engines_to_dict
from services.core.plan import Plan
from services.core.table import MAX_REPLICAS, ColumnarRates, ColumnarTable
from services.model import MAX_KEY_BYTES, ArrivalRecord, CacheStatRecord, HistoryEntry, Mode, PlanEvent


class Keys:
    """Key names under one prefix."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str = "cr") -> None:
        self.prefix = prefix

    def tb(self, idx: int, name: str) -> str:
        """A key of telemetry bucket `idx`: n, pt, xt, gaps, log, v or seen:BATCH."""
        return f"{self.prefix}:{{tb:{idx}}}:{name}"

    def telemetry_since(self) -> str:
        """When telemetry collection began (`Store.mark_telemetry_start`)."""
        return f"{self.prefix}:{{telemetry}}:since"

    def cache(self, name: str) -> str:
        """A cache-counter key: b:IDX, total or seen:BATCH."""
        return f"{self.prefix}:{{cache}}:{name}"

    def budget(self, caller: str) -> str:
        """A caller's telemetry budget (a hash: t, at), one slot per caller: the caller's name
        hashed, so its length and characters never reach the key."""
        return f"{self.prefix}:{{budget:{hashlib.blake2b(caller.encode(), digest_size=8).hexdigest()}}}"

    def plans(self, name: str) -> str:
        """A plan-state key: seq, plan:V, summary:V, index, active, history, mode, pinned,
        lease, fence, events or engines (the engine set, services.core.engines)."""
        return f"{self.prefix}:{{plans}}:{name}"

    def records(self) -> str:
        """The record bus's pub/sub channel (services/dispatcher/recordbus.py; no key is stored).
        Its own hash tag: in a Redis Cluster it is a shard channel owned by one slot's node."""
        return f"{self.prefix}:{{records}}:bus"

    def handover(self, sender: str) -> str:
        """A record-bus hand-over to the starting dispatcher `sender` (a string with a TTL)."""
        return f"{self.prefix}:{{records}}:handover:{sender}"


# ---------------------------------------------------------------------------------------------
# cache-counter fields: "replica|p", "replica|c", "replica|r", "replica|f", "replica|o"

FIELD_SEPARATOR = "|"
COUNTER_KINDS = "pcrfo"       # prompt tokens, cached tokens, requests, completed requests, completion tokens
_SLOTS = {k: i for i, k in enumerate(COUNTER_KINDS)}


def replica_id_problem(replica_id: str) -> str | None:
    """Why `replica_id` cannot name cache-counter fields, or None if it can."""
    if not replica_id:
        return "empty replica_id"
    if len(replica_id.encode("utf-8", "replace")) > MAX_KEY_BYTES or FIELD_SEPARATOR in replica_id:
        return f"replica_id too long or contains {FIELD_SEPARATOR!r}"
    return None


def stat_fields(stats: Sequence[CacheStatRecord]) -> dict[str, int]:
    """Cache-stat records -> field deltas, summed per field."""
    out: dict[str, int] = defaultdict(int)
    for replica, deltas in stat_groups(stats).items():
        for kind, d in zip(COUNTER_KINDS, deltas):
            out[f"{replica}|{kind}"] += d
    return out


def stat_groups(stats: Sequence[CacheStatRecord]) -> dict[str, list[int]]:
    """Cache-stat records -> replica -> [prompt, cached, requests, completed, completion] deltas, summed."""
    out: dict[str, list[int]] = {}
    for s in stats:
        acc = out.setdefault(s.replica_id, [0] * len(COUNTER_KINDS))
        acc[0] += s.prompt_tokens
        acc[1] += s.cached_tokens
        acc[2] += s.requests
        acc[3] += s.completed
        acc[4] += s.completion_tokens
    return out


def merge_counters(into: dict[str, list[int]], fields: dict[str, int]) -> None:
    """Fold "replica|p|c|r|f|o" style hash fields into replica -> [prompt, cached, requests,
    completed, completion tokens]."""
    for name, value in fields.items():
        replica, _, kind = name.rpartition(FIELD_SEPARATOR)
        into.setdefault(replica, [0] * len(COUNTER_KINDS))[_SLOTS[kind]] += int(value)


# ---------------------------------------------------------------------------------------------
# values: plans (services.wire.codec owns the format), the arrival log, history and events


# A plan of COLUMNS_FROM_KEYS keys or more is stored in columns rather than as JSON: reading a
# JSON plan back (orjson's dict and a list per key, then the table's tuples) cost the planner
# that publishes a plan another process wrote 0.6 CPU s at 128,824 keys and 5 s at a million,
# where the same table in columns is a few array views and one hash per key. The layout:
# PLAN_COLUMNS_MAGIC, six little-endian uint64 byte counts, then the rates (float64), key
# lengths (uint32), replica indices (uint16), replica counts (uint8), the plan without its
# table as JSON (summary_of), and the UTF-8 keys back to back (codec.Columns, table order).
# Smaller plans, and plans columns cannot hold (codec.table_columns) or whose rates do not
# cover every key, stay JSON; decode_plan reads both.
PLAN_COLUMNS_MAGIC = b"CRPLNC1\n"
COLUMNS_FROM_KEYS = 10_000
_SECTIONS = 6


def encode_plan(plan: Plan) -> bytes:
    if len(plan.table) >= COLUMNS_FROM_KEYS and len(plan.rates) == len(plan.table):
        try:
            cols = codec.table_columns(plan)
        except ValueError:
            cols = None
        if cols is not None:
            head = codec.plan_to_json(summary_of(plan))
            arrays = [cols.rates.astype("<f8"), cols.key_lengths.astype("<u4"), cols.members.astype("<u2"),
                      cols.counts.astype(np.uint8)]
            sizes = np.array([a.nbytes for a in arrays] + [len(head), len(cols.keys)], dtype="<u8")
            return b"".join([PLAN_COLUMNS_MAGIC, sizes.tobytes(), *(a.tobytes() for a in arrays), head, cols.keys])
    return codec.plan_to_json(plan)


def decode_plan(data: bytes) -> Plan:
    if data[:len(PLAN_COLUMNS_MAGIC)] == PLAN_COLUMNS_MAGIC:
        return _plan_from_columns(data)
    return codec.plan_from_json(data)


def _plan_from_columns(data: bytes) -> Plan:
    """encode_plan's columns back: arrays over `data` itself; ValueError when malformed."""
    start = len(PLAN_COLUMNS_MAGIC) + 8 * _SECTIONS
    if len(data) < start:
        raise ValueError("plan in columns: truncated header")
    sizes = [int(x) for x in np.frombuffer(data, dtype="<u8", count=_SECTIONS, offset=len(PLAN_COLUMNS_MAGIC))]
    if start + sum(sizes) != len(data) or sizes[0] % 8 or sizes[1] % 4 or sizes[2] % 2:
        raise ValueError("plan in columns: section sizes do not match the stored bytes")
    offs = np.cumsum([start] + sizes).tolist()
    rates, lengths, members, counts = (np.frombuffer(data, dtype=t, count=sizes[i] // w, offset=offs[i])
                                       for i, (t, w) in enumerate((("<f8", 8), ("<u4", 4), ("<u2", 2), (np.uint8, 1))))
    head = codec.plan_from_json(data[offs[4]:offs[5]])
    table = ColumnarTable.from_columns(data[offs[5]:offs[6]], lengths, counts, members,
                                       max(1, min(len(head.replica_ids), MAX_REPLICAS)))
    plan = dataclasses.replace(head, table=table, rates=ColumnarRates(table, rates))
    codec.check_plan(plan)
    return plan


def summary_of(plan: Plan) -> Plan:
    """The plan without its table and rates: what listings carry."""
    return dataclasses.replace(plan, table={}, rates={})


_key = operator.itemgetter(0)


def log_blob(rows: Sequence[ArrivalRecord]) -> bytes:
    """Arrival-log entries, newline-separated: JSON [key, time, prompt_tokens, prefix_tokens]
    each (JSON escapes newlines inside strings). Encoded in one orjson call, the outer
    array's "],[" separators becoming newlines; only a key containing "],[" itself needs
    one call per record."""
    if not rows:
        return b""
    if "],[" in "\0".join(map(_key, rows)):
        return b"\n".join(orjson.dumps(list(r)) for r in rows)
    return orjson.dumps(rows, default=tuple)[1:-1].replace(b"],[", b"]\n[")


def log_lines(rows: Sequence[ArrivalRecord]) -> list[bytes]:
    return log_blob(rows).split(b"\n") if rows else []


def arrival_from_log(line: bytes | str) -> ArrivalRecord:
    return ArrivalRecord(*orjson.loads(line))


def event_from_json(data: bytes | str) -> PlanEvent:
    doc = orjson.loads(data)
    return PlanEvent(doc["event"], int(doc["active_version"]), Mode(doc["mode"]), float(doc["at"]))


def history_from_json(data: bytes | str) -> HistoryEntry:
    d = orjson.loads(data)
    return HistoryEntry(int(d["version"]), int(d["previous"]), d["event"], d.get("reason", ""),
                        float(d["at"]), int(d.get("token", 0)))


# ---------------------------------------------------------------------------------------------
# sealed buckets: a closed telemetry bucket's three count hashes as one blob (`P:{tb:IDX}:sealed`)
#
#   b"CRS1" | uint32 m | uint32 L | L bytes: the m keys joined by NUL | m x 3 int64 (n, pt, xt)
#
# little-endian; keys once, counts as one packed array. A bucket with a key containing NUL or a
# count at or past 2**63 is not sealed (its hashes stay as they are).

SEAL_MAGIC = b"CRS1"
_SEAL_HEAD = 12


def seal_blob(keys: Sequence[bytes], values) -> bytes | None:
    """The blob of one bucket's per-key (n, pt, xt) rows, or None if it cannot be sealed."""
    import numpy as np

    joined = b"\0".join(keys)
    if len(keys) != (joined.count(b"\0") + 1 if keys else 0) or values.dtype == object:
        return None
    head = SEAL_MAGIC + len(keys).to_bytes(4, "little") + len(joined).to_bytes(4, "little")
    return head + joined + np.ascontiguousarray(values, dtype="<i8").tobytes()


def unseal_blob(blob: bytes):
    """keys (list of bytes) and an (m, 3) int64 array from `seal_blob`'s output."""
    import numpy as np

    if blob[:4] != SEAL_MAGIC:
        raise ValueError("not a sealed bucket")
    m = int.from_bytes(blob[4:8], "little")
    size = int.from_bytes(blob[8:12], "little")
    keys = blob[_SEAL_HEAD:_SEAL_HEAD + size].split(b"\0") if m else []
    values = np.frombuffer(blob, dtype="<i8", count=3 * m, offset=_SEAL_HEAD + size).reshape(m, 3)
    return keys, values.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# the engine set: one hash, {version, set (JSON of services.core.engines.engines_to_dict)}

def engines_blob(engines) -> bytes:
    return orjson.dumps(engines_to_dict(engines))


def engines_from_blob(blob: bytes | None):
    return engines_from_dict(orjson.loads(blob)) if blob else EngineSet()

