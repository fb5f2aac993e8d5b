"""Tables and the adoption rule of docs/experiments.md "The record bus in the simulator" over this
directory's JSON lines. Run from the worktree root: .venv/bin/python experiments/results/bussim/table.py"""
import json
from pathlib import Path
from statistics import mean

D = Path(__file__).parent
VARIANTS = (("OFF", None, True), ("BUS 0.1 mem on", 0.1, True), ("BUS 0.1 mem off", 0.1, False),
            ("BUS 0.5 mem on", 0.5, True), ("BUS 0.5 mem off", 0.5, False))


def rows(kind):
    f = D / f"{kind}.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def point(kind, tier, delay, memory, qps):
    """Seeds 1 and 2 of one point: lists of hit, p99_ms, spilled, evicted (None if incomplete)."""
    if tier == 1:
        delay, memory = None, True
    rs = [r for r in rows(kind) if r["qps"] == qps and r.get("tier", 1) == tier and r.get("record_delay") == delay
          and (delay is None or r.get("record_memory") == memory)]
    if len(rs) != 2:
        return None
    rs.sort(key=lambda r: r["seed"])
    return {k: [r[k] for r in rs] for k in ("hit", "p99_ms", "spilled", "evicted")}


def tol_hit(ref):
    return max(0.2, abs(ref["hit"][0] - ref["hit"][1]) / 2)


def tol_p99(ref):
    return max(0.1 * mean(ref["p99_ms"]), abs(ref["p99_ms"][0] - ref["p99_ms"][1]) / 2)


def fmt(p):
    if p is None:
        return "– | – | –"
    return " | ".join(" / ".join(f"{x:.{nd}f}" for x in p[k]) for k, nd in (("hit", 1), ("p99_ms", 0), ("spilled", 1)))


def table(kind):
    print(f"\n({kind}) seeds 1 / 2: hit % | p99 ms | spilled points, @16 then @24 wall req/s")
    print("| tier | variant | hit @16 | p99 @16 | spilled @16 | hit @24 | p99 @24 | spilled @24 |")
    print("|---" * 8 + "|")
    print(f"| 1 | one router (rule on) | {fmt(point(kind, 1, None, True, 16.0))} | {fmt(point(kind, 1, None, True, 24.0))} |")
    for tier in (2, 4):
        for name, d, m in VARIANTS:
            print(f"| {tier} | {name} | {fmt(point(kind, tier, d, m, 16.0))} | {fmt(point(kind, tier, d, m, 24.0))} |")


def moon():
    f = D / "mooncake.jsonl"
    if not f.exists():
        return []
    return [json.loads(x) for x in f.read_text().splitlines()]


def mpoint(tier, delay, memory, qps):
    for r in moon():
        if r["tier"] == tier and r["record_delay"] == delay and (delay is None or r["record_memory"] == memory) \
                and r["qps"] == qps:
            return r
    return None


def criteria(delay, memory):
    bad = {"i": [], "ii": [], "iii": []}
    for q in (16.0, 24.0):
        ref = point("drift", 1, None, True, q)
        for tier in (2, 4):
            got = point("drift", tier, delay, memory, q)
            if ref is None or got is None:
                bad["i"].append(f"drift t{tier} @{q:g}: missing")
                continue
            if mean(got["hit"]) < mean(ref["hit"]) - tol_hit(ref):
                bad["i"].append(f"drift t{tier} @{q:g} hit {mean(got['hit']):.2f} < {mean(ref['hit']):.2f} - {tol_hit(ref):.2f}")
            if mean(got["p99_ms"]) > mean(ref["p99_ms"]) + tol_p99(ref):
                bad["i"].append(f"drift t{tier} @{q:g} p99 {mean(got['p99_ms']):.0f} > {mean(ref['p99_ms']):.0f} + {tol_p99(ref):.0f}")
            off, got = point("tenants", tier, None, True, q), point("tenants", tier, delay, memory, q)
            if off is None or got is None:
                bad["ii"].append(f"(a) t{tier} @{q:g}: missing")
                continue
            if mean(got["hit"]) < mean(off["hit"]) - tol_hit(off):
                bad["ii"].append(f"(a) t{tier} @{q:g} hit {mean(got['hit']):.2f} < {mean(off['hit']):.2f} - {tol_hit(off):.2f}")
            if mean(got["p99_ms"]) > mean(off["p99_ms"]) + tol_p99(off):
                bad["ii"].append(f"(a) t{tier} @{q:g} p99 {mean(got['p99_ms']):.0f} > {mean(off['p99_ms']):.0f} + {tol_p99(off):.0f}")
    for q in (4.0, 8.0):
        off, got = mpoint(4, None, True, q), mpoint(4, delay, memory, q)
        if off is None or got is None:
            bad["iii"].append(f"mooncake t4 @{q:g}: missing")
        elif got["hit"] < off["hit"] - 0.2:
            bad["iii"].append(f"mooncake t4 @{q:g} hit {got['hit']:.2f} < {off['hit']:.2f} - 0.2")
    return bad


def tier4_mean_hit(delay, memory):
    xs = [mean(p["hit"]) for kind in ("tenants", "drift") for q in (16.0, 24.0)
          for p in [point(kind, 4, delay, memory, q)] if p is not None]
    return mean(xs) if xs else float("nan")


def main():
    table("tenants")
    table("drift")
    print("\nMooncake conversation (one trace): hit % / p99 s / spilled points @4 and @8")
    for tier, name, d, m in [(1, "one router", None, True)] + [(4, n, d, m) for n, d, m in VARIANTS]:
        cells = []
        for q in (4.0, 8.0):
            r = mpoint(tier, d, m, q)
            cells.append("–" if r is None else f"{r['hit']:.2f} / {r['p99_s']:.2f} / {r['spilled']:.2f}")
        print(f"| {tier} | {name} | {' | '.join(cells)} |")
    print("\nAdoption rule:")
    passing = {}
    for name, d, m in VARIANTS[1:]:
        bad = criteria(d, m)
        ok = {k: not v for k, v in bad.items()}
        print(f"{name}: (i) {ok['i']} (ii) {ok['ii']} (iii) {ok['iii']}; tier-4 mean hit {tier4_mean_hit(d, m):.2f}")
        for k, v in bad.items():
            for x in v:
                print(f"    ({k}) {x}")
        if d == 0.1:
            passing[m] = ok
    for need in (("i", "ii", "iii"), ("i", "ii")):
        cands = [m for m, ok in passing.items() if all(ok[k] for k in need)]
        if cands:
            if len(cands) == 2:
                a, b = tier4_mean_hit(0.1, True), tier4_mean_hit(0.1, False)
                pick = True if a >= b - 0.1 else False
            else:
                pick = cands[0]
            print(f"verdict: adopt BUS 0.1 memory {'on' if pick else 'off'} (passes {', '.join(need)})")
            return
    print("verdict: none passes (i) and (ii): the bus stays off")


if __name__ == "__main__":
    main()
