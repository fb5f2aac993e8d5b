"""A plan table in columns: bytes per key, not a Python object per key.

`ColumnarTable` is a read-only Mapping key -> tuple of replica indices (what `Plan.table` is
everywhere), stored as a handful of numpy arrays. For n keys in table order:

    keys      bytes          the UTF-8 key bytes back to back
    key_offs  uint32[n+1]    key i is keys[key_offs[i]:key_offs[i+1]]  (uint64 past 4 GiB)
    row_offs  uint32[n+1]    key i's replicas are members[row_offs[i]:row_offs[i+1]]
    members   uint16[m]      replica indices (a plan lists at most 65,535 replicas)
    hashes    int64[n]       Python's hash() of each key, sorted
    order     uint32[n]      the row of each sorted hash

Cost: 22 (+ <= 4 of range index) + 2 x replicas + len(key) bytes per key (a dict of tuples costs ~250). `ColumnarRates`
adds 8 (float64) on the same index.

Lookup (`get`, the dispatcher's hot path): hash the key, bisect the sorted hashes within
the key's range of the hash space (`buckets`: the first sorted hash of each of ~n ranges, so
a C bisect over a memoryview of a few entries), then compare the key's UTF-8 bytes
with the stored ones. Equal hashes of different keys (a 64-bit collision) are walked in
order, so a collision costs one more comparison and can never return another key's row.
Why the key bytes and not a 128-bit hash: the table must keep them anyway (iteration,
re-encoding), so comparing them costs no memory, and correctness rests on no hash at all.
Why Python's hash: the index lives in one process only; str hashes are SipHash, salted per
process (a client cannot craft keys that collide), computed in C and cached on the str.

Building validates as it goes (ValueError, one line): keys valid UTF-8 and distinct, every
row non-empty, distinct indices below the replica count. It is numpy apart from hashing
(chunks of keys decoded to str and hashed, so no million str objects live at once): a
dispatcher does it in a worker thread, off its event loop.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from typing import Iterator

import numpy as np

CHUNK = 1 << 16                 # keys decoded at a time while hashing or iterating
MAX_REPLICAS = 1 << 16          # replica indices are uint16
MAX_ROW = 255                   # replicas per key on the wire (uint8 counts)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    total = int(lengths.sum(dtype=np.int64)) if lengths.size else 0
    offs = np.zeros(lengths.size + 1, dtype=np.uint32 if total < 1 << 32 else np.uint64)
    np.cumsum(lengths, out=offs[1:])
    return offs


def _key_chunks(keys: bytes, offs: np.ndarray) -> Iterator[list[str]]:
    """The keys as str, CHUNK at a time (ValueError for bytes that are not UTF-8)."""
    n = offs.size - 1
    text = keys.decode("ascii") if keys.isascii() else None
    for c in range(0, n, CHUNK):
        o = offs[c:c + CHUNK + 1].tolist()
        if text is not None:
            yield [text[a:b] for a, b in itertools.pairwise(o)]
        else:
            try:
                yield [keys[a:b].decode("utf-8") for a, b in itertools.pairwise(o)]
            except UnicodeDecodeError as exc:
                raise ValueError(f"plan key bytes are not UTF-8: {exc.reason}") from None


def _key_hashes(keys: bytes, offs: np.ndarray) -> np.ndarray:
    """Python's hash() of each key (ValueError for bytes that are not UTF-8). Keys without a
    NUL byte (all real ones) are joined by NULs once (numpy), and each CHUNK of them becomes
    str objects by one decode and one split, in C: per-key slicing in Python was most of a
    million-key decode (~0.4 CPU s of ~1.3)."""
    n = offs.size - 1
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    if keys.find(b"\0") >= 0:
        done = 0
        for chunk in _key_chunks(keys, offs):
            out[done:done + len(chunk)] = np.fromiter(map(hash, chunk), dtype=np.int64, count=len(chunk))
            done += len(chunk)
        return out
    starts = offs.astype(np.int64) + np.arange(n + 1, dtype=np.int64)    # key i's first byte, NULs between
    buf = np.zeros(len(keys) + n, dtype=np.uint8)
    put = np.ones(buf.size, dtype=bool)
    put[starts[1:] - 1] = False
    buf[put] = np.frombuffer(keys, dtype=np.uint8)
    joined = buf.tobytes()
    del buf, put
    for c in range(0, n, CHUNK):
        e = min(n, c + CHUNK)
        try:
            text = joined[starts[c]:starts[e] - 1].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"plan key bytes are not UTF-8: {exc.reason}") from None
        out[c:e] = np.fromiter(map(hash, text.split("\0")), dtype=np.int64, count=e - c)
    return out


class ColumnarTable(Mapping):
    __slots__ = ("_keys", "_koffs", "_roffs", "_members", "_hashes", "_order", "_n",
                 "_hv", "_ov", "_kv", "_rv", "_mv", "_shift", "_buckets", "_bv")

    def __init__(self, keys: bytes, key_offs: np.ndarray, row_offs: np.ndarray, members: np.ndarray,
                 hashes: np.ndarray, order: np.ndarray) -> None:
        """Internal: use from_columns / from_mapping (they validate and index)."""
        self._keys, self._koffs, self._roffs, self._members = keys, key_offs, row_offs, members
        self._hashes, self._order, self._n = hashes, order, key_offs.size - 1
        # memoryviews: indexing one returns a Python int in C, ~5x faster than a numpy scalar
        self._hv, self._ov = memoryview(hashes), memoryview(order)
        self._kv, self._rv, self._mv = memoryview(key_offs), memoryview(row_offs), memoryview(members)
        # the first sorted hash of each of 2^bits ranges of the hash space (about one key per
        # range, at most 2^20 ranges: <= 4 bytes per key), so a lookup bisects a few entries
        bits = max(1, min(20, int(self._n).bit_length()))
        self._shift = 64 - bits
        # range of each sorted hash (its top bits, sign flipped: the ranges in hash order),
        # counted: buckets[k] = hashes below range k, as a searchsorted of the edges would give
        ranges = (hashes.view(np.uint64) ^ np.uint64(1 << 63)) >> np.uint64(self._shift)
        self._buckets = np.zeros((1 << bits) + 1, dtype=np.uint32)
        np.cumsum(np.bincount(ranges.astype(np.intp), minlength=1 << bits), out=self._buckets[1:])
        self._bv = memoryview(self._buckets)

    # ------------------------------------------------------------ building

    @classmethod
    def from_columns(cls, keys: bytes, key_lengths: np.ndarray, counts: np.ndarray, members: np.ndarray,
                     replicas: int) -> "ColumnarTable":
        """Validate and index n keys: key_lengths[i] bytes of `keys` and counts[i] entries of
        `members` (indices below `replicas`) per key, in table order."""
        n = key_lengths.size
        if counts.size != n:
            raise ValueError(f"plan columns: {n} keys but {counts.size} replica counts")
        if int(key_lengths.sum(dtype=np.int64)) != len(keys):
            raise ValueError(f"plan columns: key lengths add up to {int(key_lengths.sum())}, "
                             f"not the {len(keys)} key bytes")
        if int(counts.sum(dtype=np.int64)) != members.size:
            raise ValueError(f"plan columns: replica counts add up to {int(counts.sum())}, "
                             f"not the {members.size} replica indices")
        if n and int(counts.min()) < 1:
            i = int(np.argmin(counts))
            raise ValueError(f"plan row {i} has no replicas")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"a columnar plan needs 1..{MAX_REPLICAS} replicas, got {replicas}")
        if members.size and int(members.max()) >= replicas:
            raise ValueError(f"plan row has a replica index {int(members.max())} >= {replicas}")
        multi = counts > 1
        if multi.any():    # distinct within each row: (row, member) pairs are unique
            rows = np.repeat(np.arange(n, dtype=np.int64), counts)
            sel = np.repeat(multi, counts)
            pairs = rows[sel] * replicas + members[sel].astype(np.int64)
            pairs.sort()       # a sort and a neighbour test: ~10x cheaper than np.unique here
            if pairs.size > 1 and bool((pairs[1:] == pairs[:-1]).any()):
                raise ValueError("plan row repeats a replica index")
        key_offs = _offsets(key_lengths)
        return cls._indexed(keys, key_offs, _offsets(counts), members.astype(np.uint16, copy=False),
                            _key_hashes(keys, key_offs))

    @classmethod
    def _indexed(cls, keys: bytes, key_offs: np.ndarray, row_offs: np.ndarray, members: np.ndarray,
                 row_hashes: np.ndarray) -> "ColumnarTable":
        # not a stable sort: rows of equal hashes are walked whatever their order (`get`)
        order = np.argsort(row_hashes).astype(np.uint32)
        hashes = row_hashes[order]
        table = cls(keys, key_offs, row_offs, members, hashes, order)
        same = np.flatnonzero(hashes[1:] == hashes[:-1])
        if same.size:          # equal hashes: distinct keys (a collision) or a repeated key
            for h in np.unique(hashes[same]):
                lo, hi = np.searchsorted(hashes, h, "left"), np.searchsorted(hashes, h, "right")
                got = [table._key_bytes(int(r)) for r in order[lo:hi]]
                if len(set(got)) != len(got):
                    dup = next(k for k in got if got.count(k) > 1)
                    raise ValueError(f"plan repeats the key {dup.decode('utf-8', 'replace')!r}")
        return table

    @classmethod
    def from_mapping(cls, table: Mapping[str, tuple[int, ...]], replicas: int) -> "ColumnarTable":
        """A columnar copy of a key -> replica indices mapping (checked like from_columns)."""
        if isinstance(table, ColumnarTable):
            return table
        encoded = [k.encode("utf-8") for k in table]
        rows = list(table.values())
        lengths = np.fromiter(map(len, encoded), dtype=np.uint32, count=len(encoded))
        counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(counts.sum()))
        if flat.size and (flat.min() < 0 or flat.max() >= replicas):
            raise ValueError(f"plan row has a replica index outside 0..{replicas - 1}")
        return cls.from_columns(b"".join(encoded), lengths, counts, flat.astype(np.uint16), replicas)

    # ------------------------------------------------------------ columns out

    @property
    def keys_blob(self) -> bytes:
        return self._keys

    @property
    def key_lengths(self) -> np.ndarray:
        return np.diff(self._koffs).astype(np.uint32)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self._roffs.astype(np.int64))

    @property
    def members(self) -> np.ndarray:
        return self._members

    @property
    def row_offsets(self) -> np.ndarray:
        """Key i's replicas are members[row_offsets[i]:row_offsets[i + 1]]."""
        return self._roffs

    def key_at(self, row: int) -> str:
        return self._key_bytes(row).decode("utf-8")

    def max_row(self) -> int:
        return int(np.diff(self._roffs).max()) if self._n else 0

    def row_hashes(self) -> np.ndarray:
        out = np.empty_like(self._hashes)
        out[self._order] = self._hashes
        return out

    def nbytes(self) -> int:
        return len(self._keys) + sum(a.nbytes for a in (self._koffs, self._roffs, self._members, self._hashes,
                                                        self._order, self._buckets))

    def remap(self, moved: np.ndarray) -> "ColumnarTable":
        """The table with replica i renamed moved[i]; members mapped to -1 are dropped, and a
        key left with none leaves the table (the dispatcher's re-indexing, vectorised)."""
        local = np.asarray(moved, dtype=np.int64)[self._members]
        keep = local >= 0
        if keep.all() or not self._n:
            return ColumnarTable(self._keys, self._koffs, self._roffs, local.astype(np.uint16),
                                 self._hashes, self._order)
        counts = np.add.reduceat(keep.astype(np.int64), self._roffs[:-1].astype(np.int64))
        rows = counts > 0
        members = local[keep].astype(np.uint16)
        if rows.all():
            return ColumnarTable(self._keys, self._koffs, _offsets(counts), members, self._hashes, self._order)
        lengths = np.diff(self._koffs.astype(np.int64))
        blob = np.frombuffer(self._keys, dtype=np.uint8)[np.repeat(rows, lengths)].tobytes()
        return ColumnarTable._indexed(blob, _offsets(lengths[rows]), _offsets(counts[rows]), members,
                                      self.row_hashes()[rows])

    # ------------------------------------------------------------ lookup

    def _key_bytes(self, row: int) -> bytes:
        return self._keys[self._kv[row]:self._kv[row + 1]]

    def find(self, key: object) -> int:
        """The row of `key`, or -1."""
        if not isinstance(key, str):
            return -1
        h = hash(key)
        hv, bv = self._hv, self._bv
        b = (h + 0x8000000000000000) >> self._shift
        i = bisect.bisect_left(hv, h, bv[b], bv[b + 1])
        if i == self._n or hv[i] != h:
            return -1
        try:
            kb = key.encode("utf-8")
        except UnicodeEncodeError:           # lone surrogates: never a stored key
            return -1
        kv, keys, n = self._kv, self._keys, self._n
        while i < n and hv[i] == h:
            r = self._ov[i]
            a = kv[r]
            if kv[r + 1] - a == len(kb) and keys.startswith(kb, a):
                return r
            i += 1
        return -1

    def get(self, key, default=None):
        """The hot path: `find` inlined (a method call is a tenth of the lookup)."""
        if not isinstance(key, str):
            return default
        h = hash(key)
        hv, bv = self._hv, self._bv
        b = (h + 0x8000000000000000) >> self._shift
        i = bisect.bisect_left(hv, h, bv[b], bv[b + 1])
        n = self._n
        if i == n or hv[i] != h:
            return default
        try:
            kb = key.encode("utf-8")
        except UnicodeEncodeError:
            return default
        kv, keys, ov = self._kv, self._keys, self._ov
        while i < n and hv[i] == h:
            r = ov[i]
            a = kv[r]
            if kv[r + 1] - a == len(kb) and keys.startswith(kb, a):
                rv = self._rv
                return tuple(self._mv[rv[r]:rv[r + 1]])
            i += 1
        return default

    def __getitem__(self, key) -> tuple[int, ...]:
        r = self.find(key)
        if r < 0:
            raise KeyError(key)
        rv = self._rv
        return tuple(self._mv[rv[r]:rv[r + 1]])

    def __contains__(self, key) -> bool:
        return self.find(key) >= 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    # ------------------------------------------------------------ iteration (table order)

    def __iter__(self) -> Iterator[str]:
        for chunk in _key_chunks(self._keys, self._koffs):
            yield from chunk

    def _rows(self) -> Iterator[tuple[int, ...]]:
        roffs = self._roffs
        for c in range(0, self._n, CHUNK):
            offs = roffs[c:c + CHUNK + 1]
            o = offs.tolist()
            flat = self._members[o[0]:o[-1]].tolist()
            widths = np.diff(offs)
            if widths.size and widths.min() == widths.max():      # every row as wide: tuples in C
                yield from zip(*[iter(flat)] * int(widths[0]))
                continue
            base = o[0]
            yield from (tuple(flat[a - base:b - base]) for a, b in itertools.pairwise(o))

    def keys(self) -> KeysView:
        return KeysView(self)

    def values(self) -> "_Values":
        return _Values(self)

    def items(self) -> "_Items":
        return _Items(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ColumnarTable) and other is self:
            return True
        return Mapping.__eq__(self, other)

    __hash__ = None      # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ColumnarTable({self._n} keys, {self.nbytes()} bytes)"

    def __reduce__(self):
        return (ColumnarTable, (self._keys, self._koffs, self._roffs, self._members, self._hashes, self._order))


class _Values(ValuesView):
    def __iter__(self):
        return self._mapping._rows()


class _Items(ItemsView):
    def __iter__(self):
        return zip(iter(self._mapping), self._mapping._rows())


class _ArrayRatesBase(Mapping):
    """What the two array-backed rate mappings share: `table` (iterated in its order) and
    `values_` (its rates, float64, in that order); subclasses say how a key is looked up."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.values_)

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def items(self) -> ItemsView:
        return _RateItems(self)

    def values(self) -> ValuesView:
        return _RateValues(self)

    __hash__ = None      # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.values_)} keys)"


class ColumnarRates(_ArrayRatesBase):
    """key -> rate over a ColumnarTable's index: 8 bytes per key (float64, table order)."""

    __slots__ = ("table", "values_", "_vv")

    def __init__(self, table: ColumnarTable, rates: np.ndarray) -> None:
        if rates.size != len(table):
            raise ValueError(f"plan columns: {len(table)} keys but {rates.size} rates")
        self.table = table
        self.values_ = np.ascontiguousarray(rates, dtype=np.float64)
        self._vv = memoryview(self.values_)

    def get(self, key, default=None):
        r = self.table.find(key)
        return default if r < 0 else self._vv[r]

    def __getitem__(self, key) -> float:
        r = self.table.find(key)
        if r < 0:
            raise KeyError(key)
        return self._vv[r]

    def __contains__(self, key) -> bool:
        return self.table.find(key) >= 0


class _RateItems(ItemsView):
    def __iter__(self):
        return zip(iter(self._mapping.table), self._mapping.values_.tolist())


class _RateValues(ValuesView):
    def __iter__(self):
        return iter(self._mapping.values_.tolist())


class ArrayRates(_ArrayRatesBase):
    """key -> rate as one float64 array in the order of `table` (a plan's dict table, iterated in
    that order): what a builder hands its plan instead of a second dict of a million floats
    (~0.5 CPU s to build), since the planner reads a new plan's rates in order (the write step:
    the array itself). A lookup by key builds that dict once, on first use."""

    __slots__ = ("table", "values_", "_map")

    def __init__(self, table: Mapping[str, tuple[int, ...]], rates: np.ndarray) -> None:
        if rates.size != len(table):
            raise ValueError(f"plan rates: {len(table)} keys but {rates.size} rates")
        self.table = table
        self.values_ = np.ascontiguousarray(rates, dtype=np.float64)
        self.values_.flags.writeable = False
        self._map: dict[str, float] | None = None

    def _dict(self) -> dict[str, float]:
        if self._map is None:
            self._map = dict(zip(self.table, self.values_.tolist()))
        return self._map

    def get(self, key, default=None):
        return self._dict().get(key, default)

    def __getitem__(self, key) -> float:
        return self._dict()[key]

    def __contains__(self, key) -> bool:
        return key in self.table
