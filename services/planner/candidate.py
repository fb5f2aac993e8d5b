"""The plan-candidate use case, one order in one place, shared by the control loop's
`run_once` and the `BuildPlan` RPC:

  build -> [check] -> version -> decide -> [review] -> store -> activate

1. build: churn-aware from the active plan (`replan_incremental`) when asked, else LPT from
   scratch with the active plan as parent. Building comes first, so input the core refuses
   (a ValueError: INVALID_ARGUMENT) does not use up a version number. With `grow_in_dwell`
   (the control loop), a churn-aware build inside the switching rule's dwell makes no
   rebalancing moves (unless the replica set changed, which the rule takes anyway), so the
   candidate only grows the active plan and the rule may take it before the dwell ends
   (services.core.switching, "Growth within the dwell");
2. check (optional): refusals the caller can tell from the control state read before the
   build (BuildPlan: the CAS and pin its activation would meet), also before a version is used;
3. version: the store's next version number;
4. decide: the switching rule (`services.core.switching.decide_switch`) on the inputs' rates,
   recorded on the version;
5. review (optional): what must happen between deciding and storing; it may add a report to
   the plan and returns a verdict for the activation step (the loop: the shadow gate and its
   fallback rule; BuildPlan: the replay when asked, and the encoded answer, so that an answer
   that cannot be sent stores nothing);
6. store: the version is written once;
7. activate: the caller's activation step (the loop: by the decision, fenced, automatic, or
   the gate's mode change; BuildPlan: as the request asks), which returns the outcome.

The callers differ in where the inputs come from and in these steps, passed in as functions;
the order does not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Mapping, Sequence, TypeVar

import numpy as np

from services.core.plan import Plan, SwitchDecision
from services.core.planning import build_plan, with_churn
from services.core.prefixes import build_prefix_plan
from services.core.replan import build_at_home, replan_incremental, ring_homes, served_homes
from services.core.switching import SwitchConfig, WindowColumns, decide_switch, decide_switch_window
from services.model import ControlState, RatesSnapshot
from services.store import Store

T = TypeVar("T")

# check(state read before the build): raise to refuse before a version number is used
CheckStep = Callable[[ControlState], None]
# review(plan, state, active) -> (the plan with any report added, a verdict for the activation step)
ReviewStep = Callable[[Plan, ControlState, "Plan | None"], Awaitable[tuple[Plan, Any]]]
# activate(stored plan, state read before the build, the review's verdict or None) -> outcome
ActivateStep = Callable[[Plan, ControlState, Any], Awaitable[T]]


class _WindowTokens(Mapping):
    """key -> mean prefix tokens of a snapshot, as a dict built on first use: the loop's
    switching rule reads the window in columns (`BuildInputs.window`), so most intervals never
    need the dict (a million keys: ~0.2 s)."""

    def __init__(self, keys: Sequence[str], tokens: Sequence[float]) -> None:
        self._keys, self._tokens, self._map = keys, tokens, None

    def _dict(self) -> dict[str, float]:
        if self._map is None:
            self._map = dict(zip(self._keys, self._tokens))
        return self._map

    def __getitem__(self, key: str) -> float:
        return self._dict()[key]

    def get(self, key, default=None):
        return self._dict().get(key, default)

    def __iter__(self):
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())


@dataclass(frozen=True)
class BuildInputs:
    keys: Sequence[str]
    rates: Sequence[float]
    prefix_tokens: Mapping[str, float] | float
    replica_ids: tuple[str, ...]
    q_cap: float
    warm_slots: int
    snapshot_id: str = ""
    window_seconds: float = 0.0
    nodes: tuple = ()                      # prefix-node samples of the window (LoopConfig.prefix)
    prompt_tokens: float = 0.0             # prompt tokens of the window's arrivals
    achieved_hit_rate: float | None = None  # cached / prompt tokens the engines reported over the window
    window: WindowColumns | None = None    # rates and prefix tokens in columns (a snapshot's), for `decide`
    served: Mapping[str, int] = dataclasses.field(default_factory=dict)   # key -> replica index it was last served on
    key_ids: Any = None                    # the store's key ids and their space (RatesSnapshot), for the re-plan
    key_space: str = ""
    ordered: bool = False                  # keys in a snapshot's order: rate desc, ties key asc

    @classmethod
    def from_snapshot(cls, snap: RatesSnapshot, replica_ids: Sequence[str], q_cap: float, warm_slots: int) -> "BuildInputs":
        rates = np.asarray(snap.rates, dtype=np.float64)
        window = WindowColumns(snap.keys, rates, np.asarray(snap.mean_prefix_tokens, dtype=np.float64))
        return cls(snap.keys, rates, _WindowTokens(snap.keys, snap.mean_prefix_tokens), tuple(replica_ids), q_cap,
                   warm_slots, snap.snapshot_id, snap.window_seconds, window=window, key_ids=snap.key_ids,
                   key_space=snap.key_space, ordered=True)


def build_candidate(inputs: BuildInputs, active: Plan | None, *, version: int, created_at: float,
                    incremental: bool, max_moves: int | None = None, prefix: bool = False,
                    cold_homes: bool = False) -> Plan:
    """A candidate: churn-aware from `active` when asked and possible (at most `max_moves`
    rebalancing moves; None: unbounded), else LPT from scratch. `prefix`: the prefix-aware,
    sticky plan (services.core.prefixes.build_prefix_plan; the simulator's cacheroute-prefix),
    with the window's available and achieved hit rates in `extra`. `cold_homes`: new keys start on
    the replica telemetry last saw them served on (`inputs.served`), else their cold-tail ring
    home, when balance allows (services.core.replan.served_homes, ring_homes), in a churn-aware
    build and in a first plan (`build_at_home`)."""
    if prefix:
        pt = inputs.prefix_tokens
        tokens = [pt.get(k, 0.0) for k in inputs.keys] if isinstance(pt, Mapping) else [float(pt)] * len(inputs.keys)
        plan = build_prefix_plan(inputs.keys, inputs.rates, inputs.replica_ids, inputs.q_cap, inputs.warm_slots,
                                 prefix_tokens=tokens, nodes=inputs.nodes, window_seconds=inputs.window_seconds,
                                 active=active, version=version, created_at=created_at,
                                 rates_snapshot_id=inputs.snapshot_id, prompt_tokens=inputs.prompt_tokens)
        if inputs.achieved_hit_rate is not None:
            plan = dataclasses.replace(plan, extra={**plan.extra, "achieved_hit_rate": inputs.achieved_hit_rate})
        return plan
    homes = served_homes(inputs.served, ring_homes(len(inputs.replica_ids))) if cold_homes else None
    if incremental and active is not None:
        plan = replan_incremental(active, inputs.keys, inputs.rates, inputs.replica_ids, inputs.q_cap,
                                  inputs.warm_slots, version=version, created_at=created_at, max_moves=max_moves,
                                  homes=homes, window_seconds=inputs.window_seconds,
                                  key_ids=inputs.key_ids, key_space=inputs.key_space, ordered=inputs.ordered)
        plan = dataclasses.replace(plan, rates_snapshot_id=inputs.snapshot_id, window_seconds=inputs.window_seconds)
        return with_churn(plan, active) if plan.churn is None else plan
    if cold_homes and active is None:
        return build_at_home(inputs.keys, inputs.rates, inputs.replica_ids, inputs.q_cap, inputs.warm_slots,
                             homes, version=version, created_at=created_at,
                             rates_snapshot_id=inputs.snapshot_id, window_seconds=inputs.window_seconds)
    return build_plan(inputs.keys, inputs.rates, inputs.replica_ids, inputs.q_cap, inputs.warm_slots,
                      version=version, parent=active, created_at=created_at,
                      rates_snapshot_id=inputs.snapshot_id, window_seconds=inputs.window_seconds,
                      key_ids=inputs.key_ids, key_space=inputs.key_space)


def decide(active: Plan | None, candidate: Plan, inputs: BuildInputs, *, now: float, last_switch_at: float,
           config: SwitchConfig | None) -> SwitchDecision:
    """The switching rule (services.core.switching) on the current rates."""
    if inputs.window is not None:
        return decide_switch_window(active, candidate, inputs.window, now=now, last_switch_at=last_switch_at,
                                    config=config or SwitchConfig())
    rates = dict(zip(inputs.keys, inputs.rates))
    return decide_switch(active, candidate, rates, inputs.prefix_tokens, now=now,
                         last_switch_at=last_switch_at, config=config or SwitchConfig())


@dataclass(frozen=True)
class Proposal(Generic[T]):
    plan: Plan                 # as stored: version, decision and any gate report on it
    outcome: T                 # what the activation step returned
    build_seconds: float       # building and deciding (the planner's build-time metric)


async def propose(store: Store, inputs: BuildInputs, *, now: float, incremental: bool,
                  max_moves: int | None, switching: SwitchConfig | None, activate: ActivateStep[T],
                  check: CheckStep | None = None, review: ReviewStep | None = None,
                  prefix: bool = False, grow_in_dwell: bool = False, cold_homes: bool = False) -> Proposal[T]:
    """Build, [check], version, decide, [review], store and activate one candidate (module header)."""
    state, active = await store.get_active_plan()
    last = await store.history(1)
    last_switch_at = last[0].at if last else 0.0
    if (grow_in_dwell and incremental and active is not None
            and set(active.replica_ids) == set(inputs.replica_ids)     # else the rule switches anyway
            and now - last_switch_at < (switching or SwitchConfig()).min_dwell_seconds):
        max_moves = 0
    started = time.perf_counter()
    plan = await asyncio.to_thread(build_candidate, inputs, active, version=0, created_at=now,
                                   incremental=incremental, max_moves=max_moves, prefix=prefix,
                                   cold_homes=cold_homes)
    built = time.perf_counter() - started
    if check is not None:
        check(state)
    plan = dataclasses.replace(plan, version=await store.next_version())
    started = time.perf_counter()
    decision = await asyncio.to_thread(decide, active, plan, inputs, now=now,
                                       last_switch_at=last_switch_at, config=switching)
    built += time.perf_counter() - started
    plan = dataclasses.replace(plan, decision=decision)
    verdict = None
    if review is not None:
        plan, verdict = await review(plan, state, active)
    await store.put_plan(plan)
    return Proposal(plan, await activate(plan, state, verdict), built)
