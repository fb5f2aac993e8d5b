"""Compare reports: a markdown table and PNG plots from per-policy capacity sweeps
(`{policy: capacity_report(...)}`, see services.sim.runs). The plots need matplotlib, from the
`lab` extra (pip install 'cacheroute[lab]'); `cacheroute sim compare` checks for it first."""

from __future__ import annotations

import math
import os

import orjson


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def table(results: dict[str, dict]) -> str:
    """One row per policy: SLO capacity, then hit rate and p99 TTFT at each grid QPS."""
    grid = sorted({p["offered_qps"] for r in results.values() for p in r["points"]})
    slo = next(iter(results.values()))["slo_p99"] if results else 0.0
    head = ["policy", f"capacity (p99 <= {slo:g} s)"] + [f"hit @{q:g}" for q in grid] + [f"p99 s @{q:g}" for q in grid]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy, r in results.items():
        by_q = {p["offered_qps"]: p for p in r["points"]}
        cap = _fmt(r["capacity"], 0) + ("" if r["censored"] == "none" else f" ({r['censored']}-censored)")
        hits = [_fmt(by_q[q]["hit_rate"] * 100, 1) + "%" if q in by_q else "-" for q in grid]
        p99s = [_fmt(by_q[q]["ttft_p99"]) if q in by_q else "-" for q in grid]
        lines.append("| " + " | ".join([policy, cap] + hits + p99s) + " |")
    return "\n".join(lines) + "\n" + misses_table(results)


def misses_table(results: dict[str, dict]) -> str:
    """Where each policy's hit rate falls short of the infinite-cache bound, per grid QPS, in
    points (services.core.metrics.miss_accounting): first sight / first-on-replica / evicted /
    spilled. Empty when no point carries the accounting."""
    rows = []
    for policy, r in results.items():
        for p in sorted(r["points"], key=lambda p: p["offered_qps"]):
            m = p.get("misses")
            if m:
                rows.append(f"| {policy} | {p['offered_qps']:g} | {m['bound'] * 100:.1f}% | {m['hit_rate'] * 100:.1f}% | "
                            + " | ".join(f"{m[k] * 100:.2f}" for k in ("first_sight", "first_on_replica",
                                                                      "evicted", "spilled")) + " |")
    if not rows:
        return ""
    head = ("\nMisses against the infinite-cache bound (points of hit rate):\n\n"
            "| policy | QPS | bound | hit | first sight | first on replica | evicted | spilled |\n"
            "|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def write(results: dict[str, dict], out: str) -> list[str]:
    """results.json, table.md and three plots into `out`; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    path = os.path.join(out, "results.json")
    with open(path, "wb") as f:
        f.write(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    paths.append(path)
    path = os.path.join(out, "table.md")
    with open(path, "w") as f:
        f.write(table(results))
    paths.append(path)

    slo = next(iter(results.values()))["slo_p99"] if results else None
    for name, field, ylabel, scale in (("p99_ttft_vs_qps.png", "ttft_p99", "p99 TTFT (s)", 1.0),
                                       ("hit_rate_vs_qps.png", "hit_rate", "hit rate (%)", 100.0)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy, r in results.items():
            pts = sorted(r["points"], key=lambda p: p["offered_qps"])
            ys = [p[field] * scale if p[field] is not None else math.nan for p in pts]
            ax.plot([p["offered_qps"] for p in pts], ys, marker="o", label=policy)
        if field == "ttft_p99" and slo:
            ax.axhline(slo, color="grey", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
            ax.set_yscale("log")
        ax.set_xlabel("offered QPS")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    # per-replica load at the highest grid QPS, replicas sorted by load
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, r in results.items():
        top = max(r["points"], key=lambda p: p["offered_qps"])
        served = sorted(top["served_per_replica"], reverse=True)
        mean = sum(served) / len(served) if served and sum(served) else 1.0
        ax.plot(range(len(served)), [s / mean for s in served], marker=".", label=f"{policy} @{top['offered_qps']:g}")
    ax.set_xlabel("replica (sorted by load)")
    ax.set_ylabel("requests served / mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "replica_load.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
