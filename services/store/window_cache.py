"""The Redis store's cache of window sums: a window read re-fetches only the buckets whose
write token changed since its last read (services/store/keys.py, `P:{tb:IDX}:v`). A bucket
is its count hashes plus, once sealed (services/store/lua/seal.lua), its blob's keys and
packed counts; the two parts are summed per key."""

from __future__ import annotations

import secrets

import numpy as np


class BucketCache:
    """Per-bucket (n, pt, xt) columns as numpy arrays over one growing key index, tagged with
    the bucket's write token. Summing a window is one fancy-index add per bucket; the Python
    work per hash field is two C-level maps (key -> index, bytes -> int)."""

    LIMIT = 2**56    # columns above this fall back to Python ints (int64 must not overflow)
    GROWTH, SLACK = 4, 1024    # compact the key index beyond GROWTH x cached entries + SLACK

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.space = secrets.token_hex(8)        # names the ids of `index`: a new one when they change
        self._by_key: np.ndarray | None = None   # ids of the first `_sorted` index keys, bytewise order
        self._sorted = 0
        self._plain = True                       # no indexed key contains NUL (fixed-width sorting is exact)
        self.buckets: dict[int, tuple[bytes | None, np.ndarray, np.ndarray]] = {}   # idx -> token, ids, (m, 3)

    def fresh(self, idx: int, token: bytes) -> bool:
        entry = self.buckets.get(idx)
        return entry is not None and entry[0] == token

    def put(self, idx: int, token: bytes | None, n: dict, pt: dict, xt: dict,
            sealed: tuple[list[bytes], np.ndarray] | None = None) -> None:
        """Bucket `idx` as read under `token`: its count hashes, plus the sealed blob's keys and
        (m, 3) counts when it has one (a sealed bucket's hashes hold only late arrivals)."""
        keys = list(n)
        if list(pt) == keys and list(xt) == keys:   # written together, so normally aligned
            cols = [n.values(), pt.values(), xt.values()]
        else:
            keys = list(dict.fromkeys([*n, *pt, *xt]))
            cols = [[h.get(k, 0) for k in keys] for h in (n, pt, xt)]
        ints = [list(map(int, c)) for c in cols]
        big = any(c and max(c) >= self.LIMIT for c in ints)
        ids = self._ids(keys)
        values = np.array(ints, dtype=object if big else np.int64).T.reshape(len(keys), 3)
        if sealed is not None and len(sealed[0]):
            s_ids, s_values = self._ids(sealed[0]), sealed[1]
            if not len(ids):
                ids, values = s_ids, s_values
            else:       # sum the two parts per key
                both = np.concatenate((s_ids, ids))
                ids, inverse = np.unique(both, return_inverse=True)
                big = big or int(s_values.max(initial=0)) + int(values.max(initial=0)) >= self.LIMIT
                merged = np.zeros((len(ids), 3), dtype=object if big else np.int64)
                np.add.at(merged, inverse, np.concatenate((s_values.astype(merged.dtype), values.astype(merged.dtype))))
                values = merged
        self.buckets[idx] = (token, ids, values)

    def _ids(self, keys: list[bytes]) -> np.ndarray:
        """Ids of one bucket's (distinct) keys, new keys appended to the index."""
        index = self.index
        new = [k for k in keys if k not in index]
        if new:
            index.update(zip(new, range(len(index), len(index) + len(new))))
        return np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))

    def totals(self, idxs: range) -> dict[str, tuple[int, int, int]]:
        """Sums over the window's buckets, by key; buckets outside it are dropped."""
        keys, acc = self.columns(idxs)
        hit = np.flatnonzero(acc[:, 0] > 0)
        return {keys[i].decode(): row for i, row in zip(hit.tolist(), map(tuple, acc[hit].tolist()))}

    def columns(self, idxs: range) -> tuple[list[bytes], np.ndarray]:
        """Sums over the window's buckets: the key index and an (m, 3) array of (n, prompt,
        prefix) per key; buckets outside the window are dropped (one process reads one
        window, the planner's)."""
        for old in [i for i in self.buckets if i not in idxs]:
            del self.buckets[old]
        live = [self.buckets[i] for i in idxs if i in self.buckets]
        if len(self.index) > self.GROWTH * sum(len(ids) for _, ids, _ in live) + self.SLACK:
            self._compact()
            live = [self.buckets[i] for i in idxs if i in self.buckets]
        big = any(values.dtype == object for _, _, values in live)
        acc = np.zeros((len(self.index), 3), dtype=object if big else np.int64)
        for _, ids, values in live:
            acc[ids] += values          # ids are distinct within a bucket
        return list(self.index), acc

    def key_rank(self, keys: list[bytes]) -> np.ndarray | None:
        """rank[id]: each indexed key's position in bytewise order (`keys` = list(index)), kept
        between reads: keys added since the last call are sorted alone and merged in
        (searchsorted), so a steady read does not sort the whole window again. None when a key
        contains NUL (numpy's fixed-width bytes would not order it exactly)."""
        n = len(keys)
        if self._plain and n > self._sorted:
            fresh = keys[self._sorted:]
            if b"".join(fresh).find(b"\0") >= 0:
                self._plain = False
            else:
                new_ids = np.arange(self._sorted, n, dtype=np.int64)
                new_keys = np.array(fresh, dtype=bytes)
                by = np.argsort(new_keys, kind="stable")
                if self._by_key is None or not len(self._by_key):
                    self._by_key = new_ids[by]
                else:
                    old_keys = np.array(keys[:self._sorted], dtype=bytes)[self._by_key]
                    at = np.searchsorted(old_keys, new_keys[by], side="left")   # keys are distinct
                    self._by_key = np.insert(self._by_key, at, new_ids[by])
                self._sorted = n
        if not self._plain:
            return None
        rank = np.empty(n, dtype=np.int64)
        rank[self._by_key] = np.arange(n, dtype=np.int64)
        return rank

    def _compact(self) -> None:
        """Drop keys no cached bucket holds (keys churn; the index must not grow forever)."""
        self._by_key, self._sorted, self._plain = None, 0, True
        self.space = secrets.token_hex(8)        # the ids are renumbered below
        keys = list(self.index)
        used = sorted({int(i) for _, ids, _ in self.buckets.values() for i in ids.tolist()})
        remap = np.full(len(keys), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.index = {keys[i]: j for j, i in enumerate(used)}
        self.buckets = {b: (t, remap[ids], v) for b, (t, ids, v) in self.buckets.items()}
