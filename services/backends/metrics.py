"""Prometheus text -> summed samples, with prometheus_client's own parser.

Engines label their series (vLLM: model_name, engine); a replica's figure is the sum over
every series of a sample name. `_created` samples (counter creation times) are dropped.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


# numeric labels of info gauges that carry a figure (vLLM's vllm:cache_config_info: the KV pool),
# kept as "<sample name>:<label>" entries (the first series' value)
INFO_LABELS = ("block_size", "num_gpu_blocks")


def sample_sums(text: str) -> dict[str, float]:
    """{sample name: sum over its label sets} of a /metrics page, plus "<name>:<label>" for the
    INFO_LABELS of `_info` samples; ValueError if it does not parse."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):
                continue
            out[name] = out.get(name, 0.0) + float(sample.value)
            if name.endswith("_info"):
                for label in INFO_LABELS:
                    value = sample.labels.get(label)
                    if value is not None and value.isdigit():
                        out.setdefault(f"{name}:{label}", float(value))
    return out


def first(samples: dict[str, float], *names: str) -> float | None:
    """The value of the first of `names` that the page has (new names before old ones)."""
    for name in names:
        if name in samples:
            return samples[name]
    return None
