"""services.backends: endpoint parsing and each kind's metric names (pages in the engines' own format)."""

from __future__ import annotations

import pytest

from services.backends import EngineStats, parse_endpoint
from services.backends import llamacpp, sglang, vllm
from services.backends.metrics import sample_sums
from services.dispatcher.cachestats import CacheUsage

# a trimmed page from xllamacpp 2026.10.11549 (SmolLM2-135M), as scraped on the development machine
LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 3020
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 4516
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

VLLM_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{finished_reason="length",model_name="m"} 3.0
"""

OLD_VLLM_PAGE = """\
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
"""

SGLANG_PAGE = """\
sglang:num_running_reqs{model_name="m"} 4.0
sglang:num_queue_reqs{model_name="m"} 1.0
sglang:token_usage{model_name="m"} 0.3
sglang:cache_hit_rate{model_name="m"} 0.7
"""


def test_llamacpp_prompt_tokens_exclude_cached_ones():
    s = llamacpp.read_stats(sample_sums(LLAMACPP_PAGE), EngineStats())
    assert (s.running, s.waiting, s.has_load) == (1, 2, True)
    assert (s.prompt_tokens, s.cached_tokens, s.has_counters) == (3020 + 4516, 4516, True)


def test_vllm_v1_names_sum_over_engines_and_skip_created():
    s = vllm.read_stats(sample_sums(VLLM_PAGE), EngineStats())
    assert (s.running, s.waiting, s.kv_usage) == (4, 5, 0.25)
    assert (s.prompt_tokens, s.cached_tokens, s.requests) == (1000, 600, 10)


def test_vllm_pool_size_from_cache_config_info():
    page = VLLM_PAGE + ('# TYPE vllm:cache_config_info gauge\n'
                        'vllm:cache_config_info{block_size="32",model_name="m",num_gpu_blocks="1100"} 1.0\n')
    assert vllm.read_stats(sample_sums(page), EngineStats()).kv_blocks == 2200    # in 16-token blocks
    assert vllm.read_stats(sample_sums(VLLM_PAGE), EngineStats()).kv_blocks == 0  # not reported: unknown


def test_vllm_old_names():
    s = vllm.read_stats(sample_sums(OLD_VLLM_PAGE), EngineStats())
    assert (s.running, s.kv_usage, s.prompt_tokens, s.cached_tokens) == (2, 0.5, 10, 4)


def test_sglang_gauges_and_no_counters():
    s = sglang.read_stats(sample_sums(SGLANG_PAGE), EngineStats())
    assert (s.running, s.waiting, s.kv_usage, s.has_counters) == (4, 1, 0.3, False)


def test_a_page_without_the_kinds_names_leaves_the_load_to_the_dispatcher():
    s = vllm.read_stats(sample_sums(LLAMACPP_PAGE), EngineStats())
    assert not s.has_load and not s.has_counters


@pytest.mark.parametrize("address,default,expected", [
    ("127.0.0.1:50061", "cacheroute", ("cacheroute", "127.0.0.1:50061")),
    ("vllm+http://10.0.0.5:8000/", "cacheroute", ("vllm", "http://10.0.0.5:8000")),
    ("http://10.0.0.5:8000", "sglang", ("sglang", "http://10.0.0.5:8000")),
    ("10.0.0.5:8000", "llamacpp", ("llamacpp", "http://10.0.0.5:8000")),
    ("openai+https://gw.example/v", "cacheroute", ("openai", "https://gw.example/v")),
])
def test_endpoints(address, default, expected):
    assert parse_endpoint(address, default) == expected


@pytest.mark.parametrize("address,default", [("http://x:1", "cacheroute"), ("tgi+http://x:1", "cacheroute"),
                                             ("x:1", "nope"), ("vllm+x", "cacheroute")])
def test_bad_endpoints(address, default):
    with pytest.raises(ValueError):
        parse_endpoint(address, default)


def test_cache_usage_prefers_responses_and_falls_back_to_counter_deltas():
    usage = CacheUsage(["a", "b"])
    usage.counters(1, 0, 1000, 100)
    usage.record(0, 100, 80, 30)
    usage.record(0, 50, 60)                      # cached capped at prompt; no completion tokens said
    usage.record(1, 70, 0, 12)                   # b's prompt figures come from its counters, its output from this
    usage.record_missing(1)
    usage.counters(1, 0, 1500, 400)
    assert usage.take() == [("a", 2, 150, 130, 1, 30), ("b", 2, 500, 300, 1, 12)]
    assert usage.take() == []
