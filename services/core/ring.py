"""The consistent-hash ring and the stable hash every ring, policy and plan shares.

A ring places `vnodes` points per replica on a 64-bit circle (ketama-style, Karger et al.,
"Consistent hashing and random trees", STOC 1997); a key belongs to the first point at or
after its hash. Knobs: `vnodes` (160, ketama's default: more points, smoother shares) and
`salt` (an independent ring over the same replicas). Hashing is blake2b, not Python's
`hash()`, which is salted per process and would break determinism across runs and between
dispatchers.

It lives below the policies because the planning core (prefixes.py, replan.py) places keys on
the same ring the policies route on; importing it from policies/ ran the package's
`__init__` (and cacheroute.py, which imports prefixes.py) mid-import.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Iterator

_KEY_CACHE_LIMIT = 1 << 20


def stable_hash(text: str, salt: int = 0) -> int:
    """64-bit hash of `text`, identical in every process."""
    data = f"{salt}:{text}".encode() if salt else text.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class Ring:
    """Consistent-hash ring with `vnodes` points per replica (ketama-style)."""

    def __init__(self, replicas: int, vnodes: int = 160, salt: int = 0):
        if replicas < 1 or vnodes < 1:
            raise ValueError("a ring needs replicas >= 1 and vnodes >= 1")
        points = sorted((stable_hash(f"replica-{r}#{v}", salt), r)
                        for r in range(replicas) for v in range(vnodes))
        self.replicas = replicas
        self._hashes = [h for h, _ in points]
        self._owners = [r for _, r in points]
        self._salt = salt
        self._start: dict[str, int] = {}

    def start(self, key: str) -> int:
        """Ring position of the first point at or after the key's hash."""
        pos = self._start.get(key)
        if pos is None:
            if len(self._start) >= _KEY_CACHE_LIMIT:
                self._start.clear()
            pos = bisect.bisect_left(self._hashes, stable_hash(key, self._salt)) % len(self._hashes)
            self._start[key] = pos
        return pos

    def walk(self, key: str) -> Iterator[int]:
        """Owners clockwise from the key, each replica once."""
        owners, n = self._owners, len(self._owners)
        pos, seen = self.start(key), set()
        for step in range(n):
            r = owners[(pos + step) % n]
            if r not in seen:
                seen.add(r)
                yield r
                if len(seen) == self.replicas:
                    return

    def first(self, key: str) -> int:
        return self._owners[self.start(key)]

    def distinct(self, key: str, k: int) -> tuple[int, ...]:
        """The first k distinct replicas clockwise from the key."""
        out = []
        for r in self.walk(key):
            out.append(r)
            if len(out) == k:
                break
        return tuple(out)
