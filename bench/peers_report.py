"""bench/peers.py's output: the markdown table of a result, its plots (p99 TTFT vs offered
load; hit rate over time in 10 s bins for the drift, restart and kill workloads), and the
repeat aggregation (median of the repeats, their min-max spread). Pure apart from the PNGs."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from services.core.metrics import slo_capacity

SPREAD_FIELDS = ("ttft_p50", "ttft_p99", "hit_rate", "router_cpu_per_1k", "control_cpu_per_1k", "client_lag_p99",
                 "router_core_share", "max_share")
SERIES_WORKLOADS = ("drift", "restart", "kill")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _median(xs: list) -> Any:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def aggregate(reps: Sequence[dict]) -> dict:
    """One point from its repeats: the first repeat's fields, numeric headline figures replaced
    by the repeats' median, `spread` = [min, max] per figure, errors summed, every repeat kept."""
    if len(reps) == 1:
        return dict(reps[0], repeats=1)
    out = dict(reps[0])
    spread = {}
    for f in SPREAD_FIELDS:
        vals = [r.get(f) for r in reps]
        good = [v for v in vals if isinstance(v, (int, float)) and not math.isnan(v)]
        if good:
            out[f] = _median(good) if all(math.isfinite(v) for v in good) else max(good)
            spread[f] = [min(good), max(good)]
    for f in ("requests", "ok", "errors", "slo_errors"):
        if all(f in r for r in reps):
            out[f] = sum(r[f] for r in reps)
    if all(r.get("misses", {}).get("prompt_tokens") for r in reps):
        m0 = reps[0]["misses"]
        out["misses"] = dict(m0, hit=_median([r["misses"]["hit"] for r in reps]),
                             reusable=_median([r["misses"]["reusable"] for r in reps]),
                             bound=_median([r["misses"]["bound"] for r in reps]),
                             missed={c: _median([r["misses"]["missed"][c] for r in reps]) for c in m0["missed"]})
    if all(r.get("series") for r in reps):
        n = min(len(r["series"]) for r in reps)
        out["series"] = [{"t": reps[0]["series"][i]["t"],
                          "hit": _median([r["series"][i]["hit"] for r in reps]),
                          "requests": sum(r["series"][i]["requests"] for r in reps),
                          "errors": sum(r["series"][i]["errors"] for r in reps)} for i in range(n)]
    for f in ("worst_dip", "paired_dip", "paired_floor"):
        vals = [r.get(f) for r in reps if r.get(f) is not None]
        if vals:
            out[f] = max(vals)
    out["spread"] = spread
    out["repeats"] = len(reps)
    out["runs"] = [{k: v for k, v in r.items() if k not in ("series", "notes", "control")} for r in reps]
    return out


def point_failed(p: dict, slo: float) -> bool:
    return bool(p.get("slo_errors", p["errors"])) or not p["ttft_p99"] <= slo


def capacity(points: list[dict], slo: float) -> dict:
    """SLO capacity of a router's points; with repeats also each repeat's and their spread."""
    def cap_of(pts: list[dict]) -> Any:
        return slo_capacity([(p["qps"], p["ttft_p99"] if not p.get("slo_errors", p["errors"]) else math.inf)
                             for p in pts], slo)

    cap = cap_of(points)
    out = {"capacity": cap.capacity, "censored": cap.censored}
    n = min((len(p.get("runs", ())) for p in points), default=0)
    if n > 1:
        caps = [cap_of([dict(p["runs"][i], qps=p["qps"]) for p in points]).capacity for i in range(n)]
        out["repeats"] = caps
        out["spread"] = [min(caps), max(caps)]
    return out


def common_passing_rate(result: dict) -> float | None:
    """The highest rate at which every router of the result ran and passed the SLO (None if none)."""
    passing = [{p["qps"] for p in pts if not point_failed(p, result["slo"])} for pts in result["points"].values()]
    both = set.intersection(*passing) if passing else set()
    return max(both) if both else None


def fmt_ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def _spread(p: dict, f: str, fmt) -> str:
    s = p.get("spread", {}).get(f)
    return f" ({fmt(s[0])}-{fmt(s[1])})" if s and s[0] != s[1] else ""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(result: dict) -> str:
    tier = result.get("tier", 1)
    lines = [f"| router | tier | req/s | p50 TTFT | p99 TTFT | hit rate | bound | missed: first sight / "
             f"first-on-replica / evicted / spilled | max share | errors | router CPU ms/req | % core | client lag p99 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for router, points in result["points"].items():
        for p in points:
            cpu = p.get("router_cpu_per_1k")
            cpu_s = "-" if cpu is None or p["router"] == "direct" else f"{cpu:.2f}"
            if cpu_s != "-":
                cpu_s += _spread(p, "router_cpu_per_1k", lambda v: f"{v:.2f}")
            if p.get("control_cpu_per_1k") is not None:
                cpu_s += f" (+{p['control_cpu_per_1k']:.2f} control)"
            core = p.get("router_core_share")
            m = p.get("misses") or {}
            if m.get("prompt_tokens"):
                miss = " / ".join(f"{m['missed'][c] * 100:.1f}" for c in ("first_sight", "first_on_replica",
                                                                            "evicted", "spilled"))
                bound = _pct(m["bound"])
            else:
                miss, bound = "-", "-"
            shares = p.get("shares") or {}
            errs = f"{p['errors']}/{p['requests']}"
            if p.get("slo_errors") is not None and p["slo_errors"] != p["errors"]:
                errs += f" ({p['errors'] - p['slo_errors']} lost at the kill)"
            lines.append(
                f"| {router} | {p.get('tier', tier) if router != 'direct' else '-'} | {p['qps']:g} | "
                f"{fmt_ms(p.get('ttft_p50'))} | {fmt_ms(p['ttft_p99'])}{_spread(p, 'ttft_p99', fmt_ms)} | "
                f"{_pct(p['hit_rate'])}{_spread(p, 'hit_rate', _pct)} | {bound} | {miss} | "
                f"{max(shares.values()) if shares else 0:.1%} | {errs} | {cpu_s} | "
                f"{'-' if core is None or p['router'] == 'direct' else f'{core:.1%}'} | {fmt_ms(p.get('client_lag_p99'))} |")
    lines.append("")
    reps = result.get("repeats", 1)
    lines.append(f"SLO capacity (p99 TTFT <= {result['slo']:g} s, no errors"
                 f"{'; median of ' + str(reps) + ' repeats, range in brackets' if reps > 1 else ''}):")
    for router, cap in result["capacity"].items():
        cens = {"left": " (left-censored: the lowest rate fails)", "right": " (right-censored: the highest rate passes)"}
        skipped = result.get("skipped", {}).get(router)
        more = f"; not run past the knee: {', '.join(f'{q:g}' for q in skipped)} req/s" if skipped else ""
        rng = f" [{cap['spread'][0]:g}-{cap['spread'][1]:g}]" if cap.get("spread") else ""
        lines.append(f"- {router}: {cap['capacity']:g} req/s{rng}{cens.get(cap['censored'], '')}{more}")
    common = common_passing_rate(result)
    if common is not None:
        lines.append("")
        lines.append(f"At {common:g} req/s, the highest rate every router passes: " + "; ".join(
            f"{r} p99 {fmt_ms(p['ttft_p99'])}, hit {_pct(p['hit_rate'])}"
            for r, pts in result["points"].items() for p in pts if p["qps"] == common))
    dips = [(r, p["qps"], p["worst_dip"]) for r, pts in result["points"].items() for p in pts
            if p.get("worst_dip") is not None]
    if dips:
        lines.append("")
        lines.append("Worst hit-rate dip in the 3 series bins from an event (points, against the 3 bins before it):")
        lines.extend(f"- {r} at {q:g} req/s: {d * 100:.1f}" for r, q, d in dips)
    paired = [(r, p["qps"], p["paired_dip"], p.get("paired_floor"), p.get("paired_mean"), p["control"])
              for r, pts in result["points"].items() for p in pts if p.get("paired_dip") is not None]
    if paired:
        lines.append("")
        if result.get("null_pair"):
            lines.append("NULL PAIR (--null-pair): neither run had the events; the figures below are the method's "
                         "noise at the events' bins, not a cost.")
        lines.append("Against a control run of the same request list without the events (--control): worst dip "
                     "of a bin below the control's same bin in the 3 bins from an event, the noise floor "
                     "(largest |difference| of a bin before the first event), and the mean drop over the event "
                     "bins, points:")
        lines.extend(f"- {r} at {q:g} req/s: dip {d * 100:.1f}, floor {'-' if f is None else f'{f * 100:.1f}'}, "
                     f"mean {'-' if m is None else f'{m * 100:+.1f}'} "
                     f"(control: hit {_pct(c.get('hit_rate'))}, p99 {fmt_ms(c.get('ttft_p99'))})"
                     for r, q, d, f, m, c in paired)
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for router, points in result["points"].items():
        xs = [p["qps"] for p in points]
        ys = [p["ttft_p99"] for p in points]
        line, = ax.plot(xs, ys, marker="o", label=router)
        failed = [(p["qps"], p["ttft_p99"]) for p in points if p["errors"] and math.isfinite(p["ttft_p99"])]
        if failed:   # a point with errors fails the SLO whatever its p99 of the successful requests
            ax.scatter(*zip(*failed), marker="x", s=90, color=line.get_color(), zorder=3)
    ax.axhline(result["slo"], color="grey", linestyle="--", linewidth=1, label=f"SLO {result['slo']:g} s")
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("p99 TTFT (s)")
    ax.set_yscale("log")
    tier = result.get("tier", 1)
    ax.set_title(f"{result['workload']} - {result['scale']} scale ({result['replicas']} replicas"
                 f"{f', tier of {tier}' if tier > 1 else ''}); x: point had errors", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_series(result: dict, path: str) -> None:
    """Hit rate per 10 s bin over the run, one line per router and rate; events as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({p["qps"] for pts in result["points"].values() for p in pts if p.get("series")})
    if not rates:
        return
    fig, axes = plt.subplots(len(rates), 1, figsize=(7.0, 3.0 * len(rates)), squeeze=False)
    for ax, qps in zip(axes[:, 0], rates):
        events: set[tuple[float, str]] = set()
        for router, points in result["points"].items():
            for p in points:
                if p["qps"] != qps or not p.get("series"):
                    continue
                xs = [b["t"] + 5.0 for b in p["series"] if b["hit"] is not None]
                ys = [b["hit"] * 100 for b in p["series"] if b["hit"] is not None]
                ax.plot(xs, ys, marker=".", label=router)
                events.update((e["t"], e["kind"]) for e in p.get("events", ()))
        for t, kind in sorted(events):
            ax.axvline(t, color="grey", linestyle=":" if kind == "restart" else "--", linewidth=1)
        ax.set_ylabel("hit rate (%)")
        ax.set_title(f"{result['workload']} at {qps:g} req/s (10 s bins; lines: "
                     f"{'restarts' if result['workload'] == 'restart' else 'kill' if result['workload'] == 'kill' else 'rank rotations'})",
                     fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("time since the start of the run (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
