"""Reproduce the paper's experiments on the simulator (docs/experiments.md).

  .venv/bin/python -m experiments.run NAME [--print]     run one experiment (or `all`)
  .venv/bin/python -m experiments.run NAME --only P,Q [--keep-old TAG]
                                                         re-run some rows, merge into the stored results
  .venv/bin/python -m experiments.run summarize          tables from the stored results

Capacity experiments are the product's own command, `cacheroute sim compare`, with the
arguments listed in COMPARE (`--print` shows them instead of running); each writes
results.json, table.md and plots under experiments/results/<name>/. `drift` runs
experiments/drift.py and writes experiments/results/drift/. `summarize` reads every stored
result and prints the markdown tables of docs/experiments.md (ours next to the paper's).
`--only` re-runs the named policies of a compare experiment (or the planner row) with the same
arguments and replaces their rows in the stored results; `--keep-old TAG` keeps each replaced
row as `<policy>-TAG`, so figures measured on earlier code stay visible next to the new ones.
Trace experiments read their files under $CACHEROUTE_DATA (the shared data folder); the stored
commands name them `$CACHEROUTE_DATA/...` (`--print` shows them so) and running one without the
variable stops with a one-line error.

Settings chosen once for every policy (docs/experiments.md, "Setup"): 150 s of arrivals,
60 s warm-up (two 30 s control intervals, so planned policies are measured on their second
and later plans), p99 TTFT SLO 3.5 s, q_cap calibrated per workload, W derived from the KV
size, seed 0, at most two worker processes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import orjson

ROOT = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(ROOT, "results")


# Trace paths in the stored commands start with this placeholder; it is replaced by $CACHEROUTE_DATA
# when a command runs (resolve), never guessed from the checkout's location
DATA = "$CACHEROUTE_DATA"


def data_dir(environ=os.environ) -> str:
    """The shared data folder (mooncake/, azure-llm-2023/): $CACHEROUTE_DATA, else a one-line error."""
    path = environ.get("CACHEROUTE_DATA")
    if not path:
        raise SystemExit("a trace is needed: set CACHEROUTE_DATA to the shared data folder "
                         "(the one holding mooncake/ and azure-llm-2023/)")
    return path


def data_path(arg: str, environ=os.environ) -> str:
    """`arg` with a leading `$CACHEROUTE_DATA/` replaced by the data folder; any other argument as it is."""
    prefix = DATA + "/"
    return os.path.join(data_dir(environ), arg[len(prefix):]) if arg.startswith(prefix) else arg


def resolve(argv: list[str], environ=os.environ) -> list[str]:
    """A stored command ready to run: its trace paths under the data folder."""
    return [data_path(a, environ) for a in argv]


MOONCAKE_CONVERSATION = f"{DATA}/mooncake/conversation_trace.first_half.jsonl"
MOONCAKE_SYNTHETIC = f"{DATA}/mooncake/synthetic_trace.jsonl"
AZURE_CONVERSATION = f"{DATA}/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"

ALL_POLICIES = "flat,sticky,chwbl,sglang,llmd,dynamo,preble,dualmap,cacheroute"
TRACE_POLICIES = ALL_POLICIES + ",cacheroute-prefix"     # the traces also run the prefix-aware plans
BOOT = ["--first-plan-at", "5"]
SYNTH = ["--duration", "150", "--warmup", "60", *BOOT, "--jobs", "2"]
FLAGSHIP_GRID = "20,50,100,150,200,250,300"
FULL_GRID = "25,50,75,100,150,200"        # the full-population flagship (heavier prompts)
HISTORY = "1800"                          # seconds of aggregated per-key rate history (flagship-full-history)
# the flagship's calibrated knobs (experiments/results/flagship-anchors/results.json, "chosen"): workload
# knobs of `flagship` and the per-replica KV; every other workload keeps its defaults
FLAGSHIP_ANCHORS = {"active_set": 4864, "shared_tokens": 4096, "context_median": 2048}
FLAGSHIP_KV_BLOCKS = 19388                # 1.375 x the 70B profile's 14,100
ANCHORED = ["--workload", "flagship", "--active-set", str(FLAGSHIP_ANCHORS["active_set"]),
            "--knob", f"shared_tokens={FLAGSHIP_ANCHORS['shared_tokens']}",
            "--knob", f"context_median={FLAGSHIP_ANCHORS['context_median']}", "--kv-blocks", str(FLAGSHIP_KV_BLOCKS)]
ANCHORED_GRID = "25,50,75,100,125,150,175,200,250,300"
TRACE_GRID = "4,8,12,16,20,24,32"
BURST_GRID = "20,50,75,100,125,150,175,200,225,250,275,300"
BURST = ["--workload", "paper", "--policies", "flat,sglang,cacheroute", "--qps-grid", BURST_GRID, "--q-cap", "10.75",
         "--slo-p99", "3.5", *SYNTH]

COMPARE: dict[str, list[str]] = {
    # the paper's flagship (section 5.1), calibrated on both of its baseline anchors at once (Flat-LB
    # 64.1%, Sticky 87.3% hit at 100 QPS; issue 23, experiments/flagship.py calibrate-anchors): the
    # top-4,864 keys of the population, 4,096 shared + 2,048-median context tokens, 19,388 KV blocks
    "flagship": ["sim", "compare", *ANCHORED, "--policies", ALL_POLICIES, "--qps-grid", ANCHORED_GRID,
                 "--slo-p99", "3.5", *SYNTH],
    # the full 128,824-key population (issue 13's flagship), prompt structure calibrated once from
    # Flat-LB's hit rate (experiments/flagship.py calibrate; Sticky's 87.3% is out of its reach)
    "flagship-full": ["sim", "compare", "--workload", "flagship", "--policies", ALL_POLICIES,
                      "--qps-grid", FULL_GRID, "--slo-p99", "3.5", *SYNTH],
    # the flagship above its first grid (every policy passed 200 there); q_cap fixed to the value
    # the flagship sweep calibrated at its lowest point, so only the grid changes; merged into
    # flagship-full/ by `experiments.run merge-grid flagship-full:flagship-full-high`
    # (sized for the shared machine: SGLang, the lowest p99 at 200 QPS, DualMap, the highest hit rate,
    # and CacheRoute; a run of all nine policies on 250,300,400 took ~3.5 min per run and was stopped)
    "flagship-full-high": ["sim", "compare", "--workload", "flagship", "--policies", "sglang,dualmap,cacheroute",
                           "--qps-grid", "300,400", "--q-cap", "13.25", "--slo-p99", "3.5", *SYNTH],
    "flagship-full-history-high": ["sim", "compare", "--workload", "flagship", "--policies", "cacheroute",
                                   "--rate-history", HISTORY, "--qps-grid", "250,300,400", "--q-cap", "13.25",
                                   "--slo-p99", "3.5", "--duration", "150", "--warmup", "60", *BOOT, "--jobs", "1"],
    # the same with the planner fed 30 min of aggregated per-key rates (EWMA horizon 30 min)
    "flagship-full-history": ["sim", "compare", "--workload", "flagship", "--policies", "cacheroute",
                              "--rate-history", HISTORY, "--qps-grid", FULL_GRID, "--slo-p99", "3.5", *SYNTH],
    "flagship-k128": ["sim", "compare", "--workload", "paper", "--active-set", "128", "--policies", ALL_POLICIES,
                      "--qps-grid", FLAGSHIP_GRID, "--slo-p99", "3.5", *SYNTH],
    "flagship-k256": ["sim", "compare", "--workload", "paper", "--active-set", "256", "--policies", ALL_POLICIES,
                      "--qps-grid", FLAGSHIP_GRID, "--slo-p99", "3.5", *SYNTH],
    "ablation": ["sim", "compare", "--profile", "llama3-8b-h100", "--workload", "whale",
                 "--policies", "flat,affinity,affinity-replication,cacheroute",
                 "--qps-grid", "60,120,180,240,300,360,420,500", "--slo-p99", "3.5", *SYNTH],
    "low-reuse": ["sim", "compare", "--workload", "low-reuse", "--policies", "flat,cacheroute",
                  "--qps-grid", "20,40,60,80,100,120,160", "--slo-p99", "3.5", *SYNTH],
    "burst": ["sim", "compare", "--workload", "paper", "--cv", "1.9", "--policies", "flat,cacheroute",
              "--qps-grid", FLAGSHIP_GRID, "--slo-p99", "3.5", *SYNTH],
    # (d) on one finer grid, three arrival models of the same K = 128 workload (seed 0)
    # (q_cap fixed at flagship-k128's 10.75): Poisson; bursts correlated over seconds (a two-state
    # MMPP with the gamma run's gap CV 1.9, mean dwell 10 s per state: below the 30 s control
    # interval, far above a gap); the Azure LLM 2023 conversation trace's real arrival times,
    # looped and time-scaled to the offered QPS (`--arrivals`, services.core.traces.replay_arrivals)
    "burst-poisson": ["sim", "compare", *BURST],
    "burst-mmpp": ["sim", "compare", *BURST, "--cv", "1.9", "--knob", "burst_dwell=10"],
    "burst-azure": ["sim", "compare", *BURST, "--arrivals", AZURE_CONVERSATION],
    # the same at the two Poisson capacities only (flat 100, cacheroute 250; q_cap as flagship-k128),
    # sized for the shared machine: does each still pass under correlated bursts?
    "burst-mmpp-knees": ["sim", "compare", "--workload", "paper", "--cv", "1.9", "--knob", "burst_dwell=10",
                         "--policies", "flat,cacheroute", "--qps-grid", "100,250", "--q-cap", "10.75",
                         "--slo-p99", "3.5", "--duration", "150", "--warmup", "60", *BOOT, "--jobs", "1"],
    # (c) on the paper's model size (the derived 32B profile, one H100 per replica)
    "low-reuse-32b": ["sim", "compare", "--profile", "qwen2.5-32b-fp8-h100", "--workload", "low-reuse",
                      "--policies", "flat,cacheroute", "--qps-grid", "20,40,60,70,80,90,100", "--slo-p99", "3.5",
                      *SYNTH],
    # the same at two points only (sized for the shared machine)
    "low-reuse-32b-2pt": ["sim", "compare", "--profile", "qwen2.5-32b-fp8-h100", "--workload", "low-reuse",
                          "--policies", "flat,cacheroute", "--qps-grid", "60,100", "--slo-p99", "3.5", *SYNTH],
    # traces: 8B profile, 8 replicas (docs/experiments.md, experiment f, says why)
    "mooncake-conversation": ["sim", "compare", "--trace", MOONCAKE_CONVERSATION,
                              "--profile", "llama3-8b-h100", "--replicas", "8", "--policies", TRACE_POLICIES,
                              "--qps-grid", TRACE_GRID, "--slo-p99", "20", *BOOT, "--jobs", "2"],
    "mooncake-synthetic": ["sim", "compare", "--trace", MOONCAKE_SYNTHETIC,
                           "--profile", "llama3-8b-h100", "--replicas", "8", "--policies", TRACE_POLICIES,
                           "--qps-grid", TRACE_GRID, "--slo-p99", "10", *BOOT, "--jobs", "2"],
    # the flagship K=128 near its knee on a finer, higher grid; q_cap fixed to the value flagship-k128
    # calibrated at its lowest point (20 QPS), so the only change is the grid
    "flagship-k128-knee": ["sim", "compare", "--workload", "paper", "--active-set", "128",
                           "--policies", "flat,chwbl,sglang,dualmap,cacheroute",
                           "--qps-grid", "200,225,250,275,300,350,400", "--q-cap", "10.75",
                           "--slo-p99", "3.5", *SYNTH],
    # the paper's second workload at top-K256 with a warm-slot budget that binds (R x W = 240 < 256
    # keys), the condition the paper ties its 160 vs 100 QPS to; baselines do not use W, so their
    # rows are flagship-k256's (same requests)
    "second-k256-w8": ["sim", "compare", "--workload", "paper", "--active-set", "256", "--policies", "cacheroute",
                       "--warm-slots", "8", "--qps-grid", FLAGSHIP_GRID, "--slo-p99", "3.5", *SYNTH],
    # the same with a tighter budget, R x W = 120 (less than half of the 256 keys)
    "second-k256-w4": ["sim", "compare", "--workload", "paper", "--active-set", "256", "--policies", "cacheroute",
                       "--warm-slots", "4", "--qps-grid", "20,50,100,150,200,250,275,300", "--slo-p99", "3.5",
                       "--q-cap", "11.125", *SYNTH],
}
# CacheRoute with the planner service's own plan lifecycle (incremental candidate + keep-or-switch
# rule) instead of the simulator's default fresh LPT plan every interval; same settings as above
# name -> (active set, grid, fixed q_cap or None = calibrated at the lowest grid point[, W])
PLANNER = {"planner-k128": (128, FLAGSHIP_GRID, None), "planner-k256": (256, FLAGSHIP_GRID, None),
           "planner-k128-knee": (128, "200,225,250,275,300,350,400", 10.75),
           "planner-k256-w8": (256, FLAGSHIP_GRID, None, 8)}
TRACES = {"mooncake-conversation": MOONCAKE_CONVERSATION,
          "mooncake-synthetic": MOONCAKE_SYNTHETIC}
EXPERIMENTS = (*COMPARE, *PLANNER, "drift", "ideal")


def command(name: str, out: str | None = None, policies: str | None = None) -> list[str]:
    argv = [*COMPARE[name], "--out", os.path.relpath(out or os.path.join(RESULTS, name))]
    if policies is not None:
        argv[argv.index("--policies") + 1] = policies
    return argv


def rerun(name: str, policies: list[str], keep_old: str | None) -> int:
    """Re-run `policies` of a stored experiment with its own arguments and merge their rows in."""
    import shutil

    from services.sim import report

    path = os.path.join(RESULTS, name)
    scratch = os.path.join(path, "rerun")
    if name in PLANNER:
        if policies != ["cacheroute-planner"]:
            raise SystemExit(f"{name} has one row, cacheroute-planner")
        rc = run_planner(name, *PLANNER[name], out_dir=scratch)
    elif name in COMPARE:
        from clients.cli import main as cli

        rc = cli(resolve(command(name, scratch, ",".join(policies))))
    else:
        raise SystemExit(f"--only applies to compare experiments and planner-k*, not {name}")
    if rc:
        return rc
    fresh = load_path(os.path.join(scratch, "results.json"))
    report.write(merge_rows(load(name) or {}, fresh, keep_old), path)
    shutil.rmtree(scratch)
    return 0


def merge_rows(stored: dict, fresh: dict, keep_old: str | None) -> dict:
    """Stored rows with `fresh` ones replacing theirs in place; a replaced row kept as `<policy>-TAG`."""
    merged = {}
    for policy, row in stored.items():
        merged[policy] = fresh.get(policy, row)
    merged.update((p, r) for p, r in fresh.items() if p not in merged)
    if keep_old:
        merged.update((f"{p}-{keep_old}", stored[p]) for p in fresh if p in stored)
    return merged


def merge_grid(name: str, extra: str) -> int:
    """Add experiment `extra`'s points (a higher grid, same settings) to `name`'s rows and recompute
    each row's capacity over the union of grid points."""
    from services.sim import report
    from services.sim.runs import capacity_report

    report.write(merge_points(load(name) or {}, load(extra) or {}, capacity_report), os.path.join(RESULTS, name))
    return 0


def merge_points(base: dict, more: dict, capacity_report) -> dict:
    """`base` with each of its rows extended by `more`'s points for the same policy (a point at
    the same QPS is replaced) and its capacity recomputed over the union; other rows unchanged."""
    out = dict(base)
    for policy, row in more.items():
        if policy not in base:
            continue
        points = {p["offered_qps"]: p for p in base[policy]["points"]}
        points.update((p["offered_qps"], p) for p in row["points"])
        out[policy] = capacity_report([points[q] for q in sorted(points)], base[policy]["slo_p99"])
    return out


def run(name: str) -> int:
    if name == "drift":
        from experiments import drift, plots

        out = drift.run(drift.DriftSetup())
        path = os.path.join(RESULTS, "drift")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "results.json"), "wb") as f:
            f.write(orjson.dumps(out, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        plots.drift_series(out, os.path.join(path, "hit_rate_over_time.png"))
        sys.stdout.write(drift_table(out))
        return 0
    if name in PLANNER:
        return run_planner(name, *PLANNER[name])
    if name == "ideal":
        return run_ideal()
    from clients.cli import main

    return main(resolve(command(name)))


def run_ideal() -> int:
    """Ideal (infinite-cache) hit rate of each Mooncake trace: whole trace, and over the
    simulator's measured window at each grid QPS (warm-up min(60 s, 25%), as the simulator)."""
    from experiments.ideal import ideal_window_hit_rate
    from services.core import traces
    from services.sim import tracefiles

    out = {}
    for name, path in TRACES.items():
        row = {}
        for qps in (float(q) for q in TRACE_GRID.split(",")):
            reqs = tracefiles.load_mooncake(data_path(path), qps=qps).requests
            end = reqs[-1].arrival + 1e-9
            row[f"{qps:g}"] = ideal_window_hit_rate(reqs, min(60.0, 0.25 * end), end)
        out[name] = {"whole_trace": traces.ideal_hit_rate(reqs), "window_by_qps": row}
    path = os.path.join(RESULTS, "ideal.json")
    with open(path, "wb") as f:
        f.write(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def run_planner(name: str, active_set: int, grid: str, q_cap: float | None, warm_slots: int | None = None,
                out_dir: str | None = None) -> int:
    """The flagship sweep for cacheroute with the planner's lifecycle (experiments.drift "planner")."""
    from dataclasses import replace

    from experiments.drift import plan_fn_for
    from services.core.policies import make_policy
    from services.sim import report
    from services.sim.runs import RunSpec, calibrated_q_cap, capacity_report, config_for, load_requests
    from services.sim.simulator import Simulator

    qps_grid = [float(q) for q in grid.split(",")]
    base = RunSpec(policy="cacheroute", qps=qps_grid[0], duration=150.0, warmup=60.0, first_plan_at=5.0,
                   workload_knobs={"active_set": active_set}, warm_slots=warm_slots)
    q_cap = q_cap if q_cap is not None else calibrated_q_cap(base)
    points = []
    for qps in qps_grid:
        spec = replace(base, qps=qps, q_cap=q_cap)
        reqs = load_requests(spec)
        prefix = {q.key: q.prefix_tokens for q in reqs}
        config = replace(config_for(spec), plan_fn=plan_fn_for("planner", prefix))
        out = Simulator(config, make_policy("cacheroute", spec.replicas, seed=spec.seed), reqs).run().as_dict()
        out["offered_qps"] = qps
        points.append(out)
        sys.stderr.write(f"{name}: {qps:g} QPS hit {out['hit_rate']:.3f} p99 {out['ttft_p99']:.2f} s\n")
    results = {"cacheroute-planner": capacity_report(points, 3.5)}
    path = out_dir or os.path.join(RESULTS, name)
    os.makedirs(path, exist_ok=True)
    report.write(results, path)
    sys.stdout.write(report.table(results))
    return 0


# ------------------------------------------------------------------ summaries

def load(name: str) -> dict | None:
    return load_path(os.path.join(RESULTS, name, "results.json"))


def load_path(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return orjson.loads(f.read())


def point(report: dict, qps: float) -> dict | None:
    return next((p for p in report["points"] if p["offered_qps"] == qps), None)


def fmt(x, digits=2, pct=False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{100 * x:.1f}%" if pct else f"{x:.{digits}f}"


def capacity(report: dict) -> str:
    cap = f"{report['capacity']:g}"
    if report["censored"] == "right":
        return f">= {cap} (right-censored)"
    if report["censored"] == "left":
        return f"< {min(p['offered_qps'] for p in report['points']):g} (left-censored)"
    return cap


def policy_table(results: dict, rows: list[str], hit_qps: float, p99_qps: float,
                 paper: dict[str, tuple] | None = None, imbalance_qps: float | None = None) -> str:
    head = ["policy", f"hit @{hit_qps:g}", "capacity (QPS)", f"p99 TTFT s @{p99_qps:g}"]
    if imbalance_qps is not None:
        head.append(f"imbalance @{imbalance_qps:g}")
    if paper:
        head += ["paper hit", "paper capacity", "paper p99 @100"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in rows:
        r = results.get(policy)
        if r is None:
            continue
        hp, pp = point(r, hit_qps), point(r, p99_qps)
        cells = [policy, fmt(hp and hp["hit_rate"], pct=True), capacity(r), fmt(pp and pp["ttft_p99"])]
        if imbalance_qps is not None:
            ip = point(r, imbalance_qps)
            cells.append(fmt(ip and ip["imbalance"]) + "x")
        if paper:
            cells += list(paper.get(policy, ("-", "-", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PAPER_FLAGSHIP = {"flat": ("64.1%", "42", "5.7"), "sticky": ("87.3%", "30", "8.5"),
                  "chwbl": ("75.6%", "64", "3.8"), "dualmap": ("88.7%", "58", "5.3"),
                  "preble": ("72.0%", "76", "3.8"), "cacheroute": ("93.2%", "176", "1.8")}
PAPER_ABLATION = {"flat": ("56%", "240", "1.00x"), "affinity": ("88%", "240", "3.46x"),
                  "affinity-replication": ("88%", "240", "2.60x"), "cacheroute": ("90%", ">= 500", "1.24x")}


def drift_table(out: dict) -> str:
    lines = ["| mode | hit rate | p99 TTFT s | churn per install | install dips (points) | worst epoch vs scratch |",
             "|---|---|---|---|---|---|"]
    modes = out["modes"]
    base = modes.get("scratch")
    for mode, m in modes.items():
        churn = [i["churn"] for i in m["installs"] if i["churn"] is not None]
        dips = [d["dip_points"] for d in m["dips"]]
        worst = "-"
        if base is not None and mode != "scratch":
            diffs = [(100 * (e["hit_rate"] - b["hit_rate"]), e["ttft_p99"] - b["ttft_p99"])
                     for e, b in zip(m["epochs"], base["epochs"])]
            hit_d = min(d[0] for d in diffs)
            p99_d = max(d[1] for d in diffs)
            worst = f"{hit_d:+.1f} pts, {1000 * p99_d:+.0f} ms p99"
        lines.append("| " + " | ".join([
            mode, fmt(m["hit_rate"], pct=True), fmt(m["ttft_p99"]),
            (f"{100 * min(churn):.0f}-{100 * max(churn):.0f}%" if churn else "-") + f" ({len(m['installs'])} installs)",
            (f"{min(dips):+.1f} .. {max(dips):+.1f}" if dips else "-"), worst]) + " |")
    return "\n".join(lines) + "\n"


def summarize() -> str:
    parts = []
    for name in ("flagship-k128", "flagship-k256"):
        res = load(name)
        if res:
            parts.append(f"### {name}\n\n" + policy_table(res, list(res), 100, 100, PAPER_FLAGSHIP))
    res = load("ablation")
    if res:
        head = "| policy | hit @240 | imbalance @240 | capacity (QPS) | p99 s @240 | paper hit | paper capacity | paper imbalance |"
        lines = [head, "|---|---|---|---|---|---|---|---|"]
        for policy, r in res.items():
            p = point(r, 240)
            paper = PAPER_ABLATION.get(policy, ("-",) * 3)
            lines.append(f"| {policy} | {fmt(p['hit_rate'], pct=True)} | {fmt(p['imbalance'])}x | {capacity(r)} | "
                         f"{fmt(p['ttft_p99'])} | {paper[0]} | {paper[1]} | {paper[2]} |")
        parts.append("### ablation\n\n" + "\n".join(lines) + "\n")
    for name, hit_q in (("low-reuse", 60), ("burst", 100)):
        res = load(name)
        if res:
            parts.append(f"### {name}\n\n" + policy_table(res, list(res), hit_q, hit_q))
    for name, hit_q in (("mooncake-conversation", 4), ("mooncake-synthetic", 4)):
        res = load(name)
        if res:
            parts.append(f"### {name}\n\n" + policy_table(res, list(res), hit_q, hit_q))
    drift_out = load("drift")
    if drift_out:
        parts.append("### drift\n\n" + drift_table(drift_out))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="experiments.run", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=(*EXPERIMENTS, "all", "summarize", "merge-grid"))
    ap.add_argument("extra", nargs="?", help="merge-grid: the experiment whose points to add")
    ap.add_argument("--print", action="store_true", help="print the cacheroute command instead of running it")
    ap.add_argument("--only", help="re-run these policies (comma-separated) and merge them into the stored results")
    ap.add_argument("--keep-old", metavar="TAG", help="with --only: keep each replaced row as <policy>-TAG")
    args = ap.parse_args(argv)
    if args.name == "summarize":
        sys.stdout.write(summarize())
        return 0
    if args.name == "merge-grid":
        if not args.extra:
            ap.error("merge-grid NAME EXTRA")
        return merge_grid(args.extra.split(":")[0], args.extra.split(":")[1]) if ":" in args.extra else \
            ap.error("merge-grid wants BASE:EXTRA, e.g. flagship-full:flagship-full-high")
    if args.keep_old and not args.only:
        ap.error("--keep-old needs --only")
    if args.only:
        return rerun(args.name, [p.strip() for p in args.only.split(",") if p.strip()], args.keep_old)
    names = EXPERIMENTS if args.name == "all" else (args.name,)
    for name in names:
        if args.print:
            print(f"{name}: .venv/bin/python -m experiments.run {name}" if name not in COMPARE
                  else "cacheroute " + " ".join(command(name)))
            continue
        rc = run(name)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
