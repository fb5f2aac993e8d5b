"""Markdown tables for docs/experiments.md "Beyond the paper" from experiments/results/beyond/*.json.

  .venv/bin/python -m experiments.beyond.summarize
"""

from __future__ import annotations

import math
import sys

from experiments.beyond.common import load


def cap(r: dict) -> str:
    c = r["capacity"]
    return f"{c:g}" + {"none": "", "right": " (right-censored)", "left": " (left-censored)"}[r["censored"]]


def at(r: dict, qps: float, field: str, fmt: str) -> str:
    p = next((p for p in r["points"] if p["offered_qps"] == qps), None)
    if p is None or p.get(field) is None:
        return "-"
    v = p[field]
    return "inf" if isinstance(v, float) and math.isinf(v) else format(v, fmt)


def coldtail() -> str:
    out = []
    ref = {"flagship-k128": 100, "mooncake-conversation": 8, "mooncake-synthetic": 8}
    for source, runs in load("coldtail").items():
        q = ref[source]
        out += [f"\n{source}:\n", f"| policy | capacity (QPS) | hit @{q} | p99 s @{q} |", "|---|---|---|---|"]
        out += [f"| {k} | {cap(r)} | {at(r, q, 'hit_rate', '.1%')} | {at(r, q, 'ttft_p99', '.2f')} |"
                for k, r in runs.items()]
    return "\n".join(out)


def gated(name: str) -> str:
    out = ["| workload | flat | cacheroute | cacheroute-gated | gated / flat | planned share of gates (per point) |",
           "|---|---|---|---|---|---|"]
    for source, arms in load(name).items():
        f, c, g = arms["flat"], arms["cacheroute"], arms["cacheroute-gated"]
        ratio = f"{g['capacity'] / f['capacity']:.2f}" if f["capacity"] else "-"
        shares = ", ".join(f"{p['offered_qps']:g}: {p['planned_share']:.2f}" for p in g["points"])
        out.append(f"| {source} | {cap(f)} | {cap(c)} | {cap(g)} | {ratio} | {shares} |")
    return "\n".join(out)


def repair() -> str:
    d = load("repair")
    out = ["| arm | hit before | hit [75, 90) | p99 s [75, 90) | hit [135, 165) | p99 s [135, 165) | "
           "served by r7 in [135, 165) | churn at failure | churn first plan after return | lost |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for label, a in d["arms"].items():
        at_fail = next((p["churn"] for p in a["plans"] if p["at"] == d["down"]), None)
        after = next((p["churn"] for p in a["plans"] if p["at"] > d["back"]), None)
        out.append(f"| {label} | {a['before']['hit_rate']:.1%} | {a['after_failure']['hit_rate']:.1%} | "
                   f"{a['after_failure']['ttft_p99']:.2f} | {a['after_return']['hit_rate']:.1%} | "
                   f"{a['after_return']['ttft_p99']:.2f} | {a['served_on_returned_first_30s']} | "
                   f"{'-' if at_fail is None else format(at_fail, '.1%')} | "
                   f"{'-' if after is None else format(after, '.1%')} | {a['whole']['failed']} |")
    return "\n".join(out)


def admission() -> str:
    d = load("admission")
    out = ["| arm | capacity (QPS) | " + " | ".join(f"hit / p99 s @{p['offered_qps']:g}"
                                                   for p in d["arms"]["rate"]["points"]) + " |",
           "|---|---|" + "---|" * len(d["arms"]["rate"]["points"])]
    for arm, r in d["arms"].items():
        cells = [f"{p['hit_rate']:.1%} / {p['ttft_p99']:.2f}" for p in r["points"]]
        cells += ["-"] * (len(d["arms"]["rate"]["points"]) - len(cells))
        out.append(f"| {arm} | {cap(r)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    for title, fn in (("cold tail", coldtail), ("gated (p2c tail)", lambda: gated("gated")),
                      ("gated (chwbl tail)", lambda: gated("gated-chwbl")), ("repair", repair),
                      ("admission", admission)):
        try:
            body = fn()
        except (KeyError, FileNotFoundError, ZeroDivisionError, StopIteration) as exc:
            body = f"(no result: {exc!r})"
        sys.stdout.write(f"\n### {title}\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
