"""Prefix nodes: what many keys share, counted, admitted and placed (ours, issue 14).

A routing key names a tenant or a session; requests of *different* keys often share deeper
prefixes too (a document, a tool schema, a long system prompt). A plan over flat keys cannot
see that. This module adds prefix nodes to the plan, from block-hash ids only (never content).

Chain. A request's prefix chain is its chained 16-token block hashes sampled at a few depths,
`NODE_DEPTHS` blocks (32 = 512 tokens, doubling to 4,096 = 64k tokens). The hash of block d-1
already identifies blocks 0..d-1 (vLLM-style chaining), so one 64-bit id per depth names the
whole prefix: node (id, depth). At most len(NODE_DEPTHS) ids per request.

Counting (`PrefixCounter`, pure): per window, for each node its arrivals per key (keys by a
stable 64-bit hash, so a key of any length costs 8 bytes), its depth and its parent node (the
next shallower node on the chain). Bounded: at most `max_nodes` nodes and `max_keys` keys per
node are tracked (the rest are counted in `dropped`), so a flood of unique prompts cannot grow
it without bound. The live collector and the simulator feed the same counter.

Candidates. A node is a candidate when at least `min_keys` (2) distinct keys reached it in the
window: a node reached by one key is that key's own prefix, which the key's table entry already
covers. A candidate is redundant (dropped) when a candidate child carries the same arrivals (all
traffic through it continues through the child, which serves it with more tokens).

Admission (`plan_prefixes`): candidates by value density rate x reusable tokens / k desc (ties:
rate desc, id asc), skip-and-continue into what the keys left of the warm-slot budget
C = R x W; k = min(R, max(1, ceil(rate / q_cap))) as for keys. The rate is the node's whole
arrival rate (every request through it needs its prefix).

Placement. Nodes first, heaviest first: a node keeps the members it had in the active plan (by
replica id) if they still exist, else the k least-loaded replicas; its load share is the rate of
its arrivals from keys that are *not* admitted (those route by node); admitted keys through it
carry their own load. Then keys (`build_prefix_plan`): a key whose deepest admitted node covers
at least half of the key's own reusable prefix is placed on members of that node (its document
lives there), so "key entry first" dispatch lands it where the node is warm.

Available hit rate. Over the window's arrivals, an infinite cache at node granularity hits,
for each node, every arrival after the first on the tokens the node adds to its parent:
sum_v (n_v - 1) (tokens_v - tokens_parent(v)) / prompt tokens. The planner reports it next to
the hit rate the engines report (achieved), per window.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from services.core.plan import Plan
from services.core.planning import (admit, admit_by_density, check_inputs, exact_sum, imbalance, place_lpt, size_keys,
                                    with_churn)
from services.core.request import BLOCK_TOKENS
from services.core.ring import Ring

NODE_DEPTHS = (32, 64, 128, 256, 512, 1024, 2048, 4096)   # engine blocks
MIN_KEYS = 2
NODE_SHARE = 0.5       # a node serves a key (placement) or a cold request (dispatch) when it covers
                       # at least this share of the reusable prefix (Preble's exploit rule)
MAX_NODES = 200_000
MAX_KEYS_PER_NODE = 256


def chain(blocks: Sequence[int], depths: Sequence[int] = NODE_DEPTHS) -> tuple[tuple[int, int], ...]:
    """(node id, depth in blocks) for each depth the prefix reaches, shallow first."""
    n = len(blocks)
    return tuple((int(blocks[d - 1]), d) for d in depths if d <= n)


def chain_ids(blocks: Sequence[int], depths: Sequence[int] = NODE_DEPTHS) -> tuple[int, ...]:
    """Only the ids of `chain(blocks)` (what telemetry carries)."""
    n = len(blocks)
    return tuple(int(blocks[d - 1]) for d in depths if d <= n)


def node_name(node: int) -> str:
    """The plan-file / wire name of a node id: 16 lowercase hex digits."""
    return f"{node & 0xFFFFFFFFFFFFFFFF:016x}"


def parse_node_name(name: str) -> int:
    if len(name) != 16:
        raise ValueError(f"prefix node id must be 16 hex digits, got {name!r}")
    try:
        return int(name, 16)
    except ValueError:
        raise ValueError(f"prefix node id must be 16 hex digits, got {name!r}") from None


def key_hash(key: str) -> int:
    """The 64-bit id a key is counted under in node statistics (identical in every process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=b"cr-prefix").digest(), "little")


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One node's arrivals in a window."""

    node: int
    depth: int                          # blocks
    parent: int                         # 0: none (shallowest depth)
    keys: Mapping[int, int]             # key hash -> arrivals

    @property
    def count(self) -> int:
        return sum(self.keys.values())

    @property
    def tokens(self) -> int:
        return self.depth * BLOCK_TOKENS


@dataclass
class PrefixCounter:
    """Window counts per (node, key); bounded (module header). Not thread-safe."""

    max_nodes: int = MAX_NODES
    max_keys: int = MAX_KEYS_PER_NODE
    depths: tuple[int, ...] = NODE_DEPTHS
    dropped: int = 0
    prompt_tokens: int = 0
    arrivals: int = 0
    _nodes: dict[int, tuple[int, int, dict[int, int]]] = field(default_factory=dict)

    def observe(self, key: str | int, ids: Sequence[int], prompt_tokens: int = 0, count: int = 1) -> None:
        """One arrival (or `count`) of `key` whose chain ids, shallow first, are `ids` (depths
        `self.depths[:len(ids)]`)."""
        kh = key if isinstance(key, int) else key_hash(key)
        self.arrivals += count
        self.prompt_tokens += prompt_tokens * count
        nodes, parent = self._nodes, 0
        for node, depth in zip(ids, self.depths):
            entry = nodes.get(node)
            if entry is None:
                if len(nodes) >= self.max_nodes:
                    self.dropped += count
                    return
                entry = nodes[node] = (depth, parent, {})
            per_key = entry[2]
            if kh in per_key:
                per_key[kh] += count
            elif len(per_key) < self.max_keys:
                per_key[kh] = count
            else:
                self.dropped += count
            parent = node

    def samples(self) -> list[NodeSample]:
        return [NodeSample(node, d, p, dict(k)) for node, (d, p, k) in self._nodes.items()]

    def __len__(self) -> int:
        return len(self._nodes)

    def clear(self) -> None:
        self._nodes = {}
        self.dropped = self.prompt_tokens = self.arrivals = 0


# ---------------------------------------------------------------------------------------------
# the stored form: one count field per (node, depth, parent, key)

FIELD_CHARS = 16 + 1 + 16 + 16


def count_fields(key: str | int, ids: Sequence[int], depths: Sequence[int] = NODE_DEPTHS) -> list[str]:
    """The store fields one arrival adds 1 to: node id, depth index (one hex digit), parent id,
    key hash, each fixed-width hex (FIELD_CHARS characters). At most len(depths) fields."""
    kh = key if isinstance(key, int) else key_hash(key)
    tail = f"{kh & 0xFFFFFFFFFFFFFFFF:016x}"
    out, parent = [], 0
    for i, node in enumerate(ids[: len(depths)]):
        out.append(f"{node & 0xFFFFFFFFFFFFFFFF:016x}{i:x}{parent:016x}{tail}")
        parent = node & 0xFFFFFFFFFFFFFFFF
    return out


def samples_from_counts(counts: Mapping[str, int], depths: Sequence[int] = NODE_DEPTHS,
                        max_keys: int = MAX_KEYS_PER_NODE) -> list[NodeSample]:
    """NodeSamples from stored count fields; malformed fields are skipped."""
    nodes: dict[int, tuple[int, int, dict[int, int]]] = {}
    for field, n in counts.items():
        if len(field) != FIELD_CHARS or n <= 0:
            continue
        try:
            node, i, parent, kh = int(field[:16], 16), int(field[16], 16), int(field[17:33], 16), int(field[33:], 16)
        except ValueError:
            continue
        if i >= len(depths):
            continue
        entry = nodes.setdefault(node, (depths[i], parent, {}))
        if kh in entry[2] or len(entry[2]) < max_keys:
            entry[2][kh] = entry[2].get(kh, 0) + int(n)
    return [NodeSample(node, d, p, k) for node, (d, p, k) in nodes.items()]


# ---------------------------------------------------------------------------------------------
# planning


@dataclass(frozen=True, slots=True)
class PrefixEntry:
    """An admitted prefix node in a plan."""

    replicas: tuple[int, ...]        # indices into plan.replica_ids, ascending, distinct
    rate: float                      # arrivals/s through the node in the window
    tokens: int                      # reusable tokens (depth x 16)
    keys: int = 0                    # distinct keys that reached it in the window


def available_hit_rate(samples: Iterable[NodeSample], prompt_tokens: float) -> float:
    """Infinite-cache hit rate at node granularity over one window (module header); 0 without
    prompt tokens. Capped at 1."""
    if prompt_tokens <= 0:
        return 0.0
    samples = list(samples)
    depth = {s.node: s.depth for s in samples}
    hit = 0
    for s in samples:
        n = s.count
        if n > 1:
            above = depth.get(s.parent, 0) if s.parent else 0
            hit += (n - 1) * (s.depth - above) * BLOCK_TOKENS
    return min(1.0, hit / prompt_tokens)


def candidates(samples: Sequence[NodeSample], min_keys: int = MIN_KEYS) -> list[NodeSample]:
    """Shared nodes (>= min_keys distinct keys), without those a candidate child makes redundant."""
    shared = {s.node: s for s in samples if len(s.keys) >= min_keys and s.count > 0}
    redundant = set()
    for s in shared.values():
        parent = shared.get(s.parent) if s.parent else None
        if parent is not None and parent.count == s.count:
            redundant.add(parent.node)
    return sorted((s for s in shared.values() if s.node not in redundant), key=lambda s: s.node)


def node_size(rate: float, q_cap: float, replicas: int) -> int:
    if rate <= 0:
        return 1
    return int(min(replicas, max(1, math.ceil(rate / q_cap))))


def admit_nodes(cands: Sequence[NodeSample], window: float, q_cap: float, replicas: int,
                budget: int) -> list[tuple[NodeSample, float, int]]:
    """(sample, rate, k) of the admitted nodes in placement order (rate desc, id asc)."""
    if window <= 0 or budget <= 0:
        return []
    scored = []
    for s in cands:
        rate = s.count / window
        k = node_size(rate, q_cap, replicas)
        scored.append((rate * s.tokens / k, rate, s.node, s, k))
    scored.sort(key=lambda t: (-t[0], -t[1], t[2]))
    chosen, used = [], 0
    for _, rate, _, s, k in scored:
        if used + k <= budget:
            chosen.append((s, rate, k))
            used += k
            if used == budget:
                break
    chosen.sort(key=lambda t: (-t[1], t[0].node))
    return chosen


def place_nodes(chosen: Sequence[tuple[NodeSample, float, int]], admitted_keys: set[int], window: float,
                loads: list[float], anchors: Mapping[int, tuple[int, ...]],
                healthy: Sequence[bool] | None = None) -> dict[int, PrefixEntry]:
    """Members per admitted node (module header, Placement); adds each node's cold share to `loads`."""
    R = len(loads)
    usable = [r for r in range(R) if healthy is None or healthy[r]] or list(range(R))
    out: dict[int, PrefixEntry] = {}
    for s, rate, k in chosen:
        k = min(k, len(usable))
        cold_rate = sum(c for kh, c in s.keys.items() if kh not in admitted_keys) / window
        kept = [r for r in anchors.get(s.node, ()) if r in usable][:k]
        if len(kept) < k:
            rest = sorted((r for r in usable if r not in kept), key=lambda r: (loads[r], r))
            kept += rest[: k - len(kept)]
        row = tuple(sorted(kept))
        share = cold_rate / len(row)
        for r in row:
            loads[r] += share
        out[s.node] = PrefixEntry(row, rate, s.tokens, len(s.keys))
    return out


def key_attachments(samples: Sequence[NodeSample], admitted: Mapping[int, PrefixEntry],
                    key_tokens: Mapping[int, float]) -> dict[int, int]:
    """key hash -> the deepest admitted node it reached that covers at least NODE_SHARE of the
    key's own reusable prefix (the key's document, not a system prompt it has grown past)."""
    best: dict[int, tuple[int, int]] = {}
    for s in samples:
        entry = admitted.get(s.node)
        if entry is None:
            continue
        for kh in s.keys:
            if entry.tokens < NODE_SHARE * key_tokens.get(kh, 0.0):
                continue
            cur = best.get(kh)
            if cur is None or (entry.tokens, -s.node) > (cur[0], -cur[1]):
                best[kh] = (entry.tokens, s.node)
    return {kh: node for kh, (_, node) in best.items()}


# ---------------------------------------------------------------------------------------------
# the builder

DEFAULT_TOLERANCE = 0.10


def build_prefix_plan(keys: Sequence[str], rates: Sequence[float], replica_ids: Sequence[str], q_cap: float,
                      warm_slots: int, *, prefix_tokens: Sequence[float] | None = None,
                      nodes: Sequence[NodeSample] = (), window_seconds: float = 0.0, active=None,
                      version: int = 1, created_at: float = 0.0, rates_snapshot_id: str = "",
                      healthy: Sequence[bool] | None = None, tolerance: float = DEFAULT_TOLERANCE,
                      prompt_tokens: float = 0.0, admission: str = "rate", min_keys: int = MIN_KEYS):
    """A plan over keys and prefix nodes that keeps where things already are (builder "prefix").

    Keys are sized and admitted exactly as `build_plan` does (so the key set is the paper's);
    prefix nodes fill what the keys left of the budget (module header). Placement is sticky:
    a node keeps its active members; a key keeps its active replicas, or, newly admitted, starts
    on its cold-tail owner (the first healthy replica of its consistent-hash ring, where the cold
    tail has been sending it, so its prefix is already there), as long as that keeps the replica
    within limit = max(from-scratch LPT peak, mean) x (1 + tolerance); otherwise it goes to the
    least-loaded allowed replica. A key attached to a node (it reached an admitted node covering
    at least half its own prefix) is allowed only on that node's members. `churn` is against `active`.
    """
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    rate_arr = np.asarray(rates, dtype=np.float64)
    check_inputs(keys, rate_arr, replica_ids, q_cap, warm_slots)
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    R = len(replica_ids)
    if healthy is not None and len(healthy) != R:
        raise ValueError(f"got {len(healthy)} health flags for {R} replicas")
    usable = [r for r in range(R) if healthy is None or healthy[r]] or list(range(R))
    sizes = size_keys(rate_arr, q_cap, len(usable))
    budget = R * int(warm_slots)
    ptok = np.zeros(len(keys)) if prefix_tokens is None else np.asarray(prefix_tokens, dtype=np.float64)
    if ptok.shape != (len(keys),):
        raise ValueError(f"got {len(keys)} keys but {ptok.size} prefix token counts")
    chosen, order, lam, k_of = _admit_keys(keys, rate_arr, sizes, ptok, budget, admission)
    left = budget - int(sizes[chosen].sum())

    samples = list(nodes)
    window = float(window_seconds)
    picked = admit_nodes(candidates(samples, min_keys), window, q_cap, len(usable), left) if window > 0 else []
    cold_total = exact_sum(np.delete(rate_arr, chosen)) if len(chosen) < len(keys) else 0.0
    tokens_h = {key_hash(key): float(t) for key, t in zip(keys, ptok.tolist())}
    entries, loads, attach = _place_nodes_sticky(samples, picked, window, cold_total, {key_hash(k) for k in order},
                                                 tokens_h, usable, R, _prefix_anchors(active, replica_ids))
    table, scratch_peak = _place_keys_sticky(order, lam, k_of, loads, usable, R, tolerance, entries, attach,
                                             _key_anchors(active, replica_ids, order))

    extra = {"prefix_candidates": len(entries), "tolerance": tolerance, "scratch_peak": scratch_peak}
    if prompt_tokens > 0:
        extra["available_hit_rate"] = available_hit_rate(samples, prompt_tokens)
    if admission != "rate":
        extra["admission"] = admission
    total_rate = float(rate_arr.sum())
    plan = Plan(
        version=version, parent_version=active.version if active is not None else 0, created_at=created_at,
        replica_ids=tuple(replica_ids), q_cap=float(q_cap), warm_slots=int(warm_slots), table=table,
        rates=lam, expected_load=tuple(loads), predicted_imbalance=imbalance([loads[r] for r in usable]),
        total_keys=len(keys), admitted_keys=len(order),
        admitted_rate_share=math.fsum(lam.values()) / total_rate if total_rate > 0 else 0.0,
        builder="prefix", rates_snapshot_id=rates_snapshot_id, window_seconds=window, extra=extra,
        prefixes={node_name(n): e for n, e in entries.items()},
    )
    return with_churn(plan, active)


def _admit_keys(keys: Sequence[str], rate_arr: np.ndarray, sizes: np.ndarray, ptok: np.ndarray, budget: int,
                admission: str) -> tuple[np.ndarray, list[str], dict[str, float], dict[str, int]]:
    """Keys admitted as `build_plan` admits them: (indices, keys, their rates, their sizes)."""
    if admission == "rate":
        chosen = admit(keys, rate_arr, sizes, budget)
    elif admission == "density":
        chosen = admit_by_density(keys, rate_arr, sizes, ptok, budget)
    else:
        raise ValueError(f"unknown admission {admission!r}")
    order = [keys[i] for i in chosen.tolist()]
    return chosen, order, dict(zip(order, rate_arr[chosen].tolist())), dict(zip(order, sizes[chosen].tolist()))


def _place_nodes_sticky(samples: Sequence[NodeSample], picked: Sequence[tuple[NodeSample, float, int]], window: float,
                        cold_total: float, admitted_h: set[int], tokens_h: Mapping[int, float], usable: list[int],
                        R: int, node_anchor: Mapping[int, tuple[int, ...]]):
    """Admitted nodes on their active members first, then the least loaded. A cold key routes by
    its deepest admitted node, so that node's members carry its rate; the rest of the cold tail is
    spread over every usable replica. Returns (entries, loads, key attachments)."""
    draft = {s.node: PrefixEntry((), rate, s.tokens, len(s.keys)) for s, rate, _ in picked}
    attach_cold = key_attachments(samples, draft, {})              # cold keys route by their deepest node
    attach_cold = {kh: n for kh, n in attach_cold.items() if kh not in admitted_h}
    node_cold = {}
    for s in samples:
        for kh, c in s.keys.items():
            if attach_cold.get(kh) == s.node:
                node_cold[s.node] = node_cold.get(s.node, 0.0) + c / window
    spread = max(0.0, cold_total - math.fsum(node_cold.values())) / len(usable)
    loads = [spread if r in usable else 0.0 for r in range(R)]
    entries: dict[int, PrefixEntry] = {}
    for s, rate, k in picked:
        k = min(k, len(usable))
        kept = [r for r in node_anchor.get(s.node, ()) if r in usable][:k]
        if len(kept) < k:
            kept += sorted((r for r in usable if r not in kept), key=lambda r: (loads[r], r))[: k - len(kept)]
        row = tuple(sorted(kept))
        for r in row:
            loads[r] += node_cold.get(s.node, 0.0) / len(row)
        entries[s.node] = PrefixEntry(row, rate, s.tokens, len(s.keys))
    return entries, loads, key_attachments(samples, entries, tokens_h)


def _place_keys_sticky(order: list[str], lam: Mapping[str, float], k_of: Mapping[str, int], loads: list[float],
                       usable: list[int], R: int, tolerance: float, entries: Mapping[int, PrefixEntry],
                       attach: Mapping[int, int], key_anchor: Mapping[str, tuple[int, ...]]):
    """Keys on their active replicas (a new key on its cold-tail ring owner) while a replica stays
    within max(from-scratch LPT peak, mean) x (1 + tolerance), else on the least loaded allowed
    one; an attached key is allowed only on its node's members. Adds to `loads`; returns
    (table, the from-scratch peak)."""
    base = list(loads)
    _, scratch = place_lpt([lam[key] for key in order], [k_of[key] for key in order], len(usable),
                           0.0) if order else ([], [0.0] * len(usable))
    scratch_peak = max(base[r] + s for r, s in zip(usable, scratch)) if order else max(base)
    total = math.fsum(base) + math.fsum(lam.values())
    limit = max(scratch_peak, total / len(usable)) * (1.0 + tolerance)
    ring = Ring(R)
    table: dict[str, tuple[int, ...]] = {}
    for key in order:
        k, share = k_of[key], lam[key] / k_of[key]
        node = attach.get(key_hash(key))
        allowed = list(entries[node].replicas) if node is not None else usable
        if len(allowed) < k:
            allowed = allowed + [r for r in usable if r not in allowed]
        prior = key_anchor.get(key)
        if prior is None:
            owner = next((r for r in ring.walk(key) if r in usable), usable[0])
            prior = (owner,)
        row = [r for r in prior if r in allowed and loads[r] + share <= limit][:k]
        if len(row) < k:
            row += sorted((r for r in allowed if r not in row), key=lambda r: (loads[r], r))[: k - len(row)]
        for r in row:
            loads[r] += share
        table[key] = tuple(sorted(row))
    return table, scratch_peak


def _index_map(active, replica_ids: Sequence[str]) -> list[int]:
    index = {rid: i for i, rid in enumerate(replica_ids)}
    return [index.get(rid, -1) for rid in active.replica_ids]


def _key_anchors(active, replica_ids: Sequence[str], keys: Sequence[str]) -> dict[str, tuple[int, ...]]:
    if active is None:
        return {}
    moved = _index_map(active, replica_ids)
    out = {}
    for key in keys:
        row = active.table.get(key)
        if row is not None:
            kept = tuple(moved[i] for i in row if moved[i] >= 0)
            if kept:
                out[key] = kept
    return out


def _prefix_anchors(active, replica_ids: Sequence[str]) -> dict[int, tuple[int, ...]]:
    if active is None or not active.prefixes:
        return {}
    moved = _index_map(active, replica_ids)
    out = {}
    for name, entry in active.prefixes.items():
        kept = tuple(moved[i] for i in entry.replicas if moved[i] >= 0)
        if kept:
            out[parse_node_name(name)] = kept
    return out
