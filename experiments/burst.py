"""(d) burstiness: one table over the arrival models run on the same grid (docs/experiments.md (d)).

For each model (burst-poisson, burst-mmpp, burst-azure) and policy: the SLO capacity on the
nominal grid, the offered rate the measured window [60 s, 150 s) actually saw at the capacity
and at the first failing point (an MMPP or a replayed trace does not offer its nominal mean over
a 90 s window), the highest window rate of any passing point and the lowest of any failing one,
and p99 TTFT at chosen points. `--points` lists every point as nominal (window) p99.

  .venv/bin/python -m experiments.burst
"""

from __future__ import annotations

import sys

from experiments.run import load

MODELS = ("burst-poisson", "burst-mmpp", "burst-azure")
P99_AT = (100.0, 150.0, 250.0, 275.0)


def table(models=MODELS, p99_at=P99_AT) -> str:
    head = ["arrivals", "policy", "capacity (QPS)", "window QPS at capacity / first fail",
            "highest window QPS passed / lowest failed"]
    head += [f"p99 s @{q:g}" for q in p99_at]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        res = load(model)
        if not res:
            continue
        for policy, row in res.items():
            pts = {p["offered_qps"]: p for p in row["points"]}
            grid = sorted(pts)
            cap, fail = None, None
            for q in grid:
                p99 = pts[q]["ttft_p99"]
                if p99 is None or p99 > row["slo_p99"]:
                    fail = q
                    break
                cap = q
            window = " / ".join("-" if q is None else f"{pts[q]['qps']:.0f}" for q in (cap, fail))
            ok = [p["qps"] for p in pts.values() if p["ttft_p99"] is not None and p["ttft_p99"] <= row["slo_p99"]]
            bad = [p["qps"] for p in pts.values() if p["ttft_p99"] is None or p["ttft_p99"] > row["slo_p99"]]
            span = f"{max(ok):.0f}" if ok else "-"
            span += f" / {min(bad):.0f}" if bad else " / -"
            cap_txt = f"< {grid[0]:g}" if cap is None else (f"≥ {cap:g}" if fail is None else f"{cap:g}")
            cells = [model.removeprefix("burst-"), policy, cap_txt, window, span]
            for q in p99_at:
                p = pts.get(q)
                cells.append("-" if p is None else ("inf" if p["ttft_p99"] is None else f"{p['ttft_p99']:.2f}"))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def points(models=MODELS) -> str:
    lines = []
    for model in models:
        for policy, row in (load(model) or {}).items():
            cells = [f"{p['offered_qps']:g} ({p['qps']:.0f}) " + ("inf" if p["ttft_p99"] is None else f"{p['ttft_p99']:.2f}")
                     for p in row["points"]]
            lines.append(f"- {model} {policy}: " + ", ".join(cells))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(points() if "--points" in sys.argv[1:] else table())
