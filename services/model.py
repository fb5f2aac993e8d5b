"""The domain vocabulary every layer speaks: records the services exchange, control state,
plan events, replicas and the limits and defaults they share. Plain data, no I/O.

The core, the store, the planner, the gate, the dispatcher and the clients import these names
from here (the store re-exports them for callers that speak to it), so each is defined once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

# Routing keys (and replica ids) longer than this, in UTF-8 bytes, are refused.
MAX_KEY_BYTES = 256

# The cold-tail policy of the cacheroute policy, the simulator and live dispatchers alike:
# "chwbl" (bounded-load consistent hashing on the key) or "p2c" (power of two choices).
COLD_TAILS = ("p2c", "chwbl")
DEFAULT_COLD_TAIL = "chwbl"


class Mode(str, enum.Enum):
    PLANNED = "planned"
    FLAT = "flat"


# ---------------------------------------------------------------------------------------------
# telemetry


class ArrivalRecord(NamedTuple):
    """One request arrival in aggregate form: routing key, time, token counts. No content.
    A tuple, so the collector can hand the store plain `(key, time, prompt, prefix)` rows
    without building one object per record."""

    key: str
    time: float
    prompt_tokens: int = 0
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CacheStatRecord:
    """Per-replica deltas since the replica's previous report. `completed` counts the requests
    whose output length is known (finished, or answered with a `usage`), `completion_tokens`
    their output tokens: the window's mean output per request is their ratio (the capacity
    advisor's input; 0 and 0 when the reporter cannot tell)."""

    replica_id: str
    prompt_tokens: int
    cached_tokens: int
    requests: int
    completed: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CacheCounters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    completed: int = 0               # requests whose output length is known (CacheStatRecord)
    completion_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Token-weighted hit rate (SPEC section 6); 0 without traffic."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def mean_output_tokens(counters: Iterable[CacheCounters]) -> float | None:
    """Mean output tokens per request over some replicas' counters; None when no reporter said."""
    done = tokens = 0
    for c in counters:
        done += c.completed
        tokens += c.completion_tokens
    return tokens / done if done else None


@dataclass(frozen=True, slots=True)
class CacheStatsWrite:
    """What `Store.write_cache_stats` did: counted (False: a duplicate batch, nothing written)
    and the replicas whose records were refused because a lifetime counter would pass the limit."""

    counted: bool
    refused: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RatesSnapshot:
    """Per-key rates over a window, hottest first (ties: key ascending)."""

    snapshot_id: str
    start: float                          # unix seconds, first bucket's start
    end: float                            # `now` of the read
    window_seconds: float                 # end - start: the span rates are divided by
    total_arrivals: int                   # every counted arrival, untracked ones included
    keys: tuple[str, ...]
    rates: tuple[float, ...]              # req/s
    mean_prompt_tokens: tuple[float, ...]
    mean_prefix_tokens: tuple[float, ...]
    untracked_arrivals: int = 0           # arrivals of keys beyond a bucket's key cap (no per-key count)
    # the store's id of each key (an int64 array, distinct per distinct key), stable between the
    # reads of one store while `key_space` stays the same ("": no ids): the planner matches the
    # active plan's keys by id instead of by a dict over the window (services.core.replan)
    key_ids: object = field(default=None, compare=False, repr=False)
    key_space: str = field(default="", compare=False)

    def rate_map(self) -> dict[str, float]:
        return dict(zip(self.keys, self.rates))

    def prefix_map(self) -> dict[str, float]:
        return dict(zip(self.keys, self.mean_prefix_tokens))


# ---------------------------------------------------------------------------------------------
# control state and plan events


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the dispatchers and the planner loop act on, read in one round trip."""

    active_version: int = 0               # 0: none
    mode: Mode = Mode.PLANNED
    mode_reason: str = ""
    mode_changed_at: float = 0.0
    pinned_version: int = 0               # 0: none
    latest_version: int = 0


@dataclass(frozen=True, slots=True)
class Activation:
    active_version: int
    previous_version: int
    changed: bool                         # False: the version was already active


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    version: int
    previous: int
    event: str                            # "activate" | "rollback"
    reason: str
    at: float
    fencing_token: int = 0                # 0: a manual activation


@dataclass(frozen=True, slots=True)
class PlanEvent:
    event: str                            # "activate" | "rollback" | "mode"
    active_version: int
    mode: Mode
    at: float


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    holder: str
    token: int
    ttl_seconds: float


# ---------------------------------------------------------------------------------------------
# replicas


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    address: str = ""                     # host:port; "" when only the id is known


def parse_replicas(text: str, *, need_address: bool = False) -> tuple[Replica, ...]:
    """`id=host:port,...` (or, unless `need_address`, bare ids `a,b`) -> replicas in the
    given order. ValueError, one line, when there are none, an id is empty or repeated, or
    (need_address) an entry is not id=host:port."""
    out: list[Replica] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        rid, sep, address = (s.strip() for s in item.partition("="))
        if need_address and not (sep and rid and address):
            raise ValueError(f"replica {item!r} is not id=host:port")
        out.append(Replica(rid, address))
    if not out:
        raise ValueError("no replicas given (--replicas or CACHEROUTE_REPLICAS)")
    ids = [r.id for r in out]
    if not all(ids):
        raise ValueError(f"replica list has an empty replica id: {text!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"replica list repeats a replica id: {text!r}")
    return tuple(out)
