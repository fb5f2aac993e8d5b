"""The engine-bound body: fields the dispatcher sets (cache_salt, stream_options) added to the client's bytes."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.backends.http import with_fields

USAGE = {"stream_options": {"include_usage": True}}


@pytest.mark.parametrize("body", [b'{"model":"m","stream":true}', b' {"a": [1, {"b": "}"}]} \n', b'{"x":1\n}'])
def test_new_fields_are_appended_and_the_clients_bytes_kept(body):
    doc = orjson.loads(body)
    out = with_fields(body, doc, {"cache_salt": "t1", **USAGE})
    assert orjson.loads(out) == {**doc, "cache_salt": "t1", **USAGE}
    assert out.startswith(body[:body.rstrip().rfind(b"}")])


@pytest.mark.parametrize("body", [b"{}", b'{"stream_options":{"include_usage":false},"m":1}'])
def test_an_empty_object_or_a_field_it_has_is_serialised_again(body):
    doc = orjson.loads(body)
    out = with_fields(body, doc, dict(USAGE))
    assert orjson.loads(out) == {**doc, **USAGE}
    assert out.count(b"stream_options") == 1


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=5), st.none()), max_size=5),
       st.sampled_from([b"", b" ", b"\n", b"\r\n\t"]))
def test_any_object_gets_the_fields_once(doc, pad):
    body = orjson.dumps(doc) + pad
    out = with_fields(body, doc, {"cache_salt": "s"})
    assert orjson.loads(out) == {**doc, "cache_salt": "s"}
