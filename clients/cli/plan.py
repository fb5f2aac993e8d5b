"""`cacheroute plan build|show|diff`: build a plan from a rates file, inspect and compare plans.

    cacheroute plan build --rates RATES.csv --replicas R --q-cap Q --warm-slots W
                          [--previous PLAN.json] [--version N] --out PLAN.json
    cacheroute plan show PLAN.json
    cacheroute plan diff OLD.json NEW.json [--top N]

RATES.csv has a header with columns `key` and `rate` (req/s; others are ignored). `--replicas`
is a count N (replica ids r0..r{N-1}) or a comma-separated list of ids. Each command prints one
line of JSON on stdout; bad input exits 2 with one line naming the problem (and the file line).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import time

import numpy as np
import orjson

from clients.cli import CliError
from services import model
from services.wire.codec import plan_to_dict, read_plan_file, write_plan_file
from services.core.planning import build_plan, plan_diff


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="build, show and diff routing plans",
                       description="Build a routing plan from a rates file; show or compare plan files.")
    cmds = p.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=True)

    b = cmds.add_parser("build", help="size, admit and place keys (LPT) into a plan file")
    b.add_argument("--rates", required=True, metavar="RATES.csv", help="CSV with header columns key,rate (req/s)")
    b.add_argument("--replicas", required=True, metavar="R", help="replica count N (ids r0..rN-1) or comma-separated ids")
    b.add_argument("--q-cap", required=True, type=float, metavar="Q", help="req/s one replica carries at the latency knee")
    b.add_argument("--warm-slots", required=True, type=int, metavar="W", help="prefixes one replica keeps warm")
    b.add_argument("--previous", metavar="PLAN.json", help="parent plan: sets parent, churn, and version = parent + 1")
    b.add_argument("--version", type=int, metavar="N", help="plan version (default 1, or previous + 1)")
    b.add_argument("--out", required=True, metavar="PLAN.json")
    b.set_defaults(func=run_build)

    s = cmds.add_parser("show", help="print a plan file's summary")
    s.add_argument("plan", metavar="PLAN.json")
    s.set_defaults(func=run_show)

    d = cmds.add_parser("diff", help="churn between two plan files (compared by replica id)")
    d.add_argument("old", metavar="OLD.json")
    d.add_argument("new", metavar="NEW.json")
    d.add_argument("--top", type=int, default=10, help="heaviest moved keys to list (default 10)")
    d.set_defaults(func=run_diff)


# ---------------------------------------------------------------------------------------------
# commands


def run_build(args: argparse.Namespace) -> int:
    replica_ids = parse_replicas(args.replicas)
    if not math.isfinite(args.q_cap) or args.q_cap <= 0:
        raise CliError(f"--q-cap must be a finite number > 0, got {args.q_cap}")
    if args.warm_slots < 1:
        raise CliError(f"--warm-slots must be >= 1, got {args.warm_slots}")
    previous = load_plan(args.previous) if args.previous else None
    version = args.version if args.version is not None else (previous.version + 1 if previous else 1)
    if version < 1:
        raise CliError(f"--version must be >= 1, got {version}")
    keys, rates = read_rates(args.rates)

    started = time.perf_counter()
    try:
        plan = build_plan(keys, rates, replica_ids, args.q_cap, args.warm_slots, version=version,
                          parent=previous, created_at=time.time())
    except ValueError as exc:
        raise CliError(str(exc)) from None
    seconds = time.perf_counter() - started
    try:
        write_plan_file(args.out, plan)
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror}") from None

    out = {"version": plan.version, "keys": plan.total_keys, "admitted": plan.admitted_keys,
           "admitted_rate_share": plan.admitted_rate_share, "imbalance": plan.predicted_imbalance,
           "build_seconds": round(seconds, 6)}
    if previous is not None:
        out["churn"] = plan.churn
        out["parent_version"] = plan.parent_version
    print_json(out)
    return 0


def run_show(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    data = plan_to_dict(plan)
    for bulky in ("table", "rates", "expected_load", "extra", "format", "prefixes"):
        data.pop(bulky)
    loads = plan.expected_load
    data["replicas"] = plan.replicas
    data["slots_used"] = sum(len(row) for row in plan.table.values())
    data["slots"] = plan.replicas * plan.warm_slots
    data["max_load"], data["min_load"] = max(loads), min(loads)
    data["multi_replica_keys"] = sum(1 for row in plan.table.values() if len(row) > 1)
    data["prefix_nodes"] = len(plan.prefixes)
    data["slots_used"] += sum(len(e.replicas) for e in plan.prefixes.values())
    top = sorted(plan.prefixes.items(), key=lambda item: (-item[1].rate, item[0]))[:10]
    data["top_prefixes"] = [{"prefix": name, "rate": e.rate, "tokens": e.tokens, "keys": e.keys,
                             "replicas": [plan.replica_ids[i] for i in e.replicas]} for name, e in top]
    if "available_hit_rate" in plan.extra:
        data["available_hit_rate"] = plan.extra["available_hit_rate"]
    print_json(data)
    return 0


def run_diff(args: argparse.Namespace) -> int:
    old, new = load_plan(args.old), load_plan(args.new)
    out = {"old_version": old.version, "new_version": new.version}
    out.update(plan_diff(old, new).summary(top=max(0, args.top)))
    print_json(out)
    return 0


# ---------------------------------------------------------------------------------------------
# input


def parse_replicas(spec: str) -> list[str]:
    spec = spec.strip()
    if spec.lstrip("-").isdigit():
        n = int(spec)
        if n < 1:
            raise CliError(f"--replicas must be >= 1, got {n}")
        return [f"r{i}" for i in range(n)]
    if any(not part.strip() for part in spec.split(",")):
        raise CliError(f"--replicas has an empty replica id: {spec!r}")
    try:
        return [r.id for r in model.parse_replicas(spec)]
    except ValueError as exc:
        raise CliError(f"--replicas: {exc}") from None


def load_plan(path: str):
    try:
        return read_plan_file(path)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from None


def read_rates(path: str) -> tuple[list[str], np.ndarray]:
    """Keys and rates from a `key,rate` CSV; CliError naming the file line on bad input."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            keys, raw, lines = _read_columns(path, csv.reader(f))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None
    except csv.Error as exc:
        raise CliError(f"{path}: malformed CSV: {exc}") from None

    try:
        rates = np.array(list(map(float, raw)), dtype=np.float64)
    except ValueError:
        i = next(i for i, text in enumerate(raw) if not _is_float(text))
        raise CliError(f"{path} line {lines(i)}: rate {raw[i]!r} is not a number") from None
    bad = ~np.isfinite(rates) | (rates < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise CliError(f"{path} line {lines(i)}: rate {raw[i]!r} must be finite and >= 0")
    if len(set(keys)) != len(keys):
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in first:
                raise CliError(f"{path} line {lines(i)}: duplicate key {key!r} (first on line {lines(first[key])})")
            first[key] = i
    return keys, rates


def _read_columns(path: str, reader):
    header = next(reader, None)
    if header is None:
        raise CliError(f"{path}: empty file, expected a header with columns key,rate")
    names = [h.strip().lstrip("\ufeff") for h in header]
    for column in ("key", "rate"):
        if column not in names:
            raise CliError(f"{path} line 1: missing column {column!r} (header is {','.join(names)!r})")
    ki, ri, width = names.index("key"), names.index("rate"), len(names)
    keys: list[str] = []
    raw: list[str] = []
    # file line of row i is anchor_line + (i - anchor_row) for the last anchor at or before i;
    # an anchor is added wherever blank lines or multi-line quoted fields break the count
    anchor_rows, anchor_lines = [0], [2]
    previous_line = 1
    for row in reader:
        line = reader.line_num
        if len(row) != width:
            if not row:
                continue  # blank line
            raise CliError(f"{path} line {line}: expected {width} fields, got {len(row)}")
        if not row[ki]:
            raise CliError(f"{path} line {line}: empty key")
        if line != previous_line + 1:
            anchor_rows.append(len(keys))
            anchor_lines.append(line)
        previous_line = line
        keys.append(row[ki])
        raw.append(row[ri])

    def line_of(i: int) -> int:
        a = bisect.bisect_right(anchor_rows, i) - 1
        return anchor_lines[a] + (i - anchor_rows[a])

    return keys, raw, line_of


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def print_json(obj: dict) -> None:
    print(orjson.dumps(obj).decode())
