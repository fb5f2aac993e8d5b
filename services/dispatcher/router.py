"""The dispatcher's routing state: replicas, load signals, the active plan, counters.

The decision itself is the `cacheroute` policy (services.core.policies.cacheroute): an
admitted key goes to the least-loaded healthy member of T(b) (PLANNED), a cold key to the
cold tail (COLD: `cold`, default services.model.DEFAULT_COLD_TAIL = "chwbl", bounded-load
consistent hashing on the key, so every dispatcher with the same replica list agrees; or
"p2c", power of two choices), everything P2C in flat mode (FALLBACK). This class keeps
the policy's `ClusterState` current and counts what it did; it does no I/O.

Load signal (`ClusterState.in_flight`): each replica's queue as the engine last reported
it (waiting + running, polled ~4×/s) plus the requests this dispatcher routed there since
that poll was sent, which the engine could not have seen yet. Without the second term,
every request between two polls would see the same loads and pile onto one replica.

Plans reference replicas by id; the dispatcher's replica order comes from its own
configuration, so a plan is re-indexed on arrival. Members the dispatcher does not know
are dropped; a key left with none is cold.

Installing a plan is two steps. `prepare(plan)` (any thread: the plan feed runs it in a
worker thread, off the event loop) makes the table columnar (services.core.table: bytes per
key), re-indexes it and builds a fresh policy object holding it; it reads nothing that
routing writes. `install(prepared)` (the event loop) swaps that policy in with one
reference assignment and sets the plan fields beside it, with no await in between, so a
decision (which runs on the loop and reads `self.policy` once) sees the old plan or the new
one, never a mix. The policies share one random generator, so a seeded run draws the same
sequence across plan changes. `set_plan` does both at once (tests, benches, Redis reads of
small plans); a mode change with the same plan swaps nothing.

Holding (Reason.HOLD, the cacheroute policy's hold rule): `route(hold=True)` returns a HOLD pick
without accounting for it (nothing was routed; the caller, Dispatcher.dispatch, waits for
`changed` and asks again); `route()` without `hold` sends a HOLD pick to its replica anyway, as
FALLBACK (gRPC Route callers cannot wait here). The hold rule reads `ClusterState.kv_blocks` and
`waiting`, which the stats poll fills (kv_blocks only from engines that report their pool size,
the cacheroute gRPC engine's EngineStats.kv_blocks; without it nothing is held). `changed` is
called (if set) after every stats poll and every closed stream: the moments a replica may have
freed KV (Dispatcher's own streams close with notify=False and wake its holds directly, so a
request's path never calls back up into dispatch.py).

Share (`ClusterState.share`, the cold-home rule's share gate): the fraction of the cluster's
requests in flight that this dispatcher routes, sum(outstanding) / sum(engine_load) (its own open
streams over the engines' running + waiting, which every dispatcher's requests fill), clamped to
[0, 1] and smoothed by an EWMA updated at every stats poll where the engines report load > 0 and
this dispatcher has proxied a stream (a Route-only dispatcher has no streams to count: unknown).
The weight is 1 / (SHARE_ROUNDS x replicas): a memory of SHARE_ROUNDS = 4 rounds of polls, one
second at the monitor's default 0.25 s interval. Reason: one sample compares streams open now with
engine counts up to a poll old, so it is off by the requests started within one poll interval;
averaging over a few intervals removes that lag, and a second is far shorter than a tier's
membership changes (a rolling restart: tens of seconds). 1.0 until the first such poll.
With the record bus on (services/dispatcher/recordbus.py) the share is the record's coverage: the
numerator adds `peer_outstanding`, the latest open-stream counts of the live peers whose routes
this record also holds, and a peer's streams are evidence too; with it off that term is 0.

Record bus hook: while `routes_out` is a list (the bus sets it and swaps it out every interval),
`route` and `route_many` append (slot, key, prompt tokens, blocks) for each routed request, up to
`routes_cap` per interval; beyond it `routes_dropped` counts (routing never waits on the bus).

Hot path: `route(key)` does one policy pick, a few list updates and one append to a
bounded telemetry buffer; no allocation beyond the tuple it appends.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from services.wire import codec
from services.core.plan import Plan
from services.core.policies.cacheroute import CacheRoutePolicy, prefix_policy
from services.core.policy import ClusterState, Pick, Reason
from services.core.table import ColumnarTable
from services.core.prefixes import chain_ids
from services.model import DEFAULT_COLD_TAIL, Replica


SHARE_ROUNDS = 4       # the share's EWMA memory in rounds of stats polls (module header)


class _Probe:
    """The fields the cacheroute policy reads from a request, reused across calls (building a
    frozen Request per call would cost more than the decision). `blocks`, `prompt_tokens` and
    `prefix_tokens` matter only to the prefix-aware policy (`prefix_nodes=True`)."""

    __slots__ = ("key", "blocks", "prompt_tokens", "prefix_tokens", "output_tokens")

    def __init__(self) -> None:
        self.key = ""
        self.blocks: Sequence[int] = ()
        self.prompt_tokens = 0
        self.prefix_tokens = 0
        self.output_tokens = 0


class Prepared(NamedTuple):
    """A plan made ready off the event loop (Router.prepare), for Router.install."""

    plan: Plan | None          # as the planner sent it (columnar table)
    policy: object             # a fresh policy holding the re-indexed plan


class Router:
    def __init__(self, replicas: Sequence[Replica], *, seed: int | None = None, cold: str = DEFAULT_COLD_TAIL,
                 telemetry_capacity: int = 100_000, prefix_nodes: bool = False, hold: bool = False) -> None:
        self.replicas = tuple(replicas)
        self.ids = tuple(r.id for r in self.replicas)
        self._index = {rid: i for i, rid in enumerate(self.ids)}
        n = len(self.replicas)
        # prefix_nodes: the simulator's `cacheroute-prefix` policy (prefix nodes, token balance)
        self.prefix_nodes = prefix_nodes
        self.hold = hold                             # the policy's hold rule (callers that wait: route(hold=True))
        self._policy_rng = random.Random(seed if seed is not None else 0)   # shared by every plan's policy
        self._cold = cold
        self.policy = self._new_policy()
        # the token-balance signal, ClusterState.prefill_tokens: the larger of the engine's reported
        # prefill backlog (EngineStats.prefill_tokens, shared by every dispatcher) and the prompt
        # tokens of this dispatcher's own Generate streams with no first token yet (all there is
        # behind an engine that does not report a backlog)
        self.engine_prefill = [0] * n
        self.local_prefill = [0] * n
        self.state = ClusterState.empty(n)
        self.state.healthy[:] = [False] * n          # until the first health poll says otherwise
        self.engine_load = [0] * n                   # waiting + running at the last stats poll
        self.recent = [0] * n                        # routed since that poll was sent
        self.outstanding = [0] * n                   # proxied Generate streams open now
        self.streams = 0                             # proxied Generate streams ever opened (share evidence)
        self.routed_to = [0] * n
        self.engine_stats: list[object | None] = [None] * n
        self.plan: Plan | None = None
        self.plan_version = 0
        self.flat = False
        self.plan_source = "none"
        self.counts = [0, 0, 0, 0, 0]                # by Reason value; [0] unused, [4] HOLD answers
        self.changed = None                          # callable: a replica may have freed KV (holds wake up)
        self.telemetry_capacity = telemetry_capacity
        self.telemetry: list[tuple[str, float, int, int]] = []
        self.telemetry_dropped = 0
        self.telemetry_capped = 0                    # arrivals left out: their caller was over its budget
        self._probe = _Probe()
        self._rng = random.Random(seed)              # which arrivals of a capped batch are reported
        # the record bus (module header): None = off
        self.routes_out: list[tuple[int, str, int, Sequence[int]]] | None = None
        self.routes_cap = 0
        self.routes_dropped = 0
        self.peer_outstanding = 0                    # live peers' open streams, as last reported

    # ------------------------------------------------------------ the decision

    def route(self, key: str, now: float, prompt_tokens: int = 0, prefix_tokens: int = 0, *,
              report: bool = True, avoid: int = -1, blocks: Sequence[int] = (), hold: bool = False,
              output_tokens: int = 0) -> Pick:
        """Pick a replica for `key` and account for it. NoHealthyReplica when none is healthy.
        `report`: buffer the arrival for telemetry now (False: the caller decides later, with
        `record_arrival`, or not at all). `avoid`: a replica not to pick (one that just
        refused this request); NoHealthyReplica if no other replica is healthy. `blocks`: the
        prompt's cacheable block hashes, for the prefix-aware policy and its telemetry chain.
        `hold`: the caller can wait, so a HOLD pick is returned as such, unaccounted (module header);
        `output_tokens`: the request's output budget (the hold rule's KV estimate)."""
        probe = self._probe
        probe.key = key
        probe.blocks = blocks
        probe.prompt_tokens = prompt_tokens
        probe.prefix_tokens = prefix_tokens
        probe.output_tokens = output_tokens
        healthy = self.state.healthy
        if avoid >= 0 and healthy[avoid]:
            healthy[avoid] = False
            try:
                pick = self.policy.pick(probe, self.state)   # type: ignore[arg-type]
            finally:
                healthy[avoid] = True
        else:
            pick = self.policy.pick(probe, self.state)   # type: ignore[arg-type]
        if pick.reason == Reason.HOLD:
            self.counts[Reason.HOLD] += 1
            if hold:
                return pick
            pick = Pick(pick.replica, Reason.FALLBACK)
        i = pick.replica
        self.state.in_flight[i] += 1
        self.recent[i] += 1
        self.routed_to[i] += 1
        self.counts[pick.reason] += 1
        if report:
            self.record_arrival(key, now, prompt_tokens, prefix_tokens, blocks, replica=i)
        out = self.routes_out
        if out is not None:
            if len(out) < self.routes_cap:
                out.append((i, key, prompt_tokens, blocks))
            else:
                self.routes_dropped += 1
        return pick

    def record_arrival(self, key: str, now: float, prompt_tokens: int = 0, prefix_tokens: int = 0,
                       blocks: Sequence[int] = (), *, replica: int = -1) -> None:
        """Buffer one arrival as (key, time, prompt tokens, prefix tokens, prefix chain, replica id):
        the chain (block hashes at NODE_DEPTHS) with prefix nodes on and `blocks` given, else ();
        the id of the replica it was sent to, else "" (the planner's served homes)."""
        buf = self.telemetry
        if len(buf) < self.telemetry_capacity:
            chain = chain_ids(blocks) if self.prefix_nodes and blocks else ()
            buf.append((key, now, prompt_tokens, prefix_tokens, chain, self.ids[replica] if replica >= 0 else ""))
        else:
            self.telemetry_dropped += 1

    def route_many(self, requests: Iterable[tuple[str, int, int]], now: float,
                   report: tuple[int, int] | None = None) -> list[Pick]:
        """`route` for each (key, prompt_tokens, prefix_tokens) in order, with the lookups
        hoisted out of the loop (RouteBatch). `report` = (granted, total): buffer `granted` of
        the `total` arrivals for telemetry, drawn at random through the batch (a uniform
        sample, so the caller's key mix is kept whatever the batch's order); the rest count as
        `telemetry_capped`. None: all. On NoHealthyReplica the earlier ones stay routed."""
        probe, pick, state, ids = self._probe, self.policy.pick, self.state, self.ids
        in_flight, recent, routed_to, counts = state.in_flight, self.recent, self.routed_to, self.counts
        buf, room = self.telemetry, self.telemetry_capacity - len(self.telemetry)
        sample = None if report is None else set(self._rng.sample(range(report[1]), min(report)))
        out: list[Pick] = []
        bus, bus_room = self.routes_out, self.routes_cap - len(self.routes_out or ())
        probe.blocks, probe.output_tokens = (), 0
        for n, (key, prompt_tokens, prefix_tokens) in enumerate(requests):
            probe.key = key
            probe.prompt_tokens, probe.prefix_tokens = prompt_tokens, prefix_tokens
            p = pick(probe, state)   # type: ignore[arg-type]
            if p.reason == Reason.HOLD:                 # RouteBatch cannot wait: send it anyway
                counts[Reason.HOLD] += 1
                p = Pick(p.replica, Reason.FALLBACK)
            i = p.replica
            in_flight[i] += 1
            recent[i] += 1
            routed_to[i] += 1
            counts[p.reason] += 1
            if sample is not None and n not in sample:
                self.telemetry_capped += 1
            elif room > 0:
                buf.append((key, now, prompt_tokens, prefix_tokens, (), ids[i]))
                room -= 1
            else:
                self.telemetry_dropped += 1
            if bus is not None:
                if bus_room > 0:
                    bus.append((i, key, prompt_tokens, ()))
                    bus_room -= 1
                else:
                    self.routes_dropped += 1
            out.append(p)
        return out

    @property
    def routed(self) -> int:
        return self.counts[Reason.PLANNED] + self.counts[Reason.COLD] + self.counts[Reason.FALLBACK]

    def drain_telemetry(self) -> list[tuple]:
        """The buffered arrivals, (key, time, prompt, prefix, prefix chain, replica id) each; empties it."""
        buf, self.telemetry = self.telemetry, []
        return buf

    # ------------------------------------------------------------ plan and mode

    def _new_policy(self):
        make = prefix_policy if self.prefix_nodes else CacheRoutePolicy
        return make(len(self.replicas), rng=self._policy_rng, cold=self._cold, hold=self.hold)

    def prepare(self, plan: Plan | None) -> Prepared:
        """Everything an install costs that grows with the plan: columnar table, re-indexing,
        the policy's checks. Safe in any thread (touches nothing routing reads)."""
        if plan is not None:
            plan = codec.columnar_plan(plan)
        policy = self._new_policy()
        policy.set_plan(self.reindex(plan) if plan is not None else None)
        return Prepared(plan, policy)

    def install(self, prepared: Prepared, *, flat: bool, source: str) -> None:
        """Swap a prepared plan in (event loop; constant time)."""
        plan, policy = prepared
        policy.set_flat_fallback(flat)   # type: ignore[attr-defined]
        carry = getattr(policy, "carry_memory", None)
        if carry is not None and self.policy is not None:
            carry(self.policy)           # the cold tail's key -> replica memory outlives the plan
        self.policy = policy
        self.plan = plan
        self.plan_version = plan.version if plan is not None else 0
        self.flat = flat
        self.plan_source = source

    def set_plan(self, plan: Plan | None, *, flat: bool, source: str) -> None:
        """Install the active plan (None: none) and mode, from the planner ("watch") or Redis
        ("redis"); the plan already installed: only the mode and source change."""
        if plan is not None and plan is self.plan:
            self.policy.set_flat_fallback(flat)   # type: ignore[attr-defined]
            self.flat = flat
            self.plan_source = source
            return
        self.install(self.prepare(plan), flat=flat, source=source)

    def reindex(self, plan: Plan) -> Plan:
        if tuple(plan.replica_ids) == self.ids:
            return plan
        index = self._index
        moved = [index.get(rid, -1) for rid in plan.replica_ids]
        prefixes = {}
        for name, entry in plan.prefixes.items():
            local = tuple(moved[m] for m in entry.replicas if moved[m] >= 0)
            if local:
                prefixes[name] = dataclasses.replace(entry, replicas=local)
        if isinstance(plan.table, ColumnarTable):
            table = plan.table.remap(np.array(moved, dtype=np.int64))
            rates = codec.rates_for(table, plan.rates)
            return dataclasses.replace(plan, replica_ids=self.ids, table=table, rates=rates, prefixes=prefixes)
        table: dict[str, tuple[int, ...]] = {}
        for key, members in plan.table.items():
            local = tuple(moved[m] for m in members if moved[m] >= 0)
            if local:
                table[key] = local
        return dataclasses.replace(plan, replica_ids=self.ids, table=table, prefixes=prefixes)

    # ------------------------------------------------------------ load and health

    def poll_sent(self, i: int) -> int:
        """A stats poll to replica i is leaving; returns the marker to hand to `stats_received`."""
        return self.recent[i]

    def stats_received(self, i: int, marker: int, waiting: int, running: int, kv_usage: float, stats: object) -> None:
        self.recent[i] = max(0, self.recent[i] - marker)
        self.engine_load[i] = waiting + running
        self.state.in_flight[i] = self.engine_load[i] + self.recent[i]
        self.state.kv_usage[i] = kv_usage
        self.state.waiting[i] = waiting
        self.state.kv_blocks[i] = getattr(stats, "kv_blocks", 0) or 0
        self.engine_stats[i] = stats
        self.engine_prefill[i] = getattr(stats, "prefill_tokens", 0) or 0
        self.state.prefill_tokens[i] = max(self.engine_prefill[i], self.local_prefill[i])
        self._observe_share()
        if self.changed is not None:
            self.changed()

    def _observe_share(self) -> None:
        """One EWMA step of ClusterState.share (module header), when there is evidence."""
        load = sum(self.engine_load)
        peers = self.peer_outstanding
        if load <= 0 or not (self.streams or peers):
            return
        sample = min(1.0, (sum(self.outstanding) + peers) / load)
        state = self.state
        state.share += (sample - state.share) / (SHARE_ROUNDS * len(self.replicas))

    def set_healthy(self, i: int, healthy: bool) -> bool:
        """Mark replica i; True if that changed its health."""
        changed = self.state.healthy[i] != healthy
        self.state.healthy[i] = healthy
        return changed

    def add_replica(self, replica: Replica) -> int:
        """A new slot at the end (an engine added at run time, services/core/engines.py): every
        per-replica column grows by one, the new one unhealthy. The installed policy keeps
        routing over the slots it knows until the plan is prepared again for the new count
        (the plan feed does that at once). Returns the slot."""
        i = len(self.replicas)
        self.replicas += (replica,)
        self.ids += (replica.id,)
        self._index[replica.id] = i
        for column in (self.engine_prefill, self.local_prefill, self.engine_load, self.recent, self.outstanding,
                       self.routed_to):
            column.append(0)
        self.engine_stats.append(None)
        state = self.state
        for column, value in ((state.in_flight, 0), (state.prefill_tokens, 0), (state.active_blocks, 0),
                              (state.kv_usage, 0.0), (state.healthy, False), (state.waiting, 0),
                              (state.kv_blocks, 0)):
            column.append(value)
        return i

    def index_of(self, replica_id: str) -> int:
        return self._index[replica_id]

    def prefill_started(self, i: int, tokens: int) -> None:
        self.local_prefill[i] += tokens
        self.state.prefill_tokens[i] = max(self.engine_prefill[i], self.local_prefill[i])

    def prefill_done(self, i: int, tokens: int) -> None:
        self.local_prefill[i] = max(0, self.local_prefill[i] - tokens)
        self.state.prefill_tokens[i] = max(self.engine_prefill[i], self.local_prefill[i])

    def stream_opened(self, i: int) -> None:
        self.outstanding[i] += 1
        self.streams += 1

    def stream_closed(self, i: int, *, notify: bool = True) -> None:
        """One stream on replica i ended; `changed` is called unless the caller wakes holds itself."""
        self.outstanding[i] -= 1
        if notify and self.changed is not None:
            self.changed()
