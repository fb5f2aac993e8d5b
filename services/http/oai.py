"""The OpenAI HTTP API's shapes, shared by the dispatcher's front door and the simulated
engine's HTTP API: request validation, the canonical text of a request (routing keys, services.dispatcher.keys), error bodies, response and SSE chunk rendering.
Pure: no I/O, no clock reads (callers pass `created`).

Validation checks only what routing needs and what would be unsafe to forward; every
other field goes to the engine unchanged (tool calls, logprobs, unknown fields).
Checked: the body is a JSON object; `messages` (chat) is a non-empty list of objects with a
string `role` and a string / null / list `content`; `prompt` (completions) is a string, a
list of strings or token ids; `model`, `cache_salt` strings; `stream` a boolean;
`stream_options` an object whose `include_usage` is a boolean; `max_tokens` /
`max_completion_tokens` integers in 1..max_output_tokens; `n` an integer in 1..128.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string, None, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                out.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return " ".join(out)
    raise ValueError("message content must be a string, null or a list of parts")


def chat_text(messages: list) -> str:
    """The canonical text of a chat: `role: content` lines in order."""
    lines = []
    for m in messages:
        lines.append(f"{m.get('role', '')}: {content_text(m.get('content'))}")
    return "\n".join(lines)


def prompt_text(prompt: Any) -> str:
    """The text of a completion `prompt`: a string, a list of strings (the first), token ids."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first
        if isinstance(first, int):
            return " ".join(str(t) for t in prompt)
        if isinstance(first, list):
            return " ".join(str(t) for t in first)
    raise ValueError("prompt must be a string, a list of strings or a list of token ids")


CHAT = "chat"
COMPLETIONS = "completions"
DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "code", "param"}}` with `status`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.status = status
        self.type = type_
        self.code = code
        self.param = param
        self.headers: dict[str, str] = {}      # e.g. the routing decision of a request that failed upstream

    def body(self) -> bytes:
        return error_body(str(self), self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str | int | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", "invalid_value" if param else "invalid_request", param)


# fields the simulated gRPC engine (kind `cacheroute`) cannot honour; a request setting one is
# refused with a 400 naming them rather than answered as if they were not there
UNSUPPORTED_BY_GENERATE = ("tools", "tool_choice", "functions", "function_call", "response_format", "logprobs",
                           "top_logprobs", "best_of", "logit_bias", "suffix", "echo")


def unsupported_fields(doc: dict) -> list[str]:
    """The fields of a request body that the gRPC engine kind cannot honour (n > 1 included)."""
    names = [name for name in UNSUPPORTED_BY_GENERATE if doc.get(name) not in (None, False, [], {})]
    n = doc.get("n")
    if n is not None and n != 1:
        names.insert(0, "n")
    return names


@dataclass(frozen=True, slots=True)
class ApiRequest:
    endpoint: str               # CHAT or COMPLETIONS
    text: str                   # canonical text (services.dispatcher.keys)
    stream: bool
    include_usage: bool         # the client asked for the final usage chunk
    max_tokens: int | None
    model: str | None
    salt: str | None


def parse_json(body: bytes) -> dict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {str(exc).splitlines()[0]}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return doc


def _int_field(doc: dict, name: str, low: int, high: int) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer", name)
    if not low <= value <= high:
        raise bad_request(f"{name} must be in {low}..{high}, got {value}", name)
    return value


def _str_field(doc: dict, name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{name} must be a string", name)
    return value


def parse_request(doc: dict, endpoint: str, *, max_output_tokens: int = 32_768) -> ApiRequest:
    """Validate an API request body (already a dict); ApiError 400 naming the field."""
    if endpoint == CHAT:
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("messages must be a non-empty array", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise bad_request(f"messages[{i}] must be an object", "messages")
            if not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}].role must be a string", "messages")
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise bad_request(f"messages[{i}].content must be a string, null or an array", "messages")
        text = chat_text(messages)
    else:
        if "prompt" not in doc:
            raise bad_request("prompt is required", "prompt")
        try:
            text = prompt_text(doc["prompt"])
        except ValueError as exc:
            raise bad_request(str(exc), "prompt") from None
    model = _str_field(doc, "model")
    salt = _str_field(doc, "cache_salt")
    stream = doc.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad_request("stream_options.include_usage must be a boolean", "stream_options")
    max_tokens = _int_field(doc, "max_tokens", 1, max_output_tokens)
    completion = _int_field(doc, "max_completion_tokens", 1, max_output_tokens)
    _int_field(doc, "n", 1, 128)
    if not text or text.isspace():     # no words (not text.split(): no list of a long prompt's words)
        raise bad_request("the prompt is empty", "messages" if endpoint == CHAT else "prompt")
    return ApiRequest(endpoint, text, stream, include_usage and stream,
                      max_tokens if max_tokens is not None else completion, model, salt)


def usage_of(doc: Any) -> tuple[int, int, int | None] | None:
    """(prompt tokens, cached tokens, completion tokens) of a response or chunk's `usage`, None if
    it has none; completion tokens None when the usage does not say (or says something negative)."""
    if not isinstance(doc, dict):
        return None
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    completion = usage.get("completion_tokens")
    return (prompt, cached if isinstance(cached, int) and 0 <= cached <= prompt else 0,
            completion if isinstance(completion, int) and completion >= 0 else None)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class Renderer:
    """Responses and SSE chunks of one request, OpenAI's shapes for chat and completions."""

    def __init__(self, endpoint: str, model: str, rid: str, created: int) -> None:
        self.chat = endpoint == CHAT
        self.model = model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + rid
        self.created = created
        self._first = True

    def _envelope(self, choices: list, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, text: str, finish_reason: str | None = None) -> bytes:
        if self.chat:
            delta: dict = {"content": text} if text or not finish_reason else {}
            if self._first:
                delta["role"] = "assistant"
                self._first = False
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            doc = self._envelope([choice], "chat.completion.chunk")
        else:
            doc = self._envelope([{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
                                 "text_completion")
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def usage_chunk(self, usage_doc: dict) -> bytes:
        doc = self._envelope([], "chat.completion.chunk" if self.chat else "text_completion")
        doc["usage"] = usage_doc
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def error_chunk(self, message: str, type_: str, code: int | str) -> bytes:
        return b"data: " + error_body(message, type_, code) + b"\n\n"

    def full(self, text: str, finish_reason: str, usage_doc: dict) -> bytes:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            doc = self._envelope([choice], "chat.completion")
        else:
            doc = self._envelope([{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
                                 "text_completion")
        doc["usage"] = usage_doc
        return orjson.dumps(doc)
