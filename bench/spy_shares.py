"""Shares of a py-spy raw profile by function: inclusive (the function anywhere on the stack) and self
(the innermost frame), as percentages of one thread's samples.

The raw format (`py-spy record -f raw`, as bench/dispatcher_cpu_rates.py `--spy` writes it) is one line
per distinct stack: `thread (TID): NAME;frame;frame;... COUNT`, frames `function (file:line)`. A function
is named `function (file)`, lines dropped, and counted once per stack however often it recurs there.

    .venv/bin/python bench/spy_shares.py FILE [--thread MainThread] [--top 40]
"""

from __future__ import annotations

import argparse
import collections


def shares(lines, thread: str) -> tuple[int, collections.Counter, collections.Counter]:
    """(samples of `thread`, inclusive counts, self counts) from a raw profile's lines."""
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        if thread not in head or not frames:
            continue
        n = int(count)
        total += n
        names = [frame.split(":")[0] + ")" if " (" in frame else frame for frame in frames]
        for name in set(names):
            inclusive[name] += n
        own[names[-1]] += n
    return total, inclusive, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--thread", default="MainThread", help="the thread whose samples count (a substring)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.file) as f:
        total, inclusive, own = shares(f, args.thread)
    if not total:
        raise SystemExit(f"no samples of a thread named like {args.thread!r} in {args.file}")
    print(f"{total} samples of {args.thread}")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"--- {title}")
        for name, n in counts.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
