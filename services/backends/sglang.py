"""Kind `sglang`: SGLang's server (run it with --enable-metrics; --enable-cache-report puts
cached tokens into each response's usage).

  load     sglang:num_running_reqs, sglang:num_queue_reqs (gauges)
  KV       sglang:token_usage (0..1)
  cache    sglang:prompt_tokens_total and sglang:cached_tokens_total when the server has
           them (counters); sglang:cache_hit_rate alone is a gauge and is not used as a counter
  requests sglang:num_requests_total
"""

from __future__ import annotations

from services.backends.base import EngineStats
from services.backends.metrics import first


def read_stats(samples: dict[str, float], stats: EngineStats) -> EngineStats:
    running = first(samples, "sglang:num_running_reqs")
    waiting = first(samples, "sglang:num_queue_reqs")
    if running is not None or waiting is not None:
        stats.running, stats.waiting, stats.has_load = int(running or 0), int(waiting or 0), True
    stats.kv_usage = float(first(samples, "sglang:token_usage") or 0.0)
    prompt = first(samples, "sglang:prompt_tokens_total")
    cached = first(samples, "sglang:cached_tokens_total")
    if prompt is not None and cached is not None:
        stats.prompt_tokens, stats.cached_tokens, stats.has_counters = int(prompt), int(cached), True
        stats.requests = int(first(samples, "sglang:num_requests_total") or 0)
    return stats
