"""Kind `vllm`: vLLM's OpenAI server. Metric names of vLLM V1, with the pre-0.9 names as fallback.

  load     vllm:num_requests_running, vllm:num_requests_waiting (gauges)
  KV       vllm:kv_cache_usage_perc (older: vllm:gpu_cache_usage_perc), 0..1
  cache    vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (tokens; older:
           vllm:gpu_prefix_cache_queries_total / _hits_total)
  requests vllm:request_success_total (summed over finish reasons)
  pool     vllm:cache_config_info's labels num_gpu_blocks x block_size (the KV pool, in the
           dispatcher's 16-token blocks; the cacheroute policy's cold-home rule needs it)

Cached tokens also arrive per response in usage.prompt_tokens_details.cached_tokens when the
server runs with --enable-prompt-tokens-details (reported only when > 0). The simulated
engine's HTTP API (services.engine.http) exposes these same names.
"""

from __future__ import annotations

from services.backends.base import EngineStats
from services.backends.metrics import first


def read_stats(samples: dict[str, float], stats: EngineStats) -> EngineStats:
    running = first(samples, "vllm:num_requests_running")
    waiting = first(samples, "vllm:num_requests_waiting")
    if running is not None or waiting is not None:
        stats.running, stats.waiting, stats.has_load = int(running or 0), int(waiting or 0), True
    stats.kv_usage = float(first(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") or 0.0)
    blocks = first(samples, "vllm:cache_config_info:num_gpu_blocks")
    if blocks:
        size = first(samples, "vllm:cache_config_info:block_size") or 16.0
        stats.kv_blocks = int(blocks * size // 16)
    queries = first(samples, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
    hits = first(samples, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
    if queries is not None and hits is not None:
        stats.prompt_tokens, stats.cached_tokens, stats.has_counters = int(queries), int(hits), True
        stats.requests = int(first(samples, "vllm:request_success_total") or 0)
    return stats
