"""The engine set: which engines a deployment routes to, by slot, and how it changes.

Rule. Every engine ever added holds one *slot* (0, 1, 2, ... in the order they were added)
and an id; slots are never renumbered and ids never reused, so plans (which name replicas by
id) and every dispatcher's per-replica arrays (indexed by slot) stay valid while engines come
and go. An engine is in one of three states:

  active     the planner places keys there; dispatchers route there
  draining   the planner places no keys there and re-plans at once (only the drained
             engine's keys move); dispatchers keep routing there until their installed plan
             holds no key on it (or the mode is flat), then send nothing new; in-flight
             requests finish
  removed    gone for good: the slot stays, permanently out of rotation, never polled

Transitions: add (new slot, active), drain (active -> draining), remove (draining -> removed;
an active engine must be drained first unless forced), and `reconcile`, which follows a set of
addresses discovered for one source (a DNS name, re-resolved periodically: a Kubernetes
headless Service): new addresses are added, addresses no longer resolved are drained, and a
draining engine of that source that the active plan no longer names is removed; an address
that resolves again while draining becomes active again.

The set is versioned (`version`, +1 per change) and stored next to the plans
(services/store), written with a compare-and-set on the version, so every planner and
dispatcher sees the same set and a restart keeps it. API shape after smg's worker registry
(lightseekorg/smg docs/reference/api/admin.md: `POST /workers {url}` -> worker id,
`DELETE /workers/{id}`, `GET /workers`; 409 for a worker that exists), with the drain step smg
does not have, because moving a cache-aware plan's keys off an engine must happen before it
leaves. Pure: no I/O, `now` passed in.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

ACTIVE, DRAINING, REMOVED = "active", "draining", "removed"
STATES = (ACTIVE, DRAINING, REMOVED)
MAX_ENGINES = 4096            # slots a set may hold (removed ones included)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,62}$")


class EngineNotFound(LookupError):
    """No engine has that id or address (NOT_FOUND)."""


class EngineConflict(ValueError):
    """The change contradicts the set: an id or address in use, a state that forbids it
    (FAILED_PRECONDITION for states, ALREADY_EXISTS for ids and addresses)."""

    def __init__(self, message: str, *, exists: bool = False) -> None:
        super().__init__(message)
        self.exists = exists


@dataclass(frozen=True)
class Engine:
    slot: int
    id: str
    address: str = ""             # host:port or KIND+URL (services.backends); "" when only the id is known
    state: str = ACTIVE
    source: str = "manual"        # "config", "manual" or "dns:NAME" (discovery)
    changed_at: float = 0.0       # unix seconds of the last state change


@dataclass(frozen=True)
class EngineSet:
    version: int = 0              # 0: never written
    engines: tuple[Engine, ...] = ()

    def by_id(self, engine_id: str) -> Engine | None:
        return next((e for e in self.engines if e.id == engine_id), None)

    def live(self) -> tuple[Engine, ...]:
        """Active and draining engines, by slot."""
        return tuple(e for e in self.engines if e.state != REMOVED)

    def placeable_ids(self) -> tuple[str, ...]:
        """The ids the planner may place keys on (active), by slot."""
        return tuple(e.id for e in self.engines if e.state == ACTIVE)

    def addresses(self) -> dict[str, str]:
        """id -> address of the live engines that have one (health checks)."""
        return {e.id: e.address for e in self.live() if e.address}

    def find(self, ref: str) -> Engine:
        """The engine named by id, else by address (a live one); EngineNotFound otherwise."""
        engine = self.by_id(ref)
        if engine is None:
            engine = next((e for e in self.live() if e.address == ref), None)
        if engine is None:
            raise EngineNotFound(f"no engine {ref!r}")
        return engine


def _replace(engines: EngineSet, engine: Engine) -> EngineSet:
    items = list(engines.engines)
    items[engine.slot] = engine
    return EngineSet(engines.version + 1, tuple(items))


def id_problem(engine_id: str) -> str | None:
    """Why `engine_id` cannot name an engine, or None (ids appear in plans, metrics labels and
    cache-counter fields: letters, digits, '.', '_', ':', '-', at most 63)."""
    if not _ID.match(engine_id):
        return f"engine id {engine_id!r} must be 1-63 of letters, digits, '.', '_', ':', '-' (starting alphanumeric)"
    return None


def seed(engines: EngineSet, replicas: Iterable[tuple[str, str]], *, now: float) -> EngineSet:
    """The stored set with the configured replicas (id, address) it does not have yet added
    (source "config"); the same set (same version) when nothing is missing."""
    out = engines
    for rid, address in replicas:
        if out.by_id(rid) is None:
            out = add_engine(out, address, engine_id=rid, source="config", now=now, check_id=False)
    return out


def add_engine(engines: EngineSet, address: str, *, engine_id: str = "", source: str = "manual", now: float,
               check_id: bool = True) -> EngineSet:
    """A new active engine in the next slot; `engine_id` "" picks `e<slot>` (or the first free
    `e<slot>-<n>`). EngineConflict(exists) when the id is taken (removed ids included: ids are
    never reused) or a live engine has the address; ValueError for a bad id, no address."""
    address = address.strip()
    if not address and check_id:
        raise ValueError("an engine needs an address (host:port or KIND+URL)")
    if len(engines.engines) >= MAX_ENGINES:
        raise EngineConflict(f"the engine set holds {MAX_ENGINES} slots already")
    slot = len(engines.engines)
    if not engine_id:
        engine_id, n = f"e{slot}", 1
        while engines.by_id(engine_id) is not None:
            engine_id, n = f"e{slot}-{n}", n + 1
    elif check_id and (problem := id_problem(engine_id)):
        raise ValueError(problem)
    if engines.by_id(engine_id) is not None:
        raise EngineConflict(f"engine id {engine_id!r} is taken", exists=True)
    if address and any(e.address == address for e in engines.live()):
        raise EngineConflict(f"an engine at {address!r} exists", exists=True)
    engine = Engine(slot, engine_id, address, ACTIVE, source, now)
    return EngineSet(engines.version + 1, engines.engines + (engine,))


def drain_engine(engines: EngineSet, ref: str, *, now: float) -> EngineSet:
    """`ref` (id or address) active -> draining; a draining one is left as it is (same version)."""
    engine = engines.find(ref)
    if engine.state == DRAINING:
        return engines
    if engine.state == REMOVED:
        raise EngineConflict(f"engine {engine.id!r} was removed")
    if len(engines.placeable_ids()) <= 1:
        raise EngineConflict(f"engine {engine.id!r} is the last active engine; add another before draining it")
    return _replace(engines, dataclasses.replace(engine, state=DRAINING, changed_at=now))


def remove_engine(engines: EngineSet, ref: str, *, now: float, force: bool = False) -> EngineSet:
    """`ref` draining -> removed (removed already: the same set). An active engine is refused
    (drain it first, so its keys move while it still serves) unless `force`."""
    engine = engines.find(ref)
    if engine.state == REMOVED:
        return engines
    if engine.state == ACTIVE:
        if not force:
            raise EngineConflict(f"engine {engine.id!r} is active; drain it first (or force)")
        if len(engines.placeable_ids()) <= 1:
            raise EngineConflict(f"engine {engine.id!r} is the last active engine")
    return _replace(engines, dataclasses.replace(engine, state=REMOVED, changed_at=now))


def reactivate(engines: EngineSet, ref: str, *, now: float) -> EngineSet:
    """A draining engine back to active (it is placeable again at the next plan)."""
    engine = engines.find(ref)
    if engine.state != DRAINING:
        raise EngineConflict(f"engine {engine.id!r} is {engine.state}, not draining")
    return _replace(engines, dataclasses.replace(engine, state=ACTIVE, changed_at=now))


def reconcile(engines: EngineSet, source: str, addresses: Iterable[str], *, now: float,
              planned: Callable[[str], bool] = lambda engine_id: True) -> EngineSet:
    """Follow one discovery source (module header). `addresses`: what it resolves to now
    (an empty result changes nothing: a failed lookup must not drain every engine);
    `planned(id)`: whether the active plan still names the engine (a draining engine leaves
    only once it does not). Engines of other sources are untouched."""
    found = list(dict.fromkeys(a for a in addresses if a))
    if not found:
        return engines
    out = engines
    mine = {e.address: e for e in out.live() if e.source == source}
    for address in found:
        engine = mine.get(address)
        if engine is None:
            if any(e.address == address for e in out.live()):
                continue                                  # added by hand or another source
            out = add_engine(out, address, source=source, now=now)
        elif engine.state == DRAINING:
            out = reactivate(out, engine.id, now=now)
    for address, engine in mine.items():
        if address in found:
            continue
        current = out.by_id(engine.id)
        if current.state == ACTIVE and len(out.placeable_ids()) > 1:
            out = drain_engine(out, engine.id, now=now)
        elif current.state == DRAINING and not planned(engine.id):
            out = remove_engine(out, engine.id, now=now)
    return out


# ---- the stored form (services/store keeps it as JSON next to the plans)

def engines_to_dict(engines: EngineSet) -> dict:
    return {"version": engines.version, "engines": [dataclasses.asdict(e) for e in engines.engines]}


def engines_from_dict(data: Mapping) -> EngineSet:
    """The stored form back; ValueError when it is not one (slots out of order, unknown state)."""
    items = tuple(Engine(int(e["slot"]), str(e["id"]), str(e.get("address", "")), str(e.get("state", ACTIVE)),
                         str(e.get("source", "manual")), float(e.get("changed_at", 0.0)))
                  for e in data.get("engines", ()))
    for i, engine in enumerate(items):
        if engine.slot != i or engine.state not in STATES:
            raise ValueError(f"stored engine set is malformed at slot {i}")
    if len({e.id for e in items}) != len(items):
        raise ValueError("stored engine set repeats an engine id")
    return EngineSet(int(data.get("version", 0)), items)
