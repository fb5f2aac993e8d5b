"""Tables and the adoption rule of docs/experiments.md "Cold-home rule in a tier" over this directory's
JSON lines and sim compare results. Run from the worktree root: .venv/bin/python experiments/results/tiersafe/table.py"""
import json
from pathlib import Path
from statistics import mean

D = Path(__file__).parent
SAME_AT_TIER1 = {"A": "M", "AB": "B"}       # share 1.0 at one router: the share gate always passes


def rows(kind, v):
    f = D / f"{kind}-{SAME_AT_TIER1.get(v, v) if kind == 'drift' else v}.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def point(kind, v, qps, tier=1):
    if kind == "tenants" and tier == 1:
        v = SAME_AT_TIER1.get(v, v)
    rs = [r for r in rows(kind, v) if r["qps"] == qps and r.get("tier", 1) == tier]
    if len(rs) != 2:
        return None
    rs.sort(key=lambda r: r["seed"])
    return {k: [r[k] for r in rs] for k in ("hit", "p99_ms", "spilled", "evicted")}


def mooncake(v):
    v = SAME_AT_TIER1.get(v, v)
    f = D / f"mooncake-{v}" / "results.json"
    if not f.exists():
        return None
    pts = json.loads(f.read_text())["cacheroute"]
    pts = pts["points"] if isinstance(pts, dict) and "points" in pts else pts
    return pts


def tol_hit(ref):
    return max(0.2, abs(ref["hit"][0] - ref["hit"][1]) / 2)


def tol_p99(ref):
    return max(0.1 * mean(ref["p99_ms"]), abs(ref["p99_ms"][0] - ref["p99_ms"][1]) / 2)


VARIANTS = ("M", "A", "B", "AB", "N")


def moon(v, q):
    pts = mooncake(v)
    if pts is None:
        return None
    p = min(pts, key=lambda p: abs(p["offered_qps"] - q))
    return {"hit": p["hit_rate"] * 100, "p99_s": p["ttft_p99"], "spilled": p["misses"]["spilled"] * 100}


def fmt(p, k, nd=1):
    return "–" if p is None else " / ".join(f"{x:.{nd}f}" if nd else f"{x:.0f}" for x in p[k])


def table():
    print("| variant | (a) tier 1 hit @16 | @24 | p99 ms @16 | @24 | (a) tier 4 hit @16 | @24 | spilled t1 / t4 @24 (s1) | "
          "(d) drift hit @16 | @24 | p99 ms @16 | @24 | Mooncake hit @4 / @8 (spilled @8) |")
    print("|---" * 14 + "|")
    for v in VARIANTS:
        t1 = [point("tenants", v, q) for q in (16.0, 24.0)]
        t4 = [point("tenants", v, q, 4) for q in (16.0, 24.0)]
        dr = [point("drift", v, q) for q in (16.0, 24.0)]
        m = [moon(v, q) for q in (4, 8)]
        sp = "–" if t1[1] is None or t4[1] is None else f"{t1[1]['spilled'][0]:.1f} / {t4[1]['spilled'][0]:.1f}"
        mo = "–" if None in m else f"{m[0]['hit']:.1f} / {m[1]['hit']:.1f}% ({m[1]['spilled']:.2f})"
        print(f"| {v} | {fmt(t1[0], 'hit')} | {fmt(t1[1], 'hit')} | {fmt(t1[0], 'p99_ms', 0)} | {fmt(t1[1], 'p99_ms', 0)} | "
              f"{fmt(t4[0], 'hit')} | {fmt(t4[1], 'hit')} | {sp} | {fmt(dr[0], 'hit')} | {fmt(dr[1], 'hit')} | "
              f"{fmt(dr[0], 'p99_ms', 0)} | {fmt(dr[1], 'p99_ms', 0)} | {mo} |")


def criteria(v):
    """(i), (ii), (iii) of the adoption rule, each True/False with the failing points."""
    out = {}
    bad = []
    for q in (16.0, 24.0):
        ref, got = point("tenants", "N", q, 4), point("tenants", v, q, 4)
        if mean(got["hit"]) < mean(ref["hit"]) - tol_hit(ref):
            bad.append(f"tier4@{q:.0f}: {mean(got['hit']):.2f} < {mean(ref['hit']):.2f}-{tol_hit(ref):.2f}")
    out["i"] = bad
    bad = []
    for kind in ("tenants", "drift"):
        for q in (16.0, 24.0):
            ref, got = point(kind, "M", q), point(kind, v, q)
            if mean(got["hit"]) < mean(ref["hit"]) - tol_hit(ref):
                bad.append(f"{kind}@{q:.0f} hit {mean(got['hit']):.2f} < {mean(ref['hit']):.2f}-{tol_hit(ref):.2f}")
            if mean(got["p99_ms"]) > mean(ref["p99_ms"]) + tol_p99(ref):
                bad.append(f"{kind}@{q:.0f} p99 {mean(got['p99_ms']):.0f} > {mean(ref['p99_ms']):.0f}+{tol_p99(ref):.0f}")
    out["ii"] = bad
    bad = []
    for q in (4, 8):
        ref = max(moon("M", q)["hit"], moon("N", q)["hit"])
        if moon(v, q)["hit"] < ref - 0.2:
            bad.append(f"mooncake@{q} {moon(v, q)['hit']:.2f} < {ref:.2f}-0.2")
    out["iii"] = bad
    return out


def adopt():
    gates = {"M": 0, "A": 1, "B": 1, "AB": 2, "N": 0}
    res = {v: criteria(v) for v in ("A", "B", "AB")}
    for v, c in res.items():
        print(v, {k: ("pass" if not b else b) for k, b in c.items()})
    t4 = {v: mean(point("tenants", v, 16.0, 4)["hit"] + point("tenants", v, 24.0, 4)["hit"]) for v in res}
    for need in (("i", "ii", "iii"), ("i", "ii")):
        ok = [v for v, c in res.items() if all(not c[k] for k in need)]
        if ok:
            pick = min(ok, key=lambda v: (gates[v], -t4[v]))
            print(f"adopt {pick} (passes {', '.join(need)}; candidates {ok})")
            return pick
    print("adopt M (no variant passes (i) and (ii))")
    return "M"


if __name__ == "__main__":
    table()
    print()
    adopt()
