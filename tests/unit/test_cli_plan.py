"""`cacheroute plan build|show|diff`, run in-process on temp files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from clients.cli import main
from services.wire.codec import read_plan_file

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def run(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) <= 1
    return code, json.loads(lines[0]) if lines else None, err


def build_args(rates: str, out: str, *extra: str) -> list[str]:
    return ["plan", "build", "--rates", rates, "--replicas", "2", "--q-cap", "4", "--warm-slots", "2",
            "--out", out, *extra]


def test_build_show_diff(tmp_path, capsys):
    rates = write(tmp_path / "r.csv", "key,rate\na,6\nb,3\nc,2\nd,1\ne,0\n")
    first = str(tmp_path / "p1.json")
    code, out, _ = run(capsys, *build_args(rates, first))
    assert code == 0
    assert out["keys"] == 5 and out["admitted"] == 3 and out["version"] == 1
    assert out["admitted_rate_share"] == pytest.approx(11 / 12)
    assert out["imbalance"] >= 1.0 and out["build_seconds"] >= 0 and "churn" not in out
    plan = read_plan_file(first)
    assert dict(plan.table) == {"a": (0, 1), "b": (0,), "c": (1,)}

    rates2 = write(tmp_path / "r2.csv", "rate,key,note\n6,a,x\n1,b,y\n2,c,z\n3,d,w\n")
    second = str(tmp_path / "p2.json")
    code, out, _ = run(capsys, *build_args(rates2, second, "--previous", first))
    assert code == 0 and out["version"] == 2 and out["parent_version"] == 1
    assert 0.0 < out["churn"] <= 1.0
    assert read_plan_file(second).parent_version == 1

    code, shown, _ = run(capsys, "plan", "show", second)
    assert code == 0 and shown["version"] == 2 and shown["replicas"] == 2 and shown["slots"] == 4
    assert shown["churn"] == out["churn"]

    code, diff, _ = run(capsys, "plan", "diff", first, second)
    assert code == 0 and diff["churn"] == pytest.approx(out["churn"])
    assert (diff["old_version"], diff["new_version"]) == (1, 2)
    assert diff["keys_removed"] == 1 and diff["keys_added"] == 1  # b out, d in


def test_explicit_replica_ids_and_version(tmp_path, capsys):
    rates = write(tmp_path / "r.csv", "key,rate\na,1\n")
    out = str(tmp_path / "p.json")
    code, _, _ = run(capsys, "plan", "build", "--rates", rates, "--replicas", "e0,e1,e2", "--q-cap", "1",
                     "--warm-slots", "1", "--version", "12", "--out", out)
    assert code == 0
    plan = read_plan_file(out)
    assert plan.replica_ids == ("e0", "e1", "e2") and plan.version == 12


@pytest.mark.parametrize("csv_text, message", [
    ("key,value\na,1\n", "line 1: missing column 'rate'"),
    ("name,rate\na,1\n", "line 1: missing column 'key'"),
    ("", "empty file"),
    ("key,rate\na,1\nb,fast\n", "line 3: rate 'fast' is not a number"),
    ("key,rate\na,1\nb,-2\n", "line 3: rate '-2' must be finite and >= 0"),
    ("key,rate\na,nan\n", "line 2: rate 'nan' must be finite"),
    ("key,rate\na,inf\n", "line 2: rate 'inf' must be finite"),
    ("key,rate\na,1\nb,2\na,3\n", "line 4: duplicate key 'a' (first on line 2)"),
    ("key,rate\na,1\n\n\nb,x\n", "line 5: rate 'x' is not a number"),
    ('key,rate\n"a\nb",1\nc,x\n', "line 4: rate 'x' is not a number"),
    ("key,rate\na,1,2\n", "line 2: expected 2 fields, got 3"),
    ("key,rate\n,1\n", "line 2: empty key"),
])
def test_build_rejects_bad_rates(tmp_path, capsys, csv_text, message):
    rates = write(tmp_path / "r.csv", csv_text)
    code, out, err = run(capsys, *build_args(rates, str(tmp_path / "p.json")))
    assert code == 2 and out is None
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--replicas", "a,,b"], "empty replica id"),
    (["--replicas", "a,a"], "repeats a replica id"),
    (["--q-cap", "0"], "--q-cap must be a finite number > 0"),
    (["--q-cap", "-3"], "--q-cap must be a finite number > 0"),
    (["--warm-slots", "0"], "--warm-slots must be >= 1"),
])
def test_build_rejects_bad_flags(tmp_path, capsys, flags, message):
    rates = write(tmp_path / "r.csv", "key,rate\na,1\n")
    argv = build_args(rates, str(tmp_path / "p.json"))
    for i in range(0, len(flags), 2):
        argv[argv.index(flags[i]) + 1] = flags[i + 1]
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_unreadable_files(tmp_path, capsys):
    code, _, err = run(capsys, *build_args(str(tmp_path / "missing.csv"), str(tmp_path / "p.json")))
    assert code == 2 and "cannot read" in err and "missing.csv" in err
    bad_plan = write(tmp_path / "bad.json", "{not json")
    code, _, err = run(capsys, "plan", "show", bad_plan)
    assert code == 2 and "not valid JSON" in err
    rates = write(tmp_path / "r.csv", "key,rate\na,1\n")
    code, _, err = run(capsys, *build_args(rates, str(tmp_path / "p.json"), "--previous", str(tmp_path / "none.json")))
    assert code == 2 and "none.json" in err


def test_paper_sized_file_end_to_end(tmp_path, capsys):
    rng = np.random.default_rng(5)
    rates = rng.lognormal(0.0, 1.65, 128_824)
    rates *= 150.0 / rates.sum()
    path = tmp_path / "rates.csv"
    with open(path, "w") as f:
        f.write("key,rate\n")
        f.writelines(f"s{i},{r!r}\n" for i, r in enumerate(rates.tolist()))
    out = str(tmp_path / "plan.json")
    code, summary, _ = run(capsys, "plan", "build", "--rates", str(path), "--replicas", "30", "--q-cap", "0.1",
                           "--warm-slots", "100", "--out", out)
    assert code == 0 and summary["keys"] == 128_824
    plan = read_plan_file(out)
    assert summary["admitted"] == plan.admitted_keys
    assert sum(len(row) for row in plan.table.values()) <= 3000
    assert any(len(row) > 1 for row in plan.table.values())  # q_cap 0.1: the hottest keys need k_b > 1
    assert summary["imbalance"] == pytest.approx(plan.predicted_imbalance)
