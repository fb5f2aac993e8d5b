"""Re-measure the stored compare points that had preemptions (issue 13's hit-rate fix).

The engine used to count a request's own chunks as prefix hits when it was re-admitted
after a preemption in the middle of its prefill; it now records cached tokens once, at the
first scheduling (services/core/engine.py, "Prefix hit"). The value only feeds the hit-rate
metric, so a point without preemptions is unchanged and a point with them changes in its hit
rate only: this script re-runs exactly those points with their stored arguments (q_cap as
stored), replaces them in results.json, keeps the old figure as `hit_rate_before_fix`, and
says whether p99 and the preemption count reproduced (they must, on unchanged code).

  .venv/bin/python -m experiments.rehit [NAME ...] [--jobs 2]
  .venv/bin/python -m experiments.rehit --summary      # markdown: what moved, per experiment

Rows tagged with an earlier code version (`cacheroute-unguarded`, `...-p2c-tail`) cannot be
re-run on this code; they are listed, not changed. A summary of every re-run point goes to
experiments/results/rehit.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from dataclasses import replace

import orjson

from experiments.run import COMPARE, RESULTS, load, resolve

# the Mooncake tables (f) first: they had the most preempted runs
ORDER = ("mooncake-conversation", "mooncake-synthetic", "flagship-k256", "low-reuse", "flagship-k128",
         "burst", "ablation", "flagship-k128-knee")


def _specs(name: str):
    from clients.cli import build_parser
    from clients.cli.sim import _spec

    argv = resolve([*COMPARE[name], "--out", "/dev/null"])
    args = build_parser().parse_args(argv)
    return lambda policy: _spec(args, policy)


def _run(job):
    from services.sim.runs import run_spec

    name, policy, spec = job
    return name, policy, run_spec(spec)


def _same(a, b) -> bool:
    """Equal p99s; a stored inf reads back as null."""
    inf = float("inf")
    return (inf if a is None else a) == (inf if b is None else b)


def summary_table(summary: dict) -> str:
    """Per experiment and policy: the re-run points' hit rate before -> after (p99 unchanged)."""
    lines = ["| experiment | policy | QPS: hit before -> after (preemptions) | p99 reproduced |", "|---|---|---|---|"]
    for name, rows in summary.items():
        for policy, pts in rows.items():
            if policy.startswith("_"):
                continue
            cells = ", ".join(f"{q}: {100 * e['hit_before']:.1f} -> {100 * e['hit_after']:.1f}% ({e['preemptions']})"
                              for q, e in sorted(pts.items(), key=lambda kv: float(kv[0])))
            ok = all(_same(e["p99_before"], e["p99_after"]) for e in pts.values())
            lines.append(f"| {name} | {policy} | {cells} | {'yes' if ok else 'NO'} |")
        skipped = rows.get("_not_rerun")
        if skipped:
            lines.append(f"| {name} | not re-run (earlier code) | {', '.join(skipped)} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from services.core.policies import POLICIES
    from services.sim import report

    ap = argparse.ArgumentParser(prog="experiments.rehit")
    ap.add_argument("names", nargs="*", default=list(ORDER))
    ap.add_argument("--jobs", type=int, default=2, choices=(1, 2))
    ap.add_argument("--summary", action="store_true", help="print what moved (from rehit.json) and exit")
    args = ap.parse_args(argv)
    summary_path = os.path.join(RESULTS, "rehit.json")
    summary = orjson.loads(open(summary_path, "rb").read()) if os.path.exists(summary_path) else {}
    if args.summary:
        sys.stdout.write(summary_table(summary))
        return 0
    pool = multiprocessing.get_context("spawn").Pool(args.jobs) if args.jobs > 1 else None
    try:
        for name in args.names:
            stored = load(name)
            spec_for = _specs(name)
            jobs, skipped = [], []
            for policy, row in stored.items():
                for p in row["points"]:
                    if not p.get("preemptions"):
                        continue
                    if policy not in POLICIES:
                        skipped.append(f"{policy}@{p['offered_qps']:g}")
                        continue
                    if "hit_rate_before_fix" in p:
                        continue        # already re-measured
                    spec = replace(spec_for(policy), qps=p["offered_qps"], q_cap=p.get("q_cap"))
                    jobs.append((name, policy, spec))
            sys.stderr.write(f"{name}: {len(jobs)} points to re-run; not re-runnable (earlier code): "
                             f"{', '.join(skipped) or 'none'}\n")
            mapper = pool.imap_unordered if pool is not None else map
            for _, policy, fresh in mapper(_run, jobs):
                row = stored[policy]
                i = next(k for k, p in enumerate(row["points"]) if p["offered_qps"] == fresh["offered_qps"])
                old = row["points"][i]
                same = _same(old["ttft_p99"], fresh["ttft_p99"]) and old["preemptions"] == fresh["preemptions"]
                fresh["hit_rate_before_fix"] = old["hit_rate"]
                row["points"][i] = fresh
                entry = {"hit_before": old["hit_rate"], "hit_after": fresh["hit_rate"],
                         "preemptions": fresh["preemptions"], "p99_reproduced": same,
                         "p99_before": old["ttft_p99"], "p99_after": fresh["ttft_p99"]}
                summary.setdefault(name, {}).setdefault(policy, {})[f"{fresh['offered_qps']:g}"] = entry
                sys.stderr.write(f"  {policy} @{fresh['offered_qps']:g}: hit {old['hit_rate']:.3f} -> "
                                 f"{fresh['hit_rate']:.3f} ({fresh['preemptions']} preemptions; "
                                 f"p99 {'same' if same else 'CHANGED'})\n")
                with open(os.path.join(RESULTS, name, "results.json"), "wb") as f:
                    f.write(orjson.dumps(stored, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
                with open(summary_path, "wb") as f:
                    f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
            summary.setdefault(name, {})["_not_rerun"] = skipped
            with open(summary_path, "wb") as f:
                f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
            report.write(stored, os.path.join(RESULTS, name))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
