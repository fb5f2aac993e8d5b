"""Session-aware cold tail: cacheroute with a P2C cold tail (the paper's) vs a CHWBL cold tail,
next to Flat-LB and the peers, on the flagship and both Mooncake traces.

  .venv/bin/python -m experiments.beyond.coldtail [--sources a,b] [--policies flat,sticky,...]

Writes experiments/results/beyond/coldtail.json (rows run earlier and not named here stay) and
prints a markdown table: per source and policy, SLO capacity (censoring), hit rate and p99 at a
reference QPS of the grid. `--policies ""` re-runs only the two cacheroute variants.
"""

from __future__ import annotations

import argparse
import sys
import time

from experiments.beyond.common import capacity, load, save, slim, source as source_spec, variant

VARIANTS = {"cacheroute+p2c-tail": ("cacheroute", {"cold": "p2c"}),
            "cacheroute+chwbl-tail": ("cacheroute", {"cold": "chwbl"})}
REFERENCE_QPS = {"flagship-k128": 100, "mooncake-conversation": 8, "mooncake-synthetic": 8}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", default="flagship-k128,mooncake-conversation,mooncake-synthetic")
    ap.add_argument("--policies", default="flat", help="peer policies run alongside the two variants")
    args = ap.parse_args(argv)
    out: dict[str, dict] = load("coldtail")
    for source in args.sources.split(","):
        base, grid, slo = source_spec(source)
        runs = dict(VARIANTS)
        runs.update({p: (p, {}) for p in args.policies.split(",") if p})
        out.setdefault(source, {})
        for label, (policy, knobs) in runs.items():
            t = time.time()
            rep = slim(capacity(variant(base, policy, **knobs), grid, slo))
            out[source][label] = rep
            print(f"{source} {label}: capacity {rep['capacity']} ({rep['censored']}) "
                  f"[{time.time() - t:.0f}s]", file=sys.stderr, flush=True)
        save("coldtail", out)
    sys.stdout.write(table(out))
    return 0


def table(out: dict) -> str:
    lines = []
    for source, runs in out.items():
        ref = REFERENCE_QPS.get(source)
        lines += [f"\n{source} (reference {ref} QPS)\n",
                  f"| policy | SLO capacity (QPS) | hit rate @{ref} | p99 @{ref} (s) |", "|---|---|---|---|"]
        for label, rep in runs.items():
            point = next((p for p in rep["points"] if p["offered_qps"] == ref), None)
            cap = f"{rep['capacity']:g}" + ("" if rep["censored"] == "none" else f" ({rep['censored']}-censored)")
            hit = f"{point['hit_rate']:.1%}" if point else "-"
            p99 = f"{point['ttft_p99']:.2f}" if point else "-"
            lines.append(f"| {label} | {cap} | {hit} | {p99} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
