"""How much of a Mooncake trace's reuse crosses keys (docs/experiments.md (f), "Prefix-aware plans").

For each trace: the ids used by more than one routing key (key = first two ids, as the loader's
default), and the infinite-cache hit split into reuse within one key, reuse of another key's
prefix beyond block 0, and block 0 alone (the conversation trace's universal system prompt).

    .venv/bin/python -m experiments.prefix_sharing [TRACE ...]
"""

from __future__ import annotations

import sys
from collections import defaultdict

import orjson

from experiments.run import MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC, data_path

DEFAULT = (MOONCAKE_CONVERSATION, MOONCAKE_SYNTHETIC)          # under $CACHEROUTE_DATA, resolved in main


def sharing(path: str, key_ids: int = 2) -> dict:
    rows = sorted((orjson.loads(line) for line in open(path, "rb") if line.strip()), key=lambda r: r["timestamp"])
    owner: dict[int, tuple] = {}
    users: dict[int, set] = defaultdict(set)
    total = same = other = root = 0
    for r in rows:
        ids, key, prompt = r["hash_ids"], tuple(r["hash_ids"][:key_ids]), r["input_length"]
        n = 0
        while n < len(ids) and ids[n] in owner:
            n += 1
        hit = min(512 * n, prompt)
        total += prompt
        if n == 1:
            root += hit
        elif n > 1:
            if owner[ids[n - 1]] == key:
                same += hit
            else:
                other += hit
        for i in ids:
            owner.setdefault(i, key)
            users[i].add(key)
    shared = sum(1 for keys in users.values() if len(keys) > 1)
    return {"trace": path, "requests": len(rows), "ids": len(users), "ids_shared_by_keys": shared,
            "hit_within_key": same / total, "hit_across_keys": other / total, "hit_block0_only": root / total}


def main(argv: list[str] | None = None) -> int:
    for path in (argv if argv else DEFAULT):
        print(orjson.dumps(sharing(data_path(path))).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
