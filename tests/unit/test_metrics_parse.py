"""The fast /metrics reading (services.backends.metrics) against prometheus_client's parser."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.backends import metrics
from services.backends.metrics import _fast_sums, _Odd, _parser_sums, sample_sums
from tests.unit.test_backends import LLAMACPP_PAGE, OLD_VLLM_PAGE, SGLANG_PAGE, VLLM_PAGE

# the simulated engine's page (services.engine --http-port), as served on the development machine
SIM_PAGE = "".join([
    "# HELP vllm:num_requests_running requests in the running batch\n",
    "# TYPE vllm:num_requests_running gauge\n",
    'vllm:num_requests_running{model_name="llama3-8b-h100"} 2.0\n',
    "# TYPE vllm:cache_config_info gauge\n",
    'vllm:cache_config_info{block_size="16",model_name="llama3-8b-h100",num_gpu_blocks="27500"} 1.0\n',
    "# TYPE vllm:prefix_cache_queries_total counter\n",
    'vllm:prefix_cache_queries_total{model_name="llama3-8b-h100"} 1234.0\n',
    "# HELP vllm:time_to_first_token_seconds time to first token (model seconds)\n",
    "# TYPE vllm:time_to_first_token_seconds histogram\n",
    *[f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="llama3-8b-h100"}} {n}.0\n'
      for le, n in (("0.001", 0), ("0.5", 3), ("+Inf", 7))],
    'vllm:time_to_first_token_seconds_sum{model_name="llama3-8b-h100"} 1.25\n',
    'vllm:time_to_first_token_seconds_count{model_name="llama3-8b-h100"} 7.0\n',
])


@pytest.mark.parametrize("page", [SIM_PAGE, VLLM_PAGE, OLD_VLLM_PAGE, SGLANG_PAGE, LLAMACPP_PAGE, "",
                                  "a 1\nb{x=\"1\"} 2 1700000000000\na{y=\"},{\"} -3e2\n",
                                  'up{a="1",} +Inf\nup NaN\n'])
def test_the_fast_reading_takes_these_pages_and_agrees_with_the_parser(page):
    assert _same(_fast_sums(page), _parser_sums(page))


def _same(a: dict, b: dict) -> bool:
    """Equal sums (NaN equal to NaN: a page's NaN, or +Inf and -Inf summed)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


@pytest.mark.parametrize("page", [
    'a{x="esc\\"aped"} 1\n',          # an escape in a label value
    "a\t1\n",                          # a tab
    "a 1\r\n",                         # CRLF
    "a{x=1} 2\n",                      # an unquoted label value
    "a notanumber\n",                  # a value that is none
    "1a 2\n",                          # not a metric name
    "a\n",                             # no value
])
def test_odd_lines_go_to_the_parser(page):
    with pytest.raises(_Odd):
        _fast_sums(page)


def test_an_odd_page_gets_the_parsers_answer_or_its_error():
    assert sample_sums('a{x="esc\\"aped"} 1\na{x="b"} 2\n') == {"a": 3.0}
    with pytest.raises(ValueError):
        sample_sums("a notanumber\n")


_names = st.sampled_from(["vllm:num_requests_running", "x_total", "x_created", "v_info", "h_bucket", "up"])
_labels = st.dictionaries(st.sampled_from(["model_name", "le", "block_size", "num_gpu_blocks", "engine"]),
                          st.text(alphabet="abc019.+}{,= ", max_size=6), max_size=3)
_values = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=False, width=32).map(repr),
                    st.sampled_from(["+Inf", "-Inf", "1e3"]))


@given(st.lists(st.tuples(_names, _labels, _values, st.booleans()), max_size=30))
def test_random_pages_sum_the_same(lines):
    page = ""
    for name, labels, value, typed in lines:
        if typed:
            page += f"# TYPE {name} gauge\n"
        block = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        page += f"{name}{block} {value}\n"
    assert _same(sample_sums(page), _parser_sums(page)) and _same(_fast_sums(page), _parser_sums(page))


def test_the_module_keeps_its_interface():
    assert metrics.first({"a": 1.0}, "b", "a") == 1.0 and metrics.first({}, "a") is None
