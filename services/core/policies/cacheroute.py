"""CacheRoute dispatch: apply the active plan with a table lookup (SPEC section 1, step 4).

Rule: a request whose key is admitted in the plan goes to the least-loaded (in_flight)
healthy member of T(b) -> Reason.PLANNED; if no member is healthy, power-of-two choices
over all healthy replicas -> Reason.FALLBACK. A key outside the table (the cold tail)
goes to the cold-tail policy -> Reason.COLD. In flat-fallback mode (SPEC section 3, step
4: the active set or p99 left the validated range) every request goes P2C ->
Reason.FALLBACK. Without a plan every key is cold.

Overload guard (bounded loads on planned keys): the plan is open-loop within a control
interval and its load estimate comes from noisy windowed rates, so a member can pass its
knee and queue without bound while the plan still says it is fine. A planned pick must
therefore meet the bounded-load condition of Mirrokni et al. (as CHWBL does),
    in_flight[r] + 1 <= max(floor, ceil(c * (total_in_flight + 1) / healthy_replicas)).
The least-loaded member is tried first, so if it fails every member fails; the request then
spills to the key's consistent-hash ring successors (first one within the bound) ->
Reason.FALLBACK. Walking the key's own ring keeps one key's spill on few replicas, so the
spilled prefix stays warm there; the least-loaded healthy replica always meets the bound
(c >= 1), so the walk ends. A spill must also pay for what it costs (`_pays`, issue 23's
third pass): in-flight counts say nothing about work when most of a queue is cache hits, and a
spilled request re-prefills its prefix on the target and evicts about as much there. So the
member is left only when its queued prefill (ClusterState.prefill_tokens) exceeds one engine
step (`spill_backlog`, 8,192 tokens: vLLM's default max_num_batched_tokens; below it the member
starts the request's prefill in its next step anyway) and the target's by more than
`spill_cost` (2) x the request's reusable prefix (its own prefill plus re-prefilling what it
evicts). Measured (docs/experiments.md, "Routing rules, third pass"): in the engine-bound
regime the in-flight guard alone spilled 10 points of hit rate at 24 req/s and cascaded
(p50 0.5 s); with the rule 1 point, and the p99 at K = 256 fell too.

Cold tail with memory (`memory_keys`, default 65,536 keys in two generations): a key's
latest replica is remembered (planned picks too, so a key leaving the plan stays put) and
the key returns there while it is within the bound or a spill would not pay. A first-sight
key goes to its ring owner while the owner holds at most one request over the mean in
flight, else to the lighter of its first two ring replicas (two choices), within the bound. Balancing first
sight is what keeps in-flight skew, and so KV preemption, down where most keys are cold (the
flagship without its plan: 1,001 preemptions at 150 QPS with the ring alone, 67 with this;
experiments/spill_rule.py, "no_plan"); the ring owner
first keeps dispatchers agreeing at low load; the planner admits a key where telemetry saw
it served (services.core.replan.served_homes), so admission moves nothing. The memory is
per dispatcher and soft: lost on restart, it costs at most one move per key.

Cold home (`cold_home`, default "index"; issue 24 (d)): a planned key whose member no longer
holds its prefix is a cold prefill wherever it goes, so queueing it at home buys nothing. Before
the guard, if the least-loaded member does not cache at least half the request's reusable prefix,
the request goes to a replica that does among the key's members and its first two ring replicas,
else to the one of them with the least queued prefill (the home on a tie), FALLBACK off home. What
a replica caches is this policy's record of what it routed there: an LRU the size of the smallest
KV pool (`ClusterState.kv_blocks`; unknown: the rule is off) of block hashes (`BlockLRU`) or, for
requests without them (the HTTP API), of keys weighted by prompt tokens (`KeyLRU`). Until that
record has evicted something from the home, a key missing there was never seen by this instance
(a restarted dispatcher), so it stays; so does a key that no candidate holds and the key memory
has never seen (`cold_fresh` "home"): a first sight, which costs a prefill anywhere and which the plan
placed (a newly admitted key would otherwise live off its planned home for good); "oracle" reads the engines' caches where the state has them
(the simulator), None turns the rule off. Measured (docs/experiments.md, "Drift in the engine-bound
regime"): after a popularity shift the newly hot tenants' first requests queued at homes that had
evicted them (the drift point's p99); with the rule they spread over the key's ring.
Gates (docs/experiments.md, "Cold-home rule in a tier"): `cold_share` (default on): act only
when this router routes most of the cluster's requests in flight (`ClusterState.share` >=
SHARE_MIN 0.75): otherwise much of what an engine holds was put there by other routers, so the
record cannot tell evicted from never-seen (a simulated tier of 4 lost 10-13 points to it at 24
req/s, a tier of 2 3-8; with the gate none). 0.75 is the midpoint between a router alone (share 1)
and one of two (0.5): the widest margin for the live estimate's noise on either side, where a gate at
0.5 would flip with it in a tier of 2. `cold_backlog` (default off):
leave the home only when its queued prefill exceeds one engine step (`spill_backlog`, the spill
rule's threshold; below it the home starts the prefill next step anyway); measured, it undid the
drift gain (p99 0.99 -> 1.50 s at 24 req/s): the gain is in leaving before a backlog builds.

Warm spill (`warm_spill`, default "over"; issue 23): a planned request over the in-flight bound
first goes to the least-loaded healthy replica that the same record says holds its *whole*
reusable prefix, if that replica is less loaded than the member and within the bound. That spill
re-prefills nothing, so `_pays` does not apply; the ring spill and `_pays` decide only when no
replica is warm. Half a prefix is not warm (a shared system prompt is everywhere). Same gate as the
cold-home rule (`cold_share`). Why: near the knee the plan's packing leaves some replicas over the
mean (K = 256 at 300 QPS: 1.17x predicted), the guard let them reach 1.25x in flight, past the
engine's 256 running slots, and `_pays` (which counts queued prefill, not a full batch) kept the
requests there: p99 1.96 s against SGLang's 0.26, which moves them to warm replicas as its tree
match and load tie-break do. Measured (docs/experiments.md, "Warm spill"; rule written first in
experiments/results/warmspill/RULE.md): K = 256 @300 p99 1.96 / 0.46 / 2.02 -> 0.51 / 0.28 / 0.38 s
(seeds 0-2), hit +0.2-0.3 points; flagship and engine-bound tenants unchanged. "always" (on every
planned pick, not only over the bound) gave K = 256 0.28 s but +21% p99 at 24 req/s on the
tenants point with the HTTP API's key record; None turns it off.

Knobs: `cold` = "chwbl" (default: the session-aware cold tail, consistent hashing with
bounded loads, so a recurring cold key tends to return to the replica that has its prefix;
its bound has the same `spill_floor` as the planned path, see `_cold`)
or "p2c" (the paper's cold tail). Default chosen on measurements (docs/experiments.md,
"Session-aware cold tail"): with the guard on it ties P2C on the flagship, where the
bootstrap plan admits every key, and raises the hit rate on both Mooncake traces, where
most sessions never enter a plan; it needs no shared state. `flat_fallback` (initial mode,
also `set_flat_fallback`); `balance_factor` c (default 1.25, the Envoy/HAProxy factor CHWBL runs with; None turns
the guard off, as the ablation policies do). Chosen once (docs/experiments.md, "Overload
guard"): at the 30-100 requests in flight per replica of our loads near capacity, 1.25 is
~2 standard deviations of Poisson noise above the mean, so it rarely fires on noise, and
it holds the peak replica at 1.25x the mean; measured on flagship, ablation and low-reuse,
c = 1.1 bought a little more p99 for a few tenths of a point of hit rate, and 1.5 / 2.0
did not hold low-reuse at 100 QPS. `spill_floor` (default 8): a replica with fewer
requests in flight is never called overloaded; at small counts the ratio is noise (the
reason SGLang's router also wants an absolute gap before it balances), and 8 requests of a
few thousand prompt tokens are a handful of 8,192-token prefill steps, well under a second.
`spill_cost` None and `memory_keys` 0 give the rules before the third pass.
Sources: CacheRoute paper, Algorithm 1 line 21 and section 3.3; Mirrokni, Thorup,
Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA'18 (the bound); Mitzenmacher,
"The Power of Two Choices in Randomized Load Balancing", IEEE TPDS 2001; vLLM's scheduler
config (max_num_batched_tokens 8,192 with chunked prefill).
"""

from __future__ import annotations

import math
import random
from itertools import compress
from typing import Mapping

import numpy as np

from services.core.policies._caches import BlockLRU, Handover, KeyLRU
from services.core.policies._common import Ring, least_loaded, p2c
from services.core.policy import ClusterState, NoHealthyReplica, Pick, Reason
from services.core.policies._prefix_rules import PrefixRules
from services.core.policies._record_rules import SHARE_MIN, RecordRules
from services.core.prefixes import NODE_DEPTHS, parse_node_name
from services.core.request import BLOCK_TOKENS, Request
from services.core.table import ColumnarTable
from services.model import COLD_TAILS, DEFAULT_COLD_TAIL

BALANCES = ("requests", "tokens")
BALANCE_FACTOR = 1.25
SPILL_FLOOR = 8
SPILL_COST = 2.0
SPILL_BACKLOG = 8192
MEMORY_KEYS = 1 << 16
HOLD = False
COLD_HOME = "index"
COLD_SHARE = True       # the cold-home rule's gates (module header); chosen by docs/experiments.md
COLD_BACKLOG = False    # "Cold-home rule in a tier" (B lost the drift point's p99 gain: off)
# a first-sight key whose ring owner is over the mean: "two" = the lighter of its first two ring
# replicas; "least" = the least-loaded healthy replica (SGLang cache_aware's no-match rule), measured
# in docs/experiments.md "Issue 23 simulator goals, status" (not better: off)
FIRST_SIGHTS = ("two", "least")
FIRST_SIGHT = "two"
COLD_HOMES = (None, "index", "keys", "oracle")
# a key the cold-home rule finds held nowhere and never seen (not in the key memory): "home" = it
# stays at its planned member (nothing to chase, and the plan placed it); "move" = treated as evicted
# (before 2026-12-06); docs/experiments.md "The cold-home rule and never-seen keys"
COLD_FRESHES = ("home", "move")
COLD_FRESH = "home"
WARM_SPILLS = (None, "over", "always")
WARM_SPILL = "over"


def _check_members(table: Mapping[str, tuple[int, ...]], replicas: int) -> None:
    """Every row names at least one replica, all below `replicas` (ValueError naming a key).
    A ColumnarTable holds non-empty rows of uint16 indices by construction, so one max over
    its members array checks it: no Python per key (a million-key install spent ~0.6 CPU s
    here walking the rows as tuples)."""
    if isinstance(table, ColumnarTable):
        members = table.members
        if not members.size or int(members.max()) < replicas:
            return
        bad = int(np.flatnonzero(members >= replicas)[0])
        row = int(np.searchsorted(table.row_offsets, bad, side="right")) - 1
        key = table.key_at(row)
        raise ValueError(f"plan maps key {key!r} to {list(table[key])}, outside 0..{replicas - 1}")
    for key, members in table.items():
        if not members or min(members) < 0 or max(members) >= replicas:
            raise ValueError(f"plan maps key {key!r} to {members}, outside 0..{replicas - 1}")


class CacheRoutePolicy(PrefixRules, RecordRules):
    name = "cacheroute"

    def __init__(self, replicas: int, *, rng: random.Random, cold: str = DEFAULT_COLD_TAIL,
                 flat_fallback: bool = False, balance_factor: float | None = BALANCE_FACTOR,
                 spill_floor: int = SPILL_FLOOR, prefix: bool = False, balance: str = "requests",
                 reuse_weight: float = 1.0, spill_cost: float | None = SPILL_COST,
                 spill_backlog: int = SPILL_BACKLOG, memory_keys: int = MEMORY_KEYS, hold: bool = HOLD,
                 hold_backlog: int | None = None, hold_spill: bool = True, cold_home: str | None = COLD_HOME,
                 first_sight: str = FIRST_SIGHT, cold_share: bool = COLD_SHARE,
                 cold_backlog: bool = COLD_BACKLOG, cold_fresh: str = COLD_FRESH,
                 warm_spill: str | None = WARM_SPILL):
        if cold not in COLD_TAILS:
            raise ValueError(f"unknown cold-tail policy {cold!r}; valid: {', '.join(COLD_TAILS)}")
        for name, value, valid in (("cold_home", cold_home, COLD_HOMES), ("cold_fresh", cold_fresh, COLD_FRESHES),
                                   ("first_sight", first_sight, FIRST_SIGHTS), ("warm_spill", warm_spill, WARM_SPILLS)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(str, valid))}")
        if balance_factor is not None and not (1.0 <= balance_factor < math.inf):
            raise ValueError(f"balance_factor must be a finite number >= 1, or None (guard off), "
                             f"got {balance_factor!r}")
        if spill_floor < 0:
            raise ValueError(f"spill_floor must be >= 0, got {spill_floor!r}")
        self.balance_factor = balance_factor
        self.spill_floor = spill_floor
        if spill_cost is not None and not (0.0 <= spill_cost < math.inf):
            raise ValueError(f"spill_cost must be a finite number >= 0, or None, got {spill_cost!r}")
        if memory_keys < 0:
            raise ValueError(f"memory_keys must be >= 0, got {memory_keys!r}")
        self.spill_cost = spill_cost
        self.spill_backlog = spill_backlog
        self.memory_keys = memory_keys
        self.hold = hold
        self.hold_backlog = hold_backlog
        self.hold_spill = hold_spill
        self.cold_home = cold_home
        self.cold_share = cold_share
        self.cold_backlog = cold_backlog
        self.cold_fresh = cold_fresh
        self.first_sight = first_sight
        self.warm_spill = warm_spill
        self._index: BlockLRU | KeyLRU | None = None   # what this policy routed to each replica (cold_home)
        self._seen: dict[str, int] = {}          # key -> replica of its latest request (two generations)
        self._seen_old: dict[str, int] = {}
        self._spill_ring = Ring(replicas)
        self.replicas = replicas
        self.cold = cold
        self.flat_fallback = flat_fallback
        self._rng = rng
        # the cold tail's balance factor: the guard's, or CHWBL's own 1.25 with the guard off
        self._cold_c = balance_factor if balance_factor is not None else BALANCE_FACTOR
        self._table: Mapping[str, tuple[int, ...]] = {}
        self.prefix = prefix
        if balance not in BALANCES:
            raise ValueError(f"unknown balance {balance!r}; valid: {', '.join(BALANCES)}")
        self.balance = balance
        self.reuse_weight = reuse_weight
        self._nodes: dict[int, tuple[int, ...]] = {}
        self._depths: tuple[int, ...] = ()
        self._node_ring = self._spill_ring
        self.plan = None

    def set_plan(self, plan) -> None:
        table = self.table_from(plan) if plan is not None else {}
        _check_members(table, self.replicas)
        nodes: dict[int, tuple[int, ...]] = {}
        depths: set[int] = set()
        if plan is not None and self.prefix:
            for name, entry in plan.prefixes.items():
                members = entry.replicas
                if not members or min(members) < 0 or max(members) >= self.replicas:
                    raise ValueError(f"plan maps prefix {name} to {members}, outside 0..{self.replicas - 1}")
                nodes[parse_node_name(name)] = members
                depths.add(entry.tokens // 16)
        self._table = table
        self._nodes = nodes
        self._depths = tuple(sorted((d for d in depths if d in NODE_DEPTHS), reverse=True))
        self.plan = plan

    def table_from(self, plan) -> Mapping[str, tuple[int, ...]]:
        """The dispatch table for a plan; ablations override this."""
        return plan.table

    def set_flat_fallback(self, on: bool) -> None:
        self.flat_fallback = on

    def pick(self, request: Request, state: ClusterState) -> Pick:
        if self.flat_fallback:
            return Pick(p2c(self._rng, state), Reason.FALLBACK)
        if self.cold_home is not None:
            pick = self._pick_held(request, state)
            index = self._index
            if pick.reason != Reason.HOLD and index is not None:
                if isinstance(index, BlockLRU):
                    index.insert(pick.replica, request.blocks)
                else:
                    index.insert(pick.replica, request.key, request.prompt_tokens)
            return pick
        return self._pick_held(request, state)

    def observe(self, replica: int, request: Request, state: ClusterState | None = None, *,
                memory: bool = True) -> None:
        """Record that another router instance of the tier sent `request` to `replica` (the record
        bus: dispatchers exchange what they routed, so each one's cold-home record and, with
        `memory`, its cold-tail key memory see the whole tier's traffic, not its 1/N share).
        The same insertion `pick` makes for its own picks; nothing is routed. A replica outside
        this policy's slots is ignored (a peer on a plan with more replicas)."""
        if not 0 <= replica < self.replicas:
            return
        if memory:
            self._remember(request.key, replica)
        if self.cold_home is None:
            return
        index = self._index
        if index is None and state is not None:     # sized by the pools, as the first own pick does
            index = self._lru(state, BlockLRU if request.blocks and self.cold_home != "keys" else KeyLRU)
        if index is None:
            return          # pool sizes not known yet: nothing to record into
        if isinstance(index, BlockLRU):
            if request.blocks:
                index.insert(replica, request.blocks)
        else:
            index.insert(replica, request.key, request.prompt_tokens)

    def _pick_held(self, request: Request, state: ClusterState) -> Pick:
        if not self.hold or not state.kv_blocks:
            return self._choose(request, state)
        seen = self.remembered(request.key)      # before the pick remembers itself
        pick = self._choose(request, state)
        if self._room(pick.replica, request, state, seen):
            return pick
        return self._hold_or_move(pick, request, state, seen)

    def _choose(self, request: Request, state: ClusterState) -> Pick:
        """The routing rules of the module header (plan table, guard and spill, cold tail)."""
        if self.balance == "tokens":
            return self._pick_tokens(request, state)
        members = self._table.get(request.key)
        if members is None and self._nodes:
            members = self._node_members(request)
            if members is not None:
                return self._pick_node(request.key, members, state)
        if members is None:
            if self.cold == "chwbl":
                return Pick(self._cold_pick(request, state), Reason.COLD)
            return Pick(p2c(self._rng, state), Reason.COLD)
        best = least_loaded(members, state)
        if best is None:
            return Pick(p2c(self._rng, state), Reason.FALLBACK)
        if self.cold_home:
            moved = self._off_cold_home(request, best, members, state)
            if moved is not None:
                return moved
        c = self.balance_factor
        if c is None:
            return Pick(self._remember(request.key, best), Reason.PLANNED)
        load, healthy = state.in_flight, state.healthy       # the bound, inline: this runs per request
        live = healthy.count(True)
        total = sum(load) if live == len(load) else sum(compress(load, healthy))
        bound = max(self.spill_floor, math.ceil(c * (total + 1) / live))
        if self.warm_spill is not None and (self.warm_spill == "always" or load[best] + 1 > bound):
            warm = self._warm_other(request, best, members, state, bound)
            if warm is not None:
                return warm
        if load[best] + 1 <= bound:
            return Pick(self._remember(request.key, best), Reason.PLANNED)
        target = self._spill(request.key, state, bound)
        if not self._pays(best, target, request, state):
            return Pick(self._remember(request.key, best), Reason.PLANNED)
        return Pick(self._remember(request.key, target), Reason.FALLBACK)

    def _room(self, r: int, request: Request, state: ClusterState, seen: int | None) -> bool:
        """Whether replica r takes `request` without overcommitting its KV (the hold rule of the
        module header): the blocks in use, plus the prefill queued there, plus this request's
        uncached prompt and output must fit the pool, and (`hold_backlog`) a replica with requests
        waiting must not already hold a step's prefill. The prompt counts as cached on the key's
        planned members and on `seen` (the replica its latest request went to). Unknown pool
        size: room."""
        pool = state.kv_blocks[r]
        if pool <= 0:
            return True
        home = r == seen or r in self._table.get(request.key, ())
        uncached = request.prompt_tokens - (request.prefix_tokens if home else 0)
        own = uncached + getattr(request, "output_tokens", 0)
        if own > pool * BLOCK_TOKENS:
            return True                  # never fits: the engine refuses it, holding would not help
        backlog = state.prefill_tokens[r]
        if state.kv_usage[r] * pool + (backlog + own) / BLOCK_TOKENS > pool:
            return False
        limit = self.hold_backlog
        return limit is None or backlog + uncached <= limit or not (state.waiting and state.waiting[r])

    def _hold_or_move(self, pick: Pick, request: Request, state: ClusterState, seen: int | None) -> Pick:
        """`pick`'s replica has no room: another acceptable replica with room (the key's planned
        members, least loaded first, then the spill rule's candidates on the key's ring: within
        the in-flight bound and `_pays`), else HOLD with `pick`'s replica (where it goes if the
        caller cannot or will not wait any longer)."""
        home, key = pick.replica, request.key
        healthy, load = state.healthy, state.in_flight
        members = self._table.get(key, ())
        for m in sorted(members, key=load.__getitem__):
            if m != home and healthy[m] and self._room(m, request, state, seen):
                return Pick(self._remember(key, m), Reason.PLANNED)
        if not self.hold_spill:
            return self._held(key, home, seen)
        bound = self._cold_load(state)[2]
        for r in self._spill_ring.walk(key):
            if (r != home and healthy[r] and r not in members and load[r] + 1 <= bound
                    and self._pays(home, r, request, state) and self._room(r, request, state, seen)):
                return Pick(self._remember(key, r), Reason.FALLBACK)
        return self._held(key, home, seen)

    def _held(self, key: str, home: int, seen: int | None) -> Pick:
        if seen is not None:
            self._remember(key, seen)    # held, not routed: the key's memory stays where it was
        return Pick(home, Reason.HOLD)

    def _pays(self, home: int, target: int, request: Request, state: ClusterState) -> bool:
        """Whether leaving `home` (over the in-flight bound) for `target` pays for the prefill it
        causes. The target must prefill the request's reusable prefix, which home has cached, and
        that prefill evicts about as much of what the target caches, which it re-prefills later:
        `spill_cost` (2) prefixes. So the spill pays only when home's queued prefill exceeds one
        engine step (`spill_backlog`; below it home starts the request's prefill in its next step
        anyway) and exceeds the target's by more than that cost. `spill_cost` None: the in-flight
        bound alone decides (the guard before issue 23's third pass)."""
        if self.spill_cost is None:
            return True
        backlog = state.prefill_tokens
        return (backlog[home] > self.spill_backlog
                and backlog[home] - backlog[target] > self.spill_cost * request.prefix_tokens)

    def _remember(self, key: str, replica: int) -> int:
        """Record the replica a key's request went to (bounded: two generations of `memory_keys`)."""
        if self.memory_keys:
            seen = self._seen
            seen[key] = replica
            if len(seen) >= self.memory_keys:
                self._seen_old, self._seen = seen, {}
        return replica

    def remembered(self, key: str) -> int | None:
        """The replica the key's latest request went to, if this policy still remembers it."""
        r = self._seen.get(key)
        return self._seen_old.get(key) if r is None else r

    def carry_memory(self, other: "CacheRoutePolicy") -> None:
        """Take over another instance's key memory (a dispatcher builds a policy per plan; slots
        only ever grow, so a memory of fewer replicas stays valid)."""
        if isinstance(other, CacheRoutePolicy) and other.replicas <= self.replicas:
            self._seen, self._seen_old = other._seen, other._seen_old
            if other.replicas == self.replicas and other.cold_home == self.cold_home:
                self._index = other._index      # what each replica caches outlives the plan too

    def handover(self) -> Handover:
        """This policy's key memory and cold-home record, for a router of the tier that starts
        with neither (the record bus's hand-over, services/dispatcher/recordbus.py)."""
        memory = [*self._seen_old.items(), *self._seen.items()]
        index = self._index
        if index is None:
            return Handover(memory, None, 0, ())
        kind = "blocks" if isinstance(index, BlockLRU) else "keys"
        return Handover(memory, kind, index.blocks, [index.entries(r) for r in range(self.replicas)])

    def absorb(self, older: Handover) -> None:
        """Take a peer's hand-over as older than what this policy routed itself: its keys are
        remembered where this policy has no newer route for them, its record goes below this
        record's own (_caches.py), both within their usual bounds. A record of the other kind
        than this policy's is left out; replicas outside this policy's slots are skipped."""
        if self.memory_keys:
            own = {**self._seen_old, **self._seen}
            n = self.replicas
            merged = {k: r for k, r in older.memory if k not in own and 0 <= r < n}
            merged.update(own)
            if len(merged) > self.memory_keys:
                merged = dict(list(merged.items())[-self.memory_keys:])
            self._seen_old, self._seen = merged, {}
        if self.cold_home is None or older.kind is None or older.blocks < 1:
            return
        kind = BlockLRU if older.kind == "blocks" else KeyLRU
        if self._index is None:
            self._index = kind(self.replicas, older.blocks)
        if type(self._index) is kind:
            for r, entries in enumerate(older.record[:self.replicas]):
                self._index.absorb(r, entries)

    def _cold(self, key: str, state: ClusterState) -> int:
        """The cold tail: the first healthy replica on the key's ring (the same ring in every
        dispatcher, and the one `ring_homes` admits keys on) whose in-flight count stays within
        the bound max(spill_floor, ceil(c x (total + 1) / live)). The floor is what keeps one
        user's sequential requests at home at low load: without it the bound is 1 when the
        cluster is nearly idle, so a single request in flight at home (or a count one poll
        stale) sends the next one elsewhere (issue 23: tenant 0 landed on engines 1, 3, 4, 1).
        Near the knee the floor is far below c x mean and the rule is CHWBL's."""
        return self._spill(key, state, self._cold_load(state)[2])

    def _cold_load(self, state: ClusterState) -> tuple[int, int, int]:
        """(healthy replicas, their requests in flight, the cold tail's bound); NoHealthyReplica if none."""
        healthy, load = state.healthy, state.in_flight
        live = healthy.count(True)
        if not live:
            raise NoHealthyReplica("no healthy replica")
        total = sum(load) if live == len(load) else sum(compress(load, healthy))
        return live, total, max(self.spill_floor, math.ceil(self._cold_c * (total + 1) / live))

    def _cold_pick(self, request: Request, state: ClusterState) -> int:
        """The cold tail with memory: a key seen before goes back to its replica while that replica
        stays within the bound, or when a spill would not pay (`_pays`); a first-sight key goes to
        its ring owner while the owner holds at most the mean in flight, else to the less loaded of
        its first two ring replicas (two choices: Mitzenmacher, "The Power of Two Choices in
        Randomized Load Balancing", 2001), within the bound, else down the ring (`_cold`).
        "At most the mean" allows one request over it: each dispatcher sees a key for the first
        time on its own, at another moment, and one request of someone else's in flight on the
        owner must not send a sequential user elsewhere (tests/e2e/test_sequential.py with 4
        dispatchers failed without it).
        Balancing first sight is what keeps in-flight skew and KV preemptions down where most keys
        are cold (docs/experiments.md, "Routing rules, third pass"); the ring owner first keeps
        dispatchers agreeing at low load, and the planner admits a key where telemetry says it was
        served, so admission moves nothing. `memory_keys` 0: `_cold` alone (the rule before)."""
        if not self.memory_keys:
            return self._cold(request.key, state)
        key = request.key
        healthy, load = state.healthy, state.in_flight
        live, total, bound = self._cold_load(state)
        r = self.remembered(key)
        if r is not None and healthy[r]:
            if load[r] + 1 <= bound:
                return self._remember(key, r)
            target = self._spill(key, state, bound)
            return self._remember(key, target if self._pays(r, target, request, state) else r)
        first = second = -1
        for c in self._spill_ring.walk(key):
            if healthy[c]:
                if first < 0:
                    first = c
                else:
                    second = c
                    break
        if load[first] <= math.ceil(total / live) + 1:      # at most one request over the mean
            return self._remember(key, first)
        pick = second if second >= 0 and load[second] < load[first] else first
        if self.first_sight == "least":
            pick = min((c for c in range(len(load)) if healthy[c]), key=load.__getitem__)
        if load[pick] + 1 > bound:
            pick = self._spill(key, state, bound)
        return self._remember(key, pick)

    def _spill(self, key: str, state: ClusterState, bound: int) -> int:
        """First healthy replica on the key's ring within the bound (the planned members and the
        cold tail's home are above it, or the walk starts at the home)."""
        healthy, load = state.healthy, state.in_flight
        for r in self._spill_ring.walk(key):
            if healthy[r] and load[r] + 1 <= bound:
                return r
        return least_loaded(range(len(load)), state)      # unreachable for c >= 1


PREFIX_KNOBS = {"prefix": True, "balance": "tokens", "balance_factor": None, "reuse_weight": 4.0}


def prefix_policy(replicas: int, *, rng: random.Random, **knobs) -> CacheRoutePolicy:
    """`cacheroute-prefix`: the cacheroute policy with prefix nodes and token balance (PREFIX_KNOBS,
    each overridable); the simulator plans it with services.core.prefixes.build_prefix_plan."""
    policy = CacheRoutePolicy(replicas, rng=rng, **{**PREFIX_KNOBS, **knobs})
    policy.name = "cacheroute-prefix"
    return policy
