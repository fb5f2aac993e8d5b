"""Kind `llamacpp`: llama.cpp's server (llama-server, or xllamacpp's embedded one) with
metrics enabled (`--metrics`, `endpoint_metrics=True`).

Verified against xllamacpp 2026.10.11549 on this machine (SmolLM2-135M GGUF):
  GET /health            200 {"status":"ok"} once the model is loaded (503 while loading)
  load                   llamacpp:requests_processing (running), llamacpp:requests_deferred (waiting)
  cache                  llamacpp:prompt_tokens_total counts prompt tokens *excluding* cached ones,
                         llamacpp:prompt_tokens_cached_total the cached ones; so prompt tokens =
                         their sum. No request counter and no KV-usage gauge in this build.
  usage                  every response (and, with stream_options.include_usage, a final stream
                         chunk with "choices": []) carries usage.prompt_tokens_details.cached_tokens
The prompt cache is per slot (`n_parallel` slots; a request goes to the slot whose cached
prompt is most similar, `slot_prompt_similarity`), plus a host-RAM prompt cache
(`cache_ram_mib`, 8192 MiB by default) that can restore older prompts into a slot.
"""

from __future__ import annotations

from services.backends.base import EngineStats
from services.backends.metrics import first


def read_stats(samples: dict[str, float], stats: EngineStats) -> EngineStats:
    running = first(samples, "llamacpp:requests_processing")
    waiting = first(samples, "llamacpp:requests_deferred")
    if running is not None or waiting is not None:
        stats.running, stats.waiting, stats.has_load = int(running or 0), int(waiting or 0), True
    stats.kv_usage = float(first(samples, "llamacpp:kv_cache_usage_ratio") or 0.0)
    uncached = first(samples, "llamacpp:prompt_tokens_total")
    cached = first(samples, "llamacpp:prompt_tokens_cached_total")
    if uncached is not None and cached is not None:
        stats.prompt_tokens, stats.cached_tokens, stats.has_counters = int(uncached + cached), int(cached), True
    return stats
