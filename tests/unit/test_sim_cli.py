"""`cacheroute sim ...` in-process on tiny settings."""

from __future__ import annotations

import json

import pytest

from clients.cli import main

TINY = ["--replicas", "3", "--profile", "llama3-8b-h100", "--duration", "20", "--seed", "1",
        "--active-set", "16"]


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_run_prints_the_summary(capsys):
    out = run_json(capsys, ["sim", "run", "--workload", "paper", "--policy", "flat", "--qps", "6", "--json", *TINY])
    for field in ("hit_rate", "ttft_p50", "ttft_p99", "imbalance", "requests", "qps"):
        assert field in out
    assert out["requests"] > 50 and 0 <= out["hit_rate"] <= 1 and len(out["served_per_replica"]) == 3


def test_run_planned_policy_with_given_q_cap(capsys):
    out = run_json(capsys, ["sim", "run", "--workload", "whale", "--policy", "cacheroute", "--qps", "6",
                            "--q-cap", "2", "--control-interval", "5", "--whales", "2", *TINY])
    assert out["q_cap"] == 2 and out["plan_versions"] >= 2


def test_run_replays_and_rescales_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 1200, "output_length": 20, "hash_ids": [0, i % 3, 7 + i]}
            for i in range(40)]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = ["sim", "run", "--trace", str(trace), "--policy", "sticky", "--replicas", "2",
            "--profile", "llama3-8b-h100", "--warmup", "0", "--json"]
    recorded = run_json(capsys, base)
    assert recorded["requests"] == 40 and recorded["qps"] == pytest.approx(1.0, rel=0.05)
    fast = run_json(capsys, base + ["--qps", "4"])
    assert fast["qps"] == pytest.approx(4.0, rel=0.05)


def test_run_replays_recorded_arrival_times_on_a_workload(tmp_path, capsys):
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{s:02d}.{(37 * s) % 100:02d}00000,100,10\n" for s in range(40)))
    out = run_json(capsys, ["sim", "run", "--workload", "paper", "--policy", "flat", "--qps", "6", "--json",
                            "--arrivals", str(csv), "--warmup", "0", *TINY])
    assert out["requests"] == 120                           # exactly qps x duration, replayed
    assert main(["sim", "run", "--workload", "paper", "--policy", "flat", "--qps", "6",
                 "--arrivals", str(tmp_path / "none.csv"), *TINY]) == 2


def test_capacity_reports_censoring(capsys):
    out = run_json(capsys, ["sim", "capacity", "--workload", "paper", "--policy", "flat", "--slo-p99", "100",
                            "--qps-grid", "2,4", "--json", *TINY])
    assert out["censored"] == "right" and out["capacity"] == 4 and len(out["points"]) == 2
    out = run_json(capsys, ["sim", "capacity", "--workload", "paper", "--policy", "flat", "--slo-p99", "0.001",
                            "--qps-grid", "2,4", "--json", *TINY])
    assert out["censored"] == "left" and out["capacity"] == 0


def test_compare_writes_table_and_plots(tmp_path, capsys):
    out_dir = tmp_path / "cmp"
    assert main(["sim", "compare", "--workload", "paper", "--policies", "flat,sticky", "--slo-p99", "5",
                 "--qps-grid", "3,6", "--out", str(out_dir), *TINY]) == 0
    captured = capsys.readouterr()
    assert "| flat |" in captured.out and "| sticky |" in captured.out
    for name in ("results.json", "table.md", "p99_ttft_vs_qps.png", "hit_rate_vs_qps.png", "replica_load.png"):
        assert (out_dir / name).stat().st_size > 0
    assert set(json.loads((out_dir / "results.json").read_text())) == {"flat", "sticky"}


@pytest.mark.parametrize("argv, words", [
    (["--workload", "nope", "--policy", "flat", "--qps", "1"], ["unknown workload", "paper"]),
    (["--workload", "paper", "--policy", "nope", "--qps", "1"], ["unknown policy", "cacheroute"]),
    (["--workload", "paper", "--policy", "flat", "--qps", "1", "--profile", "x"], ["unknown profile", "llama3-8b-h100"]),
    (["--trace", "/no/such/file.jsonl", "--policy", "flat"], ["cannot read trace"]),
    (["--workload", "paper", "--policy", "flat", "--qps", "1", "--knob", "bogus=1"], ["unknown knob"]),
    (["--workload", "paper", "--policy", "flat", "--qps", "1", "--kv-blocks", "0"], ["--kv-blocks must be positive"]),
])
def test_bad_names_exit_2_with_the_choices(capsys, argv, words):
    assert main(["sim", "run", *argv]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words)


def test_run_with_a_kv_override_uses_that_pool(capsys):
    base = ["sim", "run", "--workload", "paper", "--active-set", "16", "--policy", "flat", "--qps", "20",
            "--duration", "10", "--replicas", "2", "--profile", "llama3-8b-h100", "--json"]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*base, "--kv-blocks", "400"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["hit_rate"] < full["hit_rate"]          # 400 blocks hold ~2 of the 16 prefixes
