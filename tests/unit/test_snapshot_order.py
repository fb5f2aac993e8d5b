"""The window snapshot's order and content (services/store/buckets.snapshot_columns) with a key
rank given: one int64 sort key and the NUL check on the ranked keys' join decide what the two
passes of np.lexsort and a join of every key decided (the code at f10362e, inlined below)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from services.model import RatesSnapshot
from services.store.buckets import snapshot_columns


def _old_snapshot(first, last, start, now, keys, acc, untracked=0, rank=None):
    span = max(now - start, 1e-9)
    n = acc[:, 0]
    live = np.flatnonzero(n > 0)
    live_keys = keys if len(live) == len(keys) else [keys[i] for i in live.tolist()]
    plain = b"".join(live_keys).find(b"\0") < 0
    if acc.dtype != object and plain and rank is not None:
        order = live[np.lexsort((rank[live], -n[live]))]
    elif acc.dtype != object and plain:
        order = live[np.lexsort((np.array(live_keys, dtype=bytes), -n[live]))] if live_keys else live
    else:
        order = np.array(sorted(live.tolist(), key=lambda i: (-int(n[i]), keys[i])), dtype=np.int64)
    ranked = np.array(keys, dtype=object)[order].tolist() if len(order) else []
    counts = n[order]
    digest = hashlib.blake2b(digest_size=6)
    joined = b"\0".join(ranked)
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
    )


def _window(n_keys: int, seed: int, big: bool = False):
    rng = np.random.default_rng(seed)
    keys = [f"t{i}-{'é' if i % 11 == 0 else ''}".encode() for i in rng.permutation(n_keys)]
    n = np.floor(rng.lognormal(0, 1.65, n_keys)).astype(np.int64)      # zeros: keys without arrivals
    if big:
        n[:3] = 2**61
    acc = np.stack([n, n * 2000, n * 7], axis=1)
    rank = np.argsort(np.argsort(np.array(keys, dtype=bytes), kind="stable"))
    return keys, acc, rank


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("big", [False, True])
def test_ranked_snapshot_equals_the_lexsort_one(seed, big):
    keys, acc, rank = _window(20_000, seed, big)
    for r in (rank, None):
        got = snapshot_columns(3, 33, 10.0, 300.0, keys, acc, 5, r)
        assert got == _old_snapshot(3, 33, 10.0, 300.0, keys, acc, 5, r)
    assert len(set(got.rates)) < len(got.rates) / 10       # the fixture has long ties to order


def test_empty_and_all_cold_windows():
    for keys, acc in (([], np.zeros((0, 3), dtype=np.int64)), ([b"a", b"b"], np.zeros((2, 3), dtype=np.int64))):
        rank = np.arange(len(keys), dtype=np.int64)
        assert snapshot_columns(0, 1, 0.0, 5.0, keys, acc, 0, rank) == _old_snapshot(0, 1, 0.0, 5.0, keys, acc, 0, rank)
