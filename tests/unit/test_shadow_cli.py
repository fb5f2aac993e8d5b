"""`cacheroute shadow`: records file in, ShadowReport JSON out, exit 0 on pass / 1 on fail / 2 on bad input."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from clients.cli import main
from services.wire.codec import write_plan_file
from services.core.planning import build_plan
from services.core.shadow import requests_to_records
from services.core.workloads import make_workload

SMALL = ["--replicas", "4", "--profile", "llama3-8b-h100", "--kv-blocks", "2500", "--slo-p99", "1.5",
         "--max-requests", "600", "--load-scales", "1,2", "--q-cap", "4", "--warm-slots", "8", "--json"]


@pytest.fixture(scope="module")
def records_file(tmp_path_factory):
    wl = make_workload("paper", qps=24, duration=40, seed=0, active_set=24)
    path = tmp_path_factory.mktemp("shadow") / "records.jsonl"
    with open(path, "wb") as f:
        for r in requests_to_records(wl.requests):
            f.write(orjson.dumps({"key": r.key, "time": r.time, "prompt_tokens": r.prompt_tokens,
                                  "prefix_tokens": r.prefix_tokens, "output_tokens": r.output_tokens}) + b"\n")
    return path, wl


def test_policy_candidate_passes(records_file, capsys):
    path, _ = records_file
    assert main(["shadow", "--trace", str(path), "--policy", "cacheroute", *SMALL]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["passed"] and out["requests"] == 600 and out["active_keys"] == 24
    assert out["validated_range"]["active_keys"][0] < 24 < out["validated_range"]["active_keys"][1]


def test_plan_file_that_pins_everything_fails(records_file, tmp_path, capsys):
    path, wl = records_file
    keys = sorted(set(q.key for q in wl.requests))
    plan = build_plan(keys, [1.0] * len(keys), [f"r{i}" for i in range(4)], q_cap=4.0, warm_slots=8)
    plan_path = tmp_path / "plan.json"
    write_plan_file(plan_path, replace(plan, table={k: (0,) for k in keys}))
    # unguarded: the overload guard would spill this plan's excess at dispatch
    assert main(["shadow", "--trace", str(path), "--plan", str(plan_path), "--balance-factor", "off", *SMALL]) == 1
    out = orjson.loads(capsys.readouterr().out)
    assert not out["passed"] and "validated_range" not in out


@pytest.mark.parametrize("content, message", [(b'{"key": "a", "time": 0}\n', "malformed record"),
                                              (b"not json\n", "malformed Mooncake record")])
def test_bad_records_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    assert main(["shadow", "--trace", str(path), "--policy", "cacheroute", *SMALL]) == 2
    assert message in capsys.readouterr().err


def test_missing_plan_file_is_a_one_line_error(records_file, tmp_path, capsys):
    path, _ = records_file
    assert main(["shadow", "--trace", str(path), "--plan", str(tmp_path / "nope.json"), *SMALL]) == 2
    assert "cannot read plan" in capsys.readouterr().err
