"""The plan model: an immutable, versioned routing plan (SPEC section 2).

A plan maps each admitted key to the distinct replica indices that serve it. Replica
indices refer to `replica_ids`. Building (sizing, admission, LPT placement) lives in
`services.core.planning`; encoding to JSON and protobuf in `services.wire.codec`. A dispatcher's
table is a `ColumnarTable` (services.core.table): the same Mapping, in bytes per key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from services.core.table import ArrayRates, ColumnarRates, ColumnarTable


@dataclass(frozen=True, slots=True)
class SwitchDecision:
    """The keep-or-switch verdict recorded on a candidate (docs/architecture.md)."""

    switch: bool
    reason: str
    staleness_penalty: float = 0.0   # prefill seconds per second lost by keeping the active plan
    rewarm_penalty: float = 0.0      # prefill seconds lost once by re-warming moved keys
    churn: float = 0.0


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """Shadow replay of a plan against Flat-LB on recorded traffic at matched load."""

    ran: bool = False
    passed: bool = False
    reason: str = ""
    requests: int = 0
    qps: float = 0.0
    candidate_hit_rate: float = 0.0
    flat_hit_rate: float = 0.0
    candidate_ttft_p99: float = 0.0
    flat_ttft_p99: float = 0.0
    candidate_capacity: float = 0.0
    flat_capacity: float = 0.0
    margin: float = 0.0
    active_keys: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class TableLayout:
    """Where a plan's rows sit, recorded by the builder that made them (services.core.replan),
    so that the next steps need no pass over the keys by dict: the table in columns, the
    window the plan was built from (`window`, the snapshot's key sequence) and each row's
    position in it, and the parent plan's keys' positions in that window. A plan carries it
    only for the table it was recorded with (`Plan.layout_of`: by identity), so a plan whose
    table was replaced never uses a stale one. Never stored or sent."""

    table: Mapping                     # the Plan.table object this describes
    window: Sequence[str]              # the window's keys; row i is window[positions[i]]
    positions: np.ndarray              # int64, per row
    one: np.ndarray                    # int64, per row: the replica of a one-replica row, -2 for several
    multi: Mapping[int, tuple[int, ...]]   # row -> its replicas (ascending), rows of several
    parent: Mapping | None = None      # the parent plan's table object, as `parent_positions` saw it
    parent_positions: np.ndarray | None = None   # int64 per parent row (its table order): window position, -1 outside
    ids: np.ndarray | None = None      # int64 per row: the key's store id (RatesSnapshot.key_ids), None without
    key_space: str = ""                # what names those ids (RatesSnapshot.key_space)


@dataclass(frozen=True, slots=True)
class Plan:
    version: int
    parent_version: int                      # 0: none
    created_at: float                        # unix seconds (passed in, never read from a clock)
    replica_ids: tuple[str, ...]
    q_cap: float
    warm_slots: int
    table: Mapping[str, tuple[int, ...]]     # admitted key -> distinct replica indices
    rates: Mapping[str, float]               # admitted key -> lambda_b used at build time
    expected_load: tuple[float, ...]         # req/s per replica, cold tail included
    predicted_imbalance: float               # max/mean of expected_load
    total_keys: int
    admitted_keys: int
    admitted_rate_share: float
    churn: float | None = None               # vs parent; None without one
    builder: str = "lpt"                     # "lpt", "incremental", "repair"
    rates_snapshot_id: str = ""
    window_seconds: float = 0.0
    decision: SwitchDecision | None = None
    shadow: ShadowReport | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # free-form figures (JSON-safe)
    # admitted prefix nodes (services.core.prefixes): node id (16 hex digits) -> PrefixEntry
    prefixes: Mapping[str, object] = field(default_factory=dict)
    # the builder's record of the table in columns (TableLayout): a speed-up, never compared,
    # stored or sent; only valid for the table object it names (`layout_of`)
    layout: TableLayout | None = field(default=None, compare=False, repr=False)

    def layout_of(self) -> TableLayout | None:
        lay = self.layout
        return lay if lay is not None and lay.table is self.table else None

    def __post_init__(self) -> None:
        # freeze the mappings so a stored plan cannot be edited in place (a columnar table and
        # its rates, and a builder's ArrayRates, services.core.table, are read-only already)
        if not isinstance(self.table, (MappingProxyType, ColumnarTable)):
            object.__setattr__(self, "table", MappingProxyType(dict(self.table)))
        if not isinstance(self.rates, (MappingProxyType, ColumnarRates, ArrayRates)):
            object.__setattr__(self, "rates", MappingProxyType(dict(self.rates)))
        if not isinstance(self.extra, MappingProxyType):
            object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        if not isinstance(self.prefixes, MappingProxyType):
            object.__setattr__(self, "prefixes", MappingProxyType(dict(self.prefixes)))

    @property
    def replicas(self) -> int:
        return len(self.replica_ids)
