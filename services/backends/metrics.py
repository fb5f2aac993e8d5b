"""Prometheus text -> summed samples.

Engines label their series (vLLM: model_name, engine); a replica's figure is the sum over
every series of a sample name. `_created` samples (counter creation times) are dropped.

The dispatcher parses every replica's page on every stats poll (8 replicas every 0.5 s in
docs/peers.md's runs: 16 pages a second), and prometheus_client's parser costs ~0.8 ms of
CPU for the simulated engine's 54-line page (issue 22: the dispatcher's fixed CPU). So a
page is first read line by line here (a name, an optional `{labels}` block, a value, an
optional timestamp: the text exposition format's sample line); a line this reading does not
take whole (an escape in a label value, a name or value that is not the format's, anything
odd) sends the whole page to prometheus_client's parser, whose result or ValueError is the
answer. tests/unit/test_metrics_parse.py holds the two to the same sums.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families


# numeric labels of info gauges that carry a figure (vLLM's vllm:cache_config_info: the KV pool),
# kept as "<sample name>:<label>" entries (the first series' value)
INFO_LABELS = ("block_size", "num_gpu_blocks")

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# a labels block without escapes: {name="value",...} (a trailing comma allowed, as the parser does)
_LABELS = re.compile(r'\{(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(?:,(?=[a-zA-Z_])|,?(?=\})))*\}')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*)"')


class _Odd(Exception):
    """A line the fast reading does not take: the page goes to prometheus_client's parser."""


def _value(text: str) -> float:
    """The value of a sample line's tail: ` VALUE` or ` VALUE TIMESTAMP` (milliseconds)."""
    parts = text.split(" ")
    if not 2 <= len(parts) <= 3 or parts[0] or (len(parts) == 3 and not _int(parts[2])):
        raise _Odd
    try:
        return float(parts[1])
    except ValueError:
        raise _Odd from None


def _int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _fast_sums(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    if "\r" in text or "\t" in text:
        raise _Odd
    for line in text.split("\n"):
        if not line or line[0] == "#":
            if line[:2] == "# " or line in ("", "#"):
                continue
            raise _Odd
        brace = line.find("{")
        if brace < 0:
            space = line.find(" ")
            if space < 0:
                raise _Odd
            name, labels, rest = line[:space], "", line[space:]
        else:
            end = line.rfind("}")
            name, labels, rest = line[:brace], line[brace:end + 1], line[end + 1:]
            if end < brace or not _LABELS.fullmatch(labels):
                raise _Odd
        if not _NAME.fullmatch(name):
            raise _Odd
        value = _value(rest)
        if name.endswith("_created"):
            continue
        out[name] = out.get(name, 0.0) + value
        if name.endswith("_info"):
            found = dict(_LABEL.findall(labels))
            for label in INFO_LABELS:
                got = found.get(label)
                if got is not None and got.isdigit():
                    out.setdefault(f"{name}:{label}", float(got))
    return out


def _parser_sums(text: str) -> dict[str, float]:
    """The same sums by prometheus_client's parser (the reference; ValueError if it does not parse)."""
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


def sample_sums(text: str) -> dict[str, float]:
    """{sample name: sum over its label sets} of a /metrics page, plus "<name>:<label>" for the
    INFO_LABELS of `_info` samples; ValueError if it does not parse."""
    try:
        return _fast_sums(text)
    except _Odd:
        return _parser_sums(text)


def first(samples: dict[str, float], *names: str) -> float | None:
    """The value of the first of `names` that the page has (new names before old ones)."""
    for name in names:
        if name in samples:
            return samples[name]
    return None
