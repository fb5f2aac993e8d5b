"""Routing keys and request validation of the OpenAI HTTP API (services.dispatcher.keys, services.http.oai)."""

from __future__ import annotations

import pytest

from services.http import oai
from services.core import routing
from services.dispatcher.keys import request_key, scoped_key

SYSTEM = "You are the helpful assistant of Acme. " + " ".join(f"rule{i}" for i in range(80))


def chat(*turns):
    return [{"role": r, "content": c} for r, c in turns]


def test_requests_sharing_a_system_prompt_share_a_key_and_match_the_grpc_prompt_source():
    a = oai.chat_text(chat(("system", SYSTEM), ("user", "first question")))
    b = oai.chat_text(chat(("system", SYSTEM), ("user", "another question entirely")))
    assert request_key(a, None) == request_key(b, None) == routing.key_from_prompt(a)
    other = oai.chat_text(chat(("system", SYSTEM.replace("Acme", "Beta")), ("user", "first question")))
    assert request_key(other, None) != request_key(a, None)


def test_the_canonical_text_keeps_roles_order_and_text_parts():
    text = oai.chat_text([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [{"type": "text", "text": "look"},
                                                       {"type": "image_url", "image_url": {"url": "x"}}]},
                          {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}])
    assert text == "system: be brief\nuser: look [image_url]\nassistant: "


def test_tenant_and_salt_scope_the_key_and_the_header_wins():
    text = oai.chat_text(chat(("system", SYSTEM)))
    plain = request_key(text, None)
    assert request_key(text, None, tenant="acme") == f"acme/{plain}"
    salted = request_key(text, None, salt="s3cret")
    assert salted.startswith(plain + "~") and "s3cret" not in salted
    assert request_key(text, "session-7", tenant="acme") == "acme/session-7"
    assert request_key(text, None, tenant="a") != request_key(text, None, tenant="b")
    with pytest.raises(ValueError):
        scoped_key("x" * 300)


@pytest.mark.parametrize("prompt,text", [("hello world", "hello world"), (["first", "second"], "first"),
                                         ([1, 2, 3], "1 2 3"), ([[4, 5], [6]], "4 5")])
def test_completion_prompts(prompt, text):
    assert oai.parse_request({"prompt": prompt}, oai.COMPLETIONS).text == text


@pytest.mark.parametrize("doc,param", [
    ({}, "messages"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"messages": [1]}, "messages"), ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "model": 3}, "model"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": []}, "stream_options"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}, "stream_options"),
    ({"messages": [{"role": "user", "content": "x"}], "cache_salt": 1}, "cache_salt"),
])
def test_bad_chat_fields_are_400_naming_the_field(doc, param):
    with pytest.raises(oai.ApiError) as info:
        oai.parse_request(doc, oai.CHAT, max_output_tokens=4096)
    assert info.value.status == 400 and info.value.param == param and "\n" not in str(info.value)


def test_bad_json_and_non_objects():
    for body in (b"{", b"[]", b"\xff", b"null", b'"x"'):
        with pytest.raises(oai.ApiError) as info:
            oai.parse_json(body)
        assert info.value.status == 400


def test_usage_is_read_from_bodies_and_chunks():
    assert oai.usage_of({"usage": oai.usage(100, 3, 64)}) == (100, 64, 3)
    assert oai.usage_of({"usage": {"prompt_tokens": 10}}) == (10, 0, None)    # vLLM omits details when 0
    assert oai.usage_of({"usage": None}) is None and oai.usage_of([]) is None
    assert oai.usage_of({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}}) == (5, 0, None)
    assert oai.usage_of({"usage": {"prompt_tokens": 5, "completion_tokens": -2}}) == (5, 0, None)


def test_stream_usage_flag_only_counts_for_streams():
    base = {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}
    assert not oai.parse_request(base, oai.CHAT).include_usage
    assert oai.parse_request({**base, "stream": True}, oai.CHAT).include_usage
