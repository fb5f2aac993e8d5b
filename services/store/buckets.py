"""Pure bucketing helpers shared by both stores: how a batch splits into time buckets, what
one bucket's write adds, which buckets a window covers and how their sums become rates."""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from services.errors import InvalidArgument
from services.model import ArrivalRecord, CacheCounters, RatesSnapshot
from services.store.config import TelemetryConfig


@dataclass(slots=True)
class BucketPart:
    """A batch's arrivals that fall into one bucket."""

    rows: list[ArrivalRecord]             # in time order
    gaps: list[float]                     # between consecutive arrivals of the batch


_TIME = operator.itemgetter(1)


def split_by_bucket(arrivals: Sequence[ArrivalRecord], cfg: TelemetryConfig) -> dict[int, BucketPart]:
    """Group a batch by bucket (rows in time order; each gap goes to the later arrival's bucket)."""
    rows = sorted(arrivals, key=_TIME)
    if not rows:
        return {}
    times = [r[1] for r in rows]
    first, last = cfg.bucket(times[0]), cfg.bucket(times[-1])
    if first == last:
        spans = [(first, 0, len(rows))]
    else:   # sorted, so each bucket is one contiguous run
        spans, start = [], 0
        idxs = [cfg.bucket(t) for t in times]
        for j in range(1, len(rows) + 1):
            if j == len(rows) or idxs[j] != idxs[start]:
                spans.append((idxs[start], start, j))
                start = j
    parts: dict[int, BucketPart] = {}
    for idx, lo, hi in spans:
        g = max(lo, 1)
        parts[idx] = BucketPart(rows[lo:hi], [b - a for a, b in zip(times[g - 1:hi - 1], times[g:hi])])
    return parts


def key_totals(parts: Iterable[BucketPart]) -> dict[str, list[int]]:
    """key -> [arrivals, summed prompt tokens, summed prefix tokens] over the parts' rows."""
    totals: dict[str, list[int]] = {}
    get = totals.get
    for part in parts:
        for key, _, pt, xt in part.rows:
            acc = get(key)
            if acc is None:
                totals[key] = [1, pt, xt]
            else:
                acc[0] += 1
                acc[1] += pt
                acc[2] += xt
    return totals


def newest(chunks: Iterable[list], cap: int) -> list:
    """The last `cap` items of the chunks concatenated in order."""
    if cap <= 0:
        return []
    out: list = []
    for chunk in reversed(list(chunks)):
        out[:0] = chunk[-(cap - len(out)):]
        if len(out) >= cap:
            break
    return out


def first_of_each_batch_id(parts: list[tuple[int, str, BucketPart]]) -> list[tuple[int, str, BucketPart]]:
    """Drop a repeated batch id's later parts (a duplicate of the first, whatever happens to it)."""
    ids: set[str] = set()
    out = []
    for p in parts:
        if p[1]:
            if p[1] in ids:
                continue
            ids.add(p[1])
        out.append(p)
    return out


def window_buckets(now: float, window_seconds: float, cfg: TelemetryConfig) -> tuple[int, int, float]:
    """Buckets covering the window (the current, partial one included) and its span start."""
    if not (window_seconds > 0 and math.isfinite(window_seconds)):
        raise InvalidArgument("window_seconds must be a positive number")
    if window_seconds > cfg.retention_seconds:
        raise InvalidArgument(f"window {window_seconds:g}s exceeds the telemetry retention {cfg.retention_seconds:g}s")
    first, last = cfg.bucket(now - window_seconds), cfg.bucket(now)
    return first, last, first * cfg.bucket_seconds


BIG_COUNT = 2**56    # sums at or above this stay Python ints (int64 must not overflow)


def snapshot(first: int, last: int, start: float, now: float, totals: dict[str, list[int]],
             untracked: int = 0) -> RatesSnapshot:
    """Window sums by key -> rates over the span from the first bucket's start to `now`;
    `untracked`: arrivals of keys beyond the buckets' key cap (in total_arrivals only)."""
    values = list(totals.values())
    big = any(max(v) >= BIG_COUNT for v in values) if values else False
    acc = np.array(values, dtype=object if big else np.int64).reshape(len(values), 3)
    return snapshot_columns(first, last, start, now, [k.encode() for k in totals], acc, untracked)


def snapshot_columns(first: int, last: int, start: float, now: float, keys: list[bytes],
                      acc: np.ndarray, untracked: int = 0, rank: np.ndarray | None = None,
                      key_space: str = "") -> RatesSnapshot:
    """The snapshot of per-key (n, prompt, prefix) sums, `acc[i]` for `keys[i]`: keys with
    arrivals, hottest first, ties by key (bytewise, i.e. code-point order). Sorting and
    dividing are numpy (a million-key window); the id hashes the ranked keys and counts.
    `rank` (optional): rank[i] = keys[i]'s position in bytewise order over all `keys`.
    `key_space` (optional): `keys` are a cache's index (keys[i] has id i) named so; the
    snapshot then carries each key's id (RatesSnapshot.key_ids)."""
    span = max(now - start, 1e-9)
    n = acc[:, 0]
    live = np.flatnonzero(n > 0)
    live_keys = keys if len(live) == len(keys) else [keys[i] for i in live.tolist()]
    if acc.dtype != object and rank is not None:
        order = _by_count_then_rank(live, n[live], rank[live])
        plain = None                      # known from the ranked keys' join below (no second join)
    else:
        plain = b"".join(live_keys).find(b"\0") < 0
        if acc.dtype != object and plain:
            order = live[np.lexsort((np.array(live_keys, dtype=bytes), -n[live]))] if live_keys else live
        else:   # counts past int64, or keys numpy's fixed-width bytes would truncate: plain Python
            order = np.array(sorted(live.tolist(), key=lambda i: (-int(n[i]), keys[i])), dtype=np.int64)
    ranked = np.array(keys, dtype=object)[order].tolist() if len(order) else []   # a gather, not a loop
    counts = n[order]
    digest = hashlib.blake2b(digest_size=6)
    joined = b"\0".join(ranked)
    if plain is None:
        plain = joined.count(b"\0") == max(len(ranked) - 1, 0)
    digest.update(joined)
    digest.update(b"\1")
    digest.update(counts.tobytes() if counts.dtype != object else ",".join(map(str, counts.tolist())).encode())
    rows = acc[order]
    nf = counts.astype(np.float64)
    return RatesSnapshot(
        snapshot_id=f"b{first}-{last}-{digest.hexdigest()}" + (f"-u{untracked}" if untracked else ""),
        start=start, end=now, window_seconds=span,
        total_arrivals=(int(sum(counts.tolist())) if counts.dtype == object else int(counts.sum())) + untracked,
        untracked_arrivals=untracked,
        keys=(tuple(joined.decode().split("\0")) if plain and ranked else tuple(k.decode() for k in ranked)),
        rates=tuple((nf / span).tolist()),
        mean_prompt_tokens=tuple((rows[:, 1].astype(np.float64) / nf).tolist()),
        mean_prefix_tokens=tuple((rows[:, 2].astype(np.float64) / nf).tolist()),
        key_ids=order.astype(np.int64) if key_space else None, key_space=key_space,
    )


def _by_count_then_rank(live: np.ndarray, n: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """`live` ordered by count desc, then rank asc (ranks distinct): one int64 sort key when it
    fits, else np.lexsort (the same order; one sort instead of lexsort's two passes)."""
    if not len(live):
        return live
    top, width = int(n.max()), int(rank.max()) + 1
    if int(n.min()) < 0 or (top + 1) * width >= 2**62:
        return live[np.lexsort((rank, -n))]
    return live[np.argsort((top - n) * width + rank)]


CACHE_COUNTER_LIMIT = 2**62     # a lifetime cache counter stops here (Redis HINCRBY fails at 2**63)


def cap_new_keys(counts: dict[str, list[int]], present, have: int, cap: int) -> tuple[dict[str, list[int]], int]:
    """Which of a bucket write's keys get their own counts: keys already in the bucket, and new
    ones (in order) while the bucket holds fewer than `cap` keys (0: no cap); returns those and
    the arrivals of the rest (the untracked total). `present(key)` says if a key is in it."""
    if not cap:
        return counts, 0
    kept, untracked = {}, 0
    for key, row in counts.items():
        if present(key):
            kept[key] = row
        elif have < cap:
            kept[key] = row
            have += 1
        else:
            untracked += row[0]
    return kept, untracked


def counters(rows: dict[str, list[int]]) -> dict[str, CacheCounters]:
    """replica -> [prompt, cached, requests, completed, completion tokens] -> CacheCounters, replicas
    in id order."""
    return {r: CacheCounters(*v) for r, v in sorted(rows.items())}
