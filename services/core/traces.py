"""Real-trace parsing: Mooncake JSONL and Azure LLM inference CSV lines -> Workload. Pure: the
lines come from the caller (services/sim/tracefiles.py opens the files).

Mooncake (FAST'25): one request a line, `{"timestamp": ms, "input_length",
"output_length", "hash_ids": [...]}`, each id one 512-token block, chained (an id
identifies its whole prefix). Each id maps onto 32 engine blocks of 16 tokens whose
hashes are a function of (id, position) only, so equal ids give equal hashes and the
chaining carries over; the request's last id covers only the tokens that remain
(`input_length - 512 * (len - 1)`), i.e. its first floor(rest / 16) engine blocks.
Routing key = the first `key_blocks` ids joined with "-" (default 2: block 0 of the
conversation trace is a universal system prompt, so the first two ids name a session).
Memory: the conversation trace holds ~4.6M engine blocks; hashes of ids that recur are
built once and shared between requests (a request's tuple only holds references).

Azure LLM inference 2023 (Splitwise, ISCA'24): `TIMESTAMP,ContextTokens,GeneratedTokens`,
arrivals and lengths only. We attach seeded synthetic keys: each request draws its key
from a pool of `keys` keys (default 2,000, ~10 requests per key on the 19,366-request
conversation trace) with the paper's log-normal popularity (sigma 1.65, Blom positions,
see workloads.py). A key's shared prefix is `prefix_share` (default 0.5) of the context
tokens of its first request, in whole 16-token blocks; a later request of the key shares
that prefix, cut to fit below its own context. These are modelling choices, not facts
about the trace: hit rates on Azure measure the router under an assumed reuse pattern.

Both loaders replay arrivals as recorded (seconds from the first request) or, with
`qps=X`, rescale them so the mean arrival rate is X. Malformed lines raise ValueError
naming the source (the file) and line.
"""

from __future__ import annotations

import csv
import math
import os
from datetime import datetime
from typing import Iterable, Iterator, Sequence

import numpy as np
import orjson

from services.core.request import BLOCK_TOKENS, Request
from services.core.workloads import RateEpoch, Workload, block_hashes, lognormal_shares

MOONCAKE_BLOCK_TOKENS = 512
SUB_BLOCKS = MOONCAKE_BLOCK_TOKENS // BLOCK_TOKENS      # 32 engine blocks per trace block
AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_MIX = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


# ---------------------------------------------------------------- Mooncake

def mooncake_workload(lines: Iterable[str], path: str, *, qps: float | None = None, key_blocks: int = 2,
                      limit: int | None = None) -> Workload:
    """A Mooncake JSONL trace's lines (first `limit` requests if given) as a workload; `path`
    names the source in the workload and in errors."""
    if key_blocks < 1:
        raise ValueError("key_blocks must be >= 1")
    rows = list(_mooncake_rows(lines, path, limit))
    uses: dict[int, int] = {}
    for _, _, _, ids in rows:
        for i in ids:
            uses[i] = uses.get(i, 0) + 1
    order = {block_id: row for row, block_id in enumerate(uses)}
    table = sub_block_hashes(np.fromiter(uses, dtype=np.uint64, count=len(uses)))
    shared: dict[int, tuple[int, ...]] = {}

    def id_blocks(block_id: int) -> tuple[int, ...]:
        chain = shared.get(block_id)
        if chain is None:
            chain = tuple(table[order[block_id]].tolist())
            if uses[block_id] > 1:
                shared[block_id] = chain
        return chain

    arrivals = _arrivals([r[0] / 1000.0 for r in rows], qps, path)
    requests, prefix = [], {}
    for rid, i in enumerate(_arrival_order(arrivals)):
        (_, inp, out, ids), t = rows[i], arrivals[i]
        blocks = _request_blocks(ids, inp, id_blocks)
        key = "-".join(map(str, ids[:key_blocks]))
        if key not in prefix:
            prefix[key] = min(len(blocks), key_blocks * SUB_BLOCKS) * BLOCK_TOKENS
        requests.append(Request(rid, t, key, inp, max(out, 1), blocks))
    knobs = {"qps": qps, "key_blocks": key_blocks, "limit": limit, "path": path}
    return _workload(f"mooncake:{os.path.basename(path)}", requests, prefix, knobs, seed=0)


def _mooncake_rows(lines: Iterable[str], path: str, limit: int | None) -> Iterator[tuple[float, int, int, list[int]]]:
    for lineno, line in enumerate(lines, 1):
        if limit is not None and lineno > limit:
            return
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
            ts, inp, out, ids = rec["timestamp"], rec["input_length"], rec["output_length"], rec["hash_ids"]
            _check(isinstance(ts, (int, float)) and ts >= 0, "timestamp must be a number >= 0")
            _check(_is_int(inp) and inp >= 1, "input_length must be an integer >= 1")
            _check(_is_int(out) and out >= 0, "output_length must be an integer >= 0")
            _check(isinstance(ids, list) and all(_is_int(i) for i in ids), "hash_ids must be a list of integers")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{lineno}: malformed Mooncake record: {_describe(e)}") from None
        yield float(ts), inp, out, ids


def sub_block_hashes(ids: np.ndarray) -> np.ndarray:
    """(len(ids), 32) engine block hashes: splitmix64 of id * 32 + position, 63 bits."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64)[:, None] * np.uint64(SUB_BLOCKS) + np.arange(SUB_BLOCKS, dtype=np.uint64)
        z = z * np.uint64(_MIX) + np.uint64(_MIX)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z & np.uint64(_MASK63)


def _request_blocks(ids: list[int], input_length: int, id_blocks) -> tuple[int, ...]:
    """Engine block hashes covering the request's full 16-token blocks."""
    full = input_length // BLOCK_TOKENS
    out: list[int] = []
    for block_id in ids:
        room = full - len(out)
        if room <= 0:
            break
        chain = id_blocks(block_id)
        out.extend(chain if room >= SUB_BLOCKS else chain[:room])
    return tuple(out)


# ---------------------------------------------------------------- Azure

def azure_workload(lines: Iterable[str], path: str, *, qps: float | None = None, seed: int = 0, keys: int = 2000,
                   sigma: float = 1.65, prefix_share: float = 0.5, limit: int | None = None) -> Workload:
    """An Azure LLM inference CSV's lines as a workload, with seeded synthetic keys (module
    header); `path` names the source in the workload and in errors."""
    if keys < 1 or not 0.0 <= prefix_share < 1.0:
        raise ValueError("load_azure needs keys >= 1 and 0 <= prefix_share < 1")
    rows = list(_azure_rows(lines, path, limit))
    arrivals = _arrivals([r[0] for r in rows], qps, path)
    rng = np.random.default_rng(seed)
    shares = lognormal_shares(keys, sigma)
    key_idx = np.minimum(np.searchsorted(np.cumsum(shares), rng.random(len(rows)), side="right"), keys - 1)
    namespace = f"azure:{seed}"
    chains: dict[str, tuple[int, ...]] = {}
    cut: dict[tuple[str, int], tuple[int, ...]] = {}
    prefix: dict[str, int] = {}
    requests = []
    key_of = key_idx.tolist()
    for rid, i in enumerate(_arrival_order(arrivals)):
        (_, ctx, gen), t = rows[i], arrivals[i]
        key = f"a{key_of[i]:05d}"
        if key not in chains:
            n = int(prefix_share * ctx) // BLOCK_TOKENS
            chains[key] = block_hashes(namespace, key, n)
            prefix[key] = n * BLOCK_TOKENS
        chain = chains[key]
        fit = (ctx - 1) // BLOCK_TOKENS
        if fit < len(chain):
            chain = cut.setdefault((key, fit), chain[:fit])
        requests.append(Request(rid, t, key, ctx, max(gen, 1), chain))
    knobs = {"qps": qps, "keys": keys, "sigma": sigma, "prefix_share": prefix_share,
             "limit": limit, "path": path}
    return _workload(f"azure:{os.path.basename(path)}", requests, prefix, knobs, seed=seed)


def _azure_rows(lines: Iterable[str], path: str, limit: int | None) -> Iterator[tuple[float, int, int]]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != AZURE_HEADER:
        raise ValueError(f"{path}:1: expected header {','.join(AZURE_HEADER)}, got {header}")
    epoch = None
    for lineno, row in enumerate(reader, 2):
        if limit is not None and lineno - 1 > limit:
            return
        if not row:
            continue
        try:
            _check(len(row) == 3, f"expected 3 fields, got {len(row)}")
            ts = datetime.fromisoformat(row[0].strip()).timestamp()
            ctx, gen = int(row[1]), int(row[2])
            _check(ctx >= 1 and gen >= 0, "ContextTokens must be >= 1 and GeneratedTokens >= 0")
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: malformed Azure record: {e}") from None
        epoch = ts if epoch is None else epoch
        yield ts - epoch, ctx, gen


# ---------------------------------------------------------------- shared

def ideal_hits(requests: Sequence[Request]) -> list[int]:
    """Per request, in order: the prompt tokens one infinite cache that has seen every earlier
    request (in list order) would hit, i.e. the longest leading run of its blocks seen before,
    capped at (prompt - 1) // 16 blocks as the engine caps a hit. No engine can hit more for
    that request: its cache only ever holds blocks of requests scheduled before it, a subset."""
    seen: set[int] = set()
    out = []
    for r in requests:
        blocks = r.blocks
        limit = min(len(blocks), (r.prompt_tokens - 1) // BLOCK_TOKENS)
        n = 0
        while n < limit and blocks[n] in seen:
            n += 1
        out.append(n * BLOCK_TOKENS)
        seen.update(blocks)
    return out


def window_hit_bound(requests: Sequence[Request], start: float = 0.0, end: float = math.inf,
                     served: Sequence[bool] | None = None) -> float:
    """The measured-window infinite-cache bound on a served hit rate: token hit rate of one
    infinite cache (`ideal_hits`) over the requests arriving in [start, end) (and, if `served`
    is given, flagged served; `served[i]` belongs to `requests[i]`), with every earlier request,
    warm-up included, already in the cache. A simulator's hit rate over the same requests
    cannot exceed it. `requests` must be in arrival order."""
    hits = ideal_hits(requests)
    hit = total = 0
    for i, r in enumerate(requests):
        if start <= r.arrival < end and (served is None or served[i]):
            hit += hits[i]
            total += r.prompt_tokens
    return hit / total if total else 0.0


def ideal_hit_rate(requests: Sequence[Request]) -> float:
    """Token hit rate of one infinite cache fed the whole stream in order (`window_hit_bound`
    over every request)."""
    return window_hit_bound(requests)


def azure_arrivals(lines: Iterable[str], path: str) -> list[float]:
    """An Azure LLM inference CSV's arrival times only: seconds from its first record, sorted."""
    return sorted(t for t, _, _ in _azure_rows(lines, path, None))


def replay_arrivals(stamps: Sequence[float], qps: float, duration: float) -> np.ndarray:
    """A recorded arrival pattern at mean rate `qps` on [0, duration): the first
    n = round(qps * duration) recorded arrivals (the record looped end to end if it holds fewer,
    with period = its span + one mean gap), time-scaled so that arrival n + 1 would fall at
    `duration`; exactly n arrivals. Gap CV and the shape of the record's rate changes are kept;
    their time scale shrinks by the same factor as the gaps (record rate / qps)."""
    if qps <= 0 or duration <= 0:
        raise ValueError("qps and duration must be positive")
    t = np.sort(np.asarray(stamps, dtype=float))
    if len(t) < 2 or t[-1] <= t[0]:
        raise ValueError("a replayed arrival record needs two or more distinct times")
    t -= t[0]
    n = max(1, round(qps * duration))
    period = t[-1] * len(t) / (len(t) - 1)
    reps = -(-(n + 1) // len(t))
    looped = (t[None, :] + period * np.arange(reps)[:, None]).ravel()[:n + 1]
    times = looped[:n] * (duration / looped[n])
    return times[times < duration]


def _arrivals(times: list[float], qps: float | None, path: str) -> list[float]:
    """Seconds from the earliest request, in record order; rescaled to mean rate `qps` if
    given."""
    if not times:
        raise ValueError(f"{path}: no requests")
    t0 = min(times)
    rel = [t - t0 for t in times]
    if qps is None:
        return rel
    if qps <= 0:
        raise ValueError("qps must be positive")
    span = max(rel)
    if len(rel) < 2 or span <= 0:
        raise ValueError(f"{path}: cannot rescale arrivals that span no time")
    scale = (len(rel) - 1) / (qps * span)          # mean gap becomes 1 / qps
    return [t * scale for t in rel]


def _arrival_order(arrivals: list[float]) -> list[int]:
    """Record indices by arrival (stable), so rids follow arrival order."""
    return sorted(range(len(arrivals)), key=arrivals.__getitem__)


def _workload(name: str, requests: list[Request], prefix: dict[str, int], knobs: dict,
              seed: int) -> Workload:
    n = len(requests)
    span = requests[-1].arrival
    duration = span * n / (n - 1) if n > 1 and span > 0 else 1.0
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.key] = counts.get(r.key, 0) + 1
    keys = tuple(sorted(counts, key=lambda k: (-counts[k], k)))
    rates = {k: counts[k] / duration for k in keys}
    return Workload(name, n / duration, duration, seed, requests, keys, prefix, rates,
                    (RateEpoch(0.0, rates),), knobs)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _describe(e: Exception) -> str:
    return f"missing field {e}" if isinstance(e, KeyError) else str(e)
