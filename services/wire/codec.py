"""Plan codecs: `Plan` <-> JSON plan files (orjson) and <-> `cacheroute.v1.Plan` protobuf.

Plan file (JSON object, `format` = "cacheroute.plan/1"): every `Plan` field under its own
name, with `replicas` holding the replica ids and `table` mapping key -> list of replica
indices into `replicas`; `decision` and `shadow` are objects or null; `churn` is null without
a parent. Floats round-trip exactly (orjson writes the shortest repr).

Protobuf: one PlanEntry (key, replica indices, rate) per admitted key in table order, or, for
a reader that asks for them, the table in columns (`PlanColumns`: the keys as one blob, key
lengths, replica counts, replica indices and rates as little-endian arrays; `Columns` here),
decoded into a `ColumnarTable` (services.core.table) or a dict; the build inputs go in
PlanInputs. `extra` has no wire field and is dropped, except the window's
available and achieved hit rates (prefix plans), which have their own; `churn` travels as
`has_parent` + `churn` (has_parent is true exactly when the plan carries a churn figure).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import orjson

from cacheroute.v1 import common_pb2
from services.core.plan import Plan, ShadowReport, SwitchDecision
from services.core.planning import RowColumns
from services.core.prefixes import PrefixEntry, node_name, parse_node_name
from services.core.table import MAX_REPLICAS, MAX_ROW, ArrayRates, ColumnarRates, ColumnarTable

FORMAT = "cacheroute.plan/1"
HIT_RATES = ("available_hit_rate", "achieved_hit_rate")     # the only `extra` figures on the wire


# ---------------------------------------------------------------------------------------------
# JSON



# JSON has no inf/NaN (orjson writes null); a shadow replay's p99 can be unbounded, so
# non-finite floats travel as the strings "inf", "-inf" and "nan".
def _finite_json(fields: dict) -> dict:
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()}


_SHADOW_FLOATS = frozenset(f.name for f in dataclasses.fields(ShadowReport) if f.type in (float, "float"))


def _floats_back(fields: dict) -> dict:
    return {k: (float(v) if k in _SHADOW_FLOATS and isinstance(v, str) else v) for k, v in fields.items()}

def _plain(mapping: Mapping) -> dict:
    """A dict copy of a plan's mapping: a mappingproxy's own copy() copies its dict in C,
    some 20x faster than dict(proxy), which goes through the mapping protocol per key."""
    return mapping.copy() if isinstance(mapping, (dict, MappingProxyType)) else dict(mapping)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": plan.version,
        "parent_version": plan.parent_version,
        "created_at": plan.created_at,
        "replicas": list(plan.replica_ids),
        "q_cap": plan.q_cap,
        "warm_slots": plan.warm_slots,
        "table": _plain(plan.table),     # rows are tuples: orjson writes them as arrays (no list per key)
        "rates": _plain(plan.rates),
        "expected_load": list(plan.expected_load),
        "predicted_imbalance": plan.predicted_imbalance,
        "total_keys": plan.total_keys,
        "admitted_keys": plan.admitted_keys,
        "admitted_rate_share": plan.admitted_rate_share,
        "churn": plan.churn,
        "builder": plan.builder,
        "rates_snapshot_id": plan.rates_snapshot_id,
        "window_seconds": plan.window_seconds,
        "decision": dataclasses.asdict(plan.decision) if plan.decision is not None else None,
        "shadow": _finite_json(dataclasses.asdict(plan.shadow)) if plan.shadow is not None else None,
        "extra": dict(plan.extra),
        "prefixes": {name: {"replicas": list(e.replicas), "rate": e.rate, "tokens": e.tokens, "keys": e.keys}
                     for name, e in plan.prefixes.items()},
    }


def _prefixes_from(data: Any) -> dict[str, PrefixEntry]:
    if not data:
        return {}
    out = {}
    for name, e in data.items():
        parse_node_name(str(name))
        out[str(name)] = PrefixEntry(tuple(int(i) for i in e["replicas"]), float(e.get("rate", 0.0)),
                                     int(e.get("tokens", 0)), int(e.get("keys", 0)))
    return out


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """Decode a plan-file object; ValueError (one line) when it is not a valid plan."""
    if not isinstance(data, Mapping):
        raise ValueError("plan file must hold a JSON object")
    if data.get("format", FORMAT) != FORMAT:
        raise ValueError(f"unsupported plan format {data.get('format')!r}, expected {FORMAT!r}")
    try:
        replica_ids = tuple(str(r) for r in data["replicas"])
        table = _table_from(data["table"])
        rates = _rates_from(data.get("rates", {}))
        plan = Plan(
            version=int(data["version"]),
            parent_version=int(data.get("parent_version", 0)),
            created_at=float(data.get("created_at", 0.0)),
            replica_ids=replica_ids,
            q_cap=float(data["q_cap"]),
            warm_slots=int(data["warm_slots"]),
            table=table,
            rates=rates,
            expected_load=tuple(float(x) for x in data["expected_load"]),
            predicted_imbalance=float(data["predicted_imbalance"]),
            total_keys=int(data.get("total_keys", len(table))),
            admitted_keys=int(data.get("admitted_keys", len(table))),
            admitted_rate_share=float(data.get("admitted_rate_share", 0.0)),
            churn=None if data.get("churn") is None else float(data["churn"]),
            builder=str(data.get("builder", "lpt")),
            rates_snapshot_id=str(data.get("rates_snapshot_id", "")),
            window_seconds=float(data.get("window_seconds", 0.0)),
            decision=None if data.get("decision") is None else SwitchDecision(**data["decision"]),
            shadow=None if data.get("shadow") is None else ShadowReport(**_floats_back(data["shadow"])),
            extra=dict(data.get("extra") or {}),
            prefixes=_prefixes_from(data.get("prefixes")),
        )
    except KeyError as exc:
        raise ValueError(f"plan file is missing field {exc.args[0]!r}") from None
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"plan file has a malformed field: {exc}") from None
    check_plan(plan)
    return plan


def _table_from(raw: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """JSON table -> key: tuple of ints. A million rows: the rows are taken as they are when
    numpy sees only integers in them (orjson's usual output), else converted one by one."""
    rows = list(raw.values())
    if set(map(type, rows)) <= {list} and set(map(type, raw)) <= {str}:
        flat = list(itertools.chain.from_iterable(rows))
        if not flat or np.array(flat).dtype.kind in "iu":
            return dict(zip(raw, map(tuple, rows)))
    return {str(k): tuple(int(i) for i in row) for k, row in raw.items()}


def _rates_from(raw: Mapping[str, Any]) -> dict[str, float]:
    values = list(raw.values())
    if set(map(type, raw)) <= {str} and (not values or np.array(values).dtype.kind == "f"):
        return dict(raw)
    return {str(k): float(v) for k, v in raw.items()}


def check_plan(plan: Plan) -> None:
    """Structural checks a decoded plan must pass (ValueError, one line)."""
    n = len(plan.replica_ids)
    if n < 1:
        raise ValueError("plan has no replicas")
    if len(set(plan.replica_ids)) != n:
        raise ValueError("plan has duplicate replica ids")
    if len(plan.expected_load) != n:
        raise ValueError(f"plan has {len(plan.expected_load)} expected loads for {n} replicas")
    if isinstance(plan.table, ColumnarTable):
        _check_columnar(plan)
    else:
        _check_rows(plan)
    if not all(math.isfinite(x) for x in plan.expected_load):
        raise ValueError("plan has a non-finite expected load")
    for name, entry in plan.prefixes.items():
        row = entry.replicas
        if not row or len(set(row)) != len(row) or not all(0 <= i < n for i in row):
            raise ValueError(f"plan row for prefix {name} is not a set of distinct replica indices < {n}: {list(row)}")
        if not (math.isfinite(entry.rate) and entry.rate >= 0 and entry.tokens >= 0):
            raise ValueError(f"plan prefix {name} has a negative or non-finite rate or token count")


def _check_columnar(plan: Plan) -> None:
    """A ColumnarTable checked its rows when it was built; what is left: indices below this
    plan's replica count, and rates over the same keys."""
    n, table = len(plan.replica_ids), plan.table
    if table.members.size and int(table.members.max()) >= n:
        raise ValueError(f"plan row has a replica index {int(table.members.max())} >= {n}")
    rates = plan.rates
    if isinstance(rates, ColumnarRates) and rates.table is table:
        return
    if any(key not in table for key in rates):
        raise ValueError("plan has rates for keys outside its table")


def _check_rows(plan: Plan) -> None:
    n = len(plan.replica_ids)
    # vectorised over the table (a million rows); the slow scan below only names the culprit
    rows = list(plan.table.values())
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lens.sum()))
    multi = np.flatnonzero(lens > 1).tolist()
    bad = bool(lens.size and lens.min() < 1) or bool(flat.size and (flat.min() < 0 or flat.max() >= n)) or \
        any(len(set(rows[i])) != len(rows[i]) for i in multi)
    for key, row in (plan.table.items() if bad else ()):
        if not row or len(set(row)) != len(row) or not all(0 <= i < n for i in row):
            raise ValueError(f"plan row for key {key!r} is not a set of distinct replica indices < {n}: {list(row)}")
    if set(plan.rates) - set(plan.table):
        raise ValueError("plan has rates for keys outside its table")


def plan_to_json(plan: Plan) -> bytes:
    return orjson.dumps(plan_to_dict(plan))


def plan_from_json(data: bytes | str) -> Plan:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    return plan_from_dict(obj)


def write_plan_file(path: str | os.PathLike[str], plan: Plan) -> None:
    """Write atomically (temp file + rename), so a reader never sees half a plan."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(plan_to_json(plan))
    os.replace(tmp, path)


def read_plan_file(path: str | os.PathLike[str]) -> Plan:
    """Read a plan file; OSError when unreadable, ValueError when not a valid plan."""
    return plan_from_json(Path(path).read_bytes())


# ---------------------------------------------------------------------------------------------
# protobuf


def decision_to_proto(decision: SwitchDecision) -> common_pb2.SwitchDecision:
    return common_pb2.SwitchDecision(**dataclasses.asdict(decision))


def decision_from_proto(msg: common_pb2.SwitchDecision) -> SwitchDecision:
    return SwitchDecision(switch=msg.switch, reason=msg.reason, staleness_penalty=msg.staleness_penalty,
                          rewarm_penalty=msg.rewarm_penalty, churn=msg.churn)


def shadow_to_proto(report: ShadowReport) -> common_pb2.ShadowReport:
    return common_pb2.ShadowReport(**dataclasses.asdict(report))


def shadow_from_proto(msg: common_pb2.ShadowReport) -> ShadowReport:
    return ShadowReport(**{f.name: getattr(msg, f.name) for f in dataclasses.fields(ShadowReport)})


def plan_header_proto(plan: Plan) -> common_pb2.Plan:
    """Every field of the plan but its table."""
    msg = common_pb2.Plan(
        version=plan.version,
        parent_version=plan.parent_version,
        created_at=plan.created_at,
        inputs=common_pb2.PlanInputs(rates_snapshot_id=plan.rates_snapshot_id, replica_ids=plan.replica_ids,
                                     q_cap=plan.q_cap, warm_slots=plan.warm_slots,
                                     window_seconds=plan.window_seconds),
        expected_load=plan.expected_load,
        predicted_imbalance=plan.predicted_imbalance,
        total_keys=plan.total_keys,
        admitted_keys=plan.admitted_keys,
        admitted_rate_share=plan.admitted_rate_share,
        churn=plan.churn or 0.0,
        has_parent=plan.churn is not None,
        builder=plan.builder,
    )
    msg.prefixes.extend(common_pb2.PrefixEntry(node=parse_node_name(name), replicas=e.replicas, rate=e.rate,
                                               tokens=e.tokens, keys=e.keys)
                        for name, e in plan.prefixes.items())
    for name in HIT_RATES:
        if name in plan.extra:
            setattr(msg, name, float(plan.extra[name]))
    if plan.decision is not None:
        msg.decision.CopyFrom(decision_to_proto(plan.decision))
    if plan.shadow is not None:
        msg.shadow.CopyFrom(shadow_to_proto(plan.shadow))
    return msg


def plan_to_proto(plan: Plan, columnar: bool = False) -> common_pb2.Plan:
    """The whole plan; `columnar`: its table as Plan.columns instead of one entry per key."""
    msg = plan_header_proto(plan)
    if columnar:
        msg.columns.CopyFrom(table_columns(plan).to_proto())
        return msg
    rates = plan.rates
    msg.table.extend(common_pb2.PlanEntry(key=key, replicas=row, rate=rates.get(key, 0.0))
                     for key, row in plan.table.items())
    return msg


def plan_from_proto(msg: common_pb2.Plan, columnar: bool = False) -> Plan:
    """Decode; ValueError (one line) when the message is not a valid plan. `columnar`: the
    table as a ColumnarTable (the dispatcher's), else a dict, whichever form it came in."""
    return plan_from_slices([msg], columnar)


def plan_from_slices(msgs: list[common_pb2.Plan], columnar: bool = False) -> Plan:
    """Decode a plan from its consecutive table slices (services.wire.planwire; the first carries
    every other field), without joining the messages first."""
    head = msgs[0]
    if any(m.HasField("columns") for m in msgs):
        if any(m.table for m in msgs):
            raise ValueError("plan message has both a table and table columns")
        cols = Columns.from_proto([m.columns for m in msgs])
        table = ColumnarTable.from_columns(cols.keys, cols.key_lengths, cols.counts, cols.members,
                                           max(1, min(len(head.inputs.replica_ids), MAX_REPLICAS)))
        rates: Mapping[str, float] = ColumnarRates(table, cols.rates)
        if not columnar:
            table, rates = dict(table.items()), dict(rates.items())
    else:
        entries = [e for m in msgs for e in m.table] if len(msgs) > 1 else msgs[0].table
        keys = [e.key for e in entries]
        table = dict(zip(keys, (tuple(e.replicas) for e in entries)))
        if len(table) != len(entries):
            raise ValueError("plan message repeats a key")
        rates = dict(zip(keys, (e.rate for e in entries)))
        if columnar:
            table = ColumnarTable.from_mapping(table, max(1, min(len(head.inputs.replica_ids), MAX_REPLICAS)))
            rates = ColumnarRates(table, np.fromiter(rates.values(), dtype=np.float64, count=len(rates)))
    msg = head
    plan = Plan(
        version=msg.version,
        parent_version=msg.parent_version,
        created_at=msg.created_at,
        replica_ids=tuple(msg.inputs.replica_ids),
        q_cap=msg.inputs.q_cap,
        warm_slots=msg.inputs.warm_slots,
        table=table,
        rates=rates,
        expected_load=tuple(msg.expected_load),
        predicted_imbalance=msg.predicted_imbalance,
        total_keys=msg.total_keys,
        admitted_keys=msg.admitted_keys,
        admitted_rate_share=msg.admitted_rate_share,
        churn=msg.churn if msg.has_parent else None,
        builder=msg.builder,
        rates_snapshot_id=msg.inputs.rates_snapshot_id,
        window_seconds=msg.inputs.window_seconds,
        decision=decision_from_proto(msg.decision) if msg.HasField("decision") else None,
        shadow=shadow_from_proto(msg.shadow) if msg.HasField("shadow") else None,
        prefixes={node_name(e.node): PrefixEntry(tuple(e.replicas), e.rate, e.tokens, e.keys) for e in msg.prefixes},
        extra={name: getattr(msg, name) for name in HIT_RATES if msg.HasField(name)},
    )
    if len(plan.prefixes) != len(msg.prefixes):
        raise ValueError("plan message repeats a prefix node")
    check_plan(plan)
    return plan


# ---------------------------------------------------------------------------------------------
# the table in columns (PlanColumns)


@dataclasses.dataclass(frozen=True, eq=False)
class Columns:
    """A plan table as arrays, table order: what PlanColumns carries (common.proto)."""

    keys: bytes                 # UTF-8 keys back to back
    key_lengths: np.ndarray     # uint32[n]
    counts: np.ndarray          # uint8[n]
    members: np.ndarray         # uint16[sum(counts)]
    rates: np.ndarray           # float64[n]

    def __len__(self) -> int:
        return int(self.key_lengths.size)

    @functools.cached_property
    def key_offs(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.key_lengths, dtype=np.int64)))

    @functools.cached_property
    def row_offs(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.counts, dtype=np.int64)))

    @functools.cached_property
    def entry_bytes(self) -> np.ndarray:
        """Bytes each key adds to a PlanColumns message (key, length, count, indices, rate)."""
        return self.key_lengths.astype(np.int64) + 13 + 2 * self.counts.astype(np.int64)

    def to_proto(self, start: int = 0, stop: int | None = None) -> common_pb2.PlanColumns:
        """Keys [start, stop) as one PlanColumns message."""
        stop = len(self) if stop is None else stop
        ko, ro = self.key_offs, self.row_offs
        return common_pb2.PlanColumns(
            keys=self.keys[ko[start]:ko[stop]],
            key_lengths=self.key_lengths[start:stop].astype("<u4").tobytes(),
            replica_counts=self.counts[start:stop].astype(np.uint8).tobytes(),
            replicas=self.members[ro[start]:ro[stop]].astype("<u2").tobytes(),
            rates=self.rates[start:stop].astype("<f8").tobytes())

    @classmethod
    def from_proto(cls, parts: list[common_pb2.PlanColumns]) -> "Columns":
        """Arrays over the messages' bytes (no per-entry decoding); ValueError when a message's
        arrays do not agree with each other."""
        arrays = []
        for c in parts:
            if len(c.key_lengths) % 4 or len(c.replicas) % 2 or len(c.rates) % 8:
                raise ValueError("plan columns: an array's bytes are not a whole number of entries")
            lengths = np.frombuffer(c.key_lengths, dtype="<u4")
            counts = np.frombuffer(c.replica_counts, dtype=np.uint8)
            members = np.frombuffer(c.replicas, dtype="<u2")
            rates = np.frombuffer(c.rates, dtype="<f8")
            if not lengths.size == counts.size == rates.size:
                raise ValueError(f"plan columns: {lengths.size} key lengths, {counts.size} replica counts "
                                 f"and {rates.size} rates")
            if int(lengths.sum(dtype=np.int64)) != len(c.keys) or int(counts.sum(dtype=np.int64)) != members.size:
                raise ValueError("plan columns: key lengths or replica counts do not match the bytes sent")
            arrays.append((c.keys, lengths, counts, members, rates))
        if len(arrays) == 1:
            return cls(*arrays[0])
        keys, lengths, counts, members, rates = zip(*arrays)
        return cls(b"".join(keys), np.concatenate(lengths), np.concatenate(counts), np.concatenate(members),
                   np.concatenate(rates))


# The Columns of the last few plans, by identity (the plan itself held, so its id cannot be
# reused): the planner computes them when it writes a plan (store.put_plan -> encode_plan)
# and again for its watchers from the same object (the store hands back the plan it wrote);
# for a dict table that is per-key work, ~0.8 CPU s at a million keys, now done once. Plans
# are immutable, so a plan's columns never change.
_COLUMNS: "OrderedDict[int, tuple[Plan, Columns]]" = OrderedDict()
_COLUMNS_KEPT = 2
_COLUMNS_LOCK = threading.Lock()


def table_columns(plan: Plan) -> Columns:
    """The plan's table (and rates) as Columns; ValueError when a plan cannot be sent in
    columns (more than 65,535 replicas, or a key on more than 255)."""
    with _COLUMNS_LOCK:
        kept = _COLUMNS.get(id(plan))
        if kept is not None and kept[0] is plan:
            return kept[1]
    cols = _table_columns(plan)
    if len(cols) >= 1000:
        with _COLUMNS_LOCK:
            _COLUMNS[id(plan)] = (plan, cols)
            _COLUMNS.move_to_end(id(plan))
            while len(_COLUMNS) > _COLUMNS_KEPT:
                _COLUMNS.popitem(last=False)
    return cols


def _table_columns(plan: Plan) -> Columns:
    table, rates = plan.table, plan.rates
    if len(plan.replica_ids) > MAX_REPLICAS:
        raise ValueError(f"a plan in columns lists at most {MAX_REPLICAS} replicas, this one {len(plan.replica_ids)}")
    if isinstance(table, ColumnarTable):
        counts = table.counts
        if isinstance(rates, ColumnarRates) and rates.table is table:
            values = rates.values_
        else:
            values = np.fromiter((rates.get(k, 0.0) for k in table), dtype=np.float64, count=len(table))
        blob, lengths, members = table.keys_blob, table.key_lengths, table.members
    else:
        keys = list(table)
        blob, lengths = _key_blob(keys)
        cols = RowColumns.of(plan)          # the builder's record of the rows when it has one
        counts, members = cols.lens, cols.flat()
        values = rates.values_ if isinstance(rates, ArrayRates) and rates.table is table else _rates_in_order(rates, keys)
    if counts.size and int(counts.max()) > MAX_ROW:
        raise ValueError(f"a plan in columns puts a key on at most {MAX_ROW} replicas")
    return Columns(blob, lengths.astype(np.uint32, copy=False), counts.astype(np.uint8),
                   members.astype(np.uint16), values)


def _key_blob(keys: list[str]) -> tuple[bytes, np.ndarray]:
    """The keys' UTF-8 bytes back to back and each key's byte length. ASCII keys (the common
    case) in one join and one encode, their lengths from len(); others one encode per key
    (a million keys: ~0.05 CPU s against ~0.6)."""
    text = "".join(keys)
    if text.isascii():
        return text.encode("ascii"), np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
    encoded = [k.encode("utf-8") for k in keys]
    return b"".join(encoded), np.fromiter(map(len, encoded), dtype=np.uint32, count=len(keys))


def _rates_in_order(rates: Mapping[str, float], keys: list[str]) -> np.ndarray:
    """The rate of each key (0.0 without one). Every builder writes a plan's rates in its
    table's order, so when the two key lists are equal (a C-level compare, by identity for
    the same str objects) the values are taken in order: a million lookups by key cost ~0.8
    CPU s, the ordered pass ~0.06 s."""
    if len(rates) == len(keys) and isinstance(rates, (dict, MappingProxyType)) and list(rates) == keys:
        return np.fromiter(rates.values(), dtype=np.float64, count=len(keys))
    return np.fromiter(map(rates.get, keys, itertools.repeat(0.0)), dtype=np.float64, count=len(keys))


def plan_summary(plan: Plan, active: bool = False, pinned: bool = False) -> common_pb2.PlanSummary:
    """A plan without its table, for listings."""
    msg = common_pb2.PlanSummary(
        version=plan.version,
        parent_version=plan.parent_version,
        created_at=plan.created_at,
        replicas=plan.replicas,
        total_keys=plan.total_keys,
        admitted_keys=plan.admitted_keys,
        admitted_rate_share=plan.admitted_rate_share,
        predicted_imbalance=plan.predicted_imbalance,
        churn=plan.churn or 0.0,
        builder=plan.builder,
        active=active,
        pinned=pinned,
    )
    if plan.decision is not None:
        msg.decision.CopyFrom(decision_to_proto(plan.decision))
    if plan.shadow is not None:
        msg.shadow.CopyFrom(shadow_to_proto(plan.shadow))
    return msg


def rates_for(table: ColumnarTable, rates: Mapping[str, float]) -> ColumnarRates:
    """`rates` over a columnar table's index (0.0 for a key without one); shares the array
    when `rates` is already over a table with the same rows."""
    if isinstance(rates, ColumnarRates) and len(rates.table) == len(table) and \
            (rates.table is table or rates.table.keys_blob is table.keys_blob):
        return ColumnarRates(table, rates.values_)
    return ColumnarRates(table, np.fromiter((rates.get(k, 0.0) for k in table), dtype=np.float64, count=len(table)))


def columnar_plan(plan: Plan) -> Plan:
    """The plan with its table (and rates) as a ColumnarTable: bytes per key, the form a
    dispatcher keeps. A plan already columnar is returned as is."""
    if isinstance(plan.table, ColumnarTable):
        return plan
    table = ColumnarTable.from_mapping(plan.table, max(1, min(len(plan.replica_ids), MAX_REPLICAS)))
    return dataclasses.replace(plan, table=table, rates=rates_for(table, plan.rates))
