"""Traffic driver helpers (relabel, window, summarize) and the stack's pure parts."""

from __future__ import annotations

import math

import pytest

from clients.loadgen import Outcome, relabel, summarize, window
from services.core.request import Request
from services.core.workloads import make_workload
from services.local.stack import StackConfig, parse_http_line, parse_serving_line


def test_relabel_keeps_the_shape_and_shares_nothing():
    base = make_workload("paper", qps=50, duration=4, seed=1, active_set=16).requests
    a, b = relabel(base, "a"), relabel(base, "b")
    assert [(r.arrival, r.prompt_tokens, r.output_tokens, len(r.blocks)) for r in a] == \
           [(r.arrival, r.prompt_tokens, r.output_tokens, len(r.blocks)) for r in base]
    assert all(x.key == f"a:{y.key}" for x, y in zip(a, base))
    blocks_a = {h for r in a for h in r.blocks}
    blocks_b = {h for r in b for h in r.blocks}
    blocks_base = {h for r in base for h in r.blocks}
    assert not blocks_a & blocks_b and not blocks_a & blocks_base
    assert len(blocks_a) == len(blocks_base)            # equal stays equal, distinct stays distinct
    assert all(0 <= h < 2 ** 63 for h in blocks_a)
    same_key = [r for r in a if r.key == a[0].key]
    assert all(r.blocks is same_key[0].blocks for r in same_key)   # one tuple per shared prefix


def test_window_retimes_to_zero():
    reqs = [Request(i, t, "k", 100, 4) for i, t in enumerate([0.5, 1.0, 1.5, 2.0])]
    assert [(r.rid, r.arrival) for r in window(reqs, 1.0, 2.0)] == [(1, 0.0), (2, 0.5)]


def test_summarize_token_weighted_hit_rate_reasons_and_errors():
    outcomes = [
        Outcome(0, "a", 0.0, 0.0, "r1", "planned", 3, 0.010, 900, 1000),
        Outcome(1, "a", 0.1, 0.0, "r1", "planned", 3, 0.020, 0, 3000),
        Outcome(2, "b", 0.2, 0.4, "r2", "cold", 4, 0.030, 100, 1000),
        Outcome(3, "c", 0.3, 0.0, error="UNAVAILABLE"),
    ]
    s = summarize(outcomes, ["r1", "r2", "r3"])
    assert s.requests == 4 and s.errors == 1 and s.error_codes == {"UNAVAILABLE": 1}
    assert s.hit_rate == pytest.approx(1000 / 5000)
    assert s.ttft_p50 == pytest.approx(0.020)
    assert s.plan_versions == [3, 4]
    assert s.by_reason == {"cold": 1, "planned": 2}
    assert s.by_replica == {"r1": 2, "r2": 1, "r3": 0}
    assert s.imbalance == pytest.approx(2 / 1)
    assert s.max_late == pytest.approx(0.4)


def test_summarize_nothing_served():
    s = summarize([Outcome(0, "a", 0.0, 0.0, error="DEADLINE_EXCEEDED")])
    assert s.hit_rate == 0.0 and math.isnan(s.ttft_p99) and s.by_reason == {}


def test_serving_line_is_recognised_and_nothing_else():
    line = (b'{"ts":1.0,"level":"info","service":"engine","logger":"cacheroute.rpc","msg":"serving",'
            b'"address":"127.0.0.1:4321","metrics_port":9999,"tls":false,"auth":false}')
    assert parse_serving_line(line)["address"] == "127.0.0.1:4321"
    assert parse_serving_line(b'{"msg":"engine ready","note":"serving"}') is None
    assert parse_serving_line(b'not json but "serving"') is None
    assert parse_serving_line(b'{"msg":"serving"}') is None


@pytest.mark.parametrize("kwargs", [{"engines": 0}, {"dispatchers": 0}, {"time_scale": 0}, {"warm_slots": 0},
                                    {"log_level": "WARNING"}])
def test_stack_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        StackConfig(**kwargs)


def test_serving_lines_after_a_childs_native_log_text_are_recognised():
    # llama.cpp's own logger writes to the same stream without ending its line (seen in CI)
    assert parse_serving_line(b'0.00.891.039 I {"msg":"serving","address":"127.0.0.1:1"}')["address"] == "127.0.0.1:1"
    assert parse_http_line(b'0.00.891.039 I {"msg":"http serving","url":"http://127.0.0.1:2"}') == "http://127.0.0.1:2"
    assert parse_http_line(b'0.00.891.039 I {"msg":"http serving"') is None
