"""Bad input over the dispatcher's OpenAI HTTP API, systematically (hypothesis).

One dispatcher with an API key in front of one simulated engine (kind vllm, over the
engine's HTTP API), in a background event loop. Malformed JSON, wrong field types and
values, bodies over the limit, unknown paths and methods, missing or wrong keys, huge
max_tokens, invalid routing-key headers: each must get its status with an OpenAI-shaped
one-line error, route nothing (the router's counters and telemetry buffer, the engine's
counters unchanged) and leave /health at 200.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from services.auth import KeyRing
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.dispatcher.http import HttpConfig
from services.model import parse_replicas
from services.engine.service import EngineConfig, EngineService
from services.rpc import ServerConfig

LIMIT = 64 * 1024
MAX_OUTPUT = 4096
KEY = "sk-test"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}


class Stack:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.engine, self.dispatcher = self.run(self._up())
        self.url = self.dispatcher.http_url

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _up(self):
        engine = await EngineService(EngineConfig(server=ServerConfig(name="engine", port=0), replica_id="e0",
                                                  time_scale=0.01, http_port=0)).start()
        dispatcher = await DispatcherService(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0=vllm+{engine.http_url}"),
            poll_interval=0.1, poll_timeout=0.5, seed=1, keyring=KeyRing({KEY: "t"}),
            http=HttpConfig(port=0, max_body_bytes=LIMIT, max_output_tokens=MAX_OUTPUT))).start()
        for _ in range(100):
            if dispatcher.router.state.healthy[0]:
                break
            await asyncio.sleep(0.05)
        return engine, dispatcher

    def close(self) -> None:
        self.run(self.dispatcher.stop(0))
        self.run(self.engine.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def counters(self) -> tuple:
        r, m = self.dispatcher.router, self.engine.model
        return (r.routed, tuple(r.counts), len(r.telemetry), tuple(r.outstanding), m.requests, m.prompt_tokens,
                tuple(self.dispatcher.http.usage.requests))

    def send(self, method: str, path: str, body: bytes | None = None, key: str | None = KEY,
             headers: dict | None = None) -> tuple[int, dict, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        if key is not None:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    yield s
    s.close()


def expect_error(stack: Stack, status: int, method: str, path: str, body: bytes | None = None, **kw) -> dict:
    before = stack.counters()
    got, headers, data = stack.send(method, path, body, **kw)
    assert got == status, (got, data[:300])
    doc = json.loads(data)
    error = doc["error"]
    assert set(error) >= {"message", "type", "code"} and isinstance(error["message"], str)
    assert error["message"] and "\n" not in error["message"] and len(error["message"]) < 400
    assert headers.get("Content-Type", "").startswith("application/json")
    assert "x-cacheroute-replica" not in {h.lower() for h in headers}
    assert stack.counters() == before, "a rejected request was routed or counted"
    assert stack.send("GET", "/health", key=None)[0] == 200
    return error


def test_a_good_request_is_served(stack):
    status, headers, data = stack.send("POST", "/v1/chat/completions", json.dumps(GOOD).encode())
    assert status == 200 and json.loads(data)["usage"]["prompt_tokens"] > 0
    assert headers["x-cacheroute-replica"] == "e0"


@FUZZ
@given(st.binary(max_size=300))
def test_malformed_json_is_400(stack, body):
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        return                              # a valid object: the field tests cover it
    error = expect_error(stack, 400, "POST", "/v1/chat/completions", body)
    assert error["type"] == "invalid_request_error"


NOT_BOOL = st.one_of(st.integers(), st.text(max_size=5), st.lists(st.booleans(), max_size=2), st.floats(allow_nan=False, allow_infinity=False))
NOT_INT = st.one_of(st.text(max_size=5), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.lists(st.integers(), max_size=2))
NOT_STR = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
BAD_FIELDS = st.one_of(
    st.tuples(st.just("messages"), st.one_of(NOT_STR.filter(lambda v: not isinstance(v, list)), st.text(max_size=5),
                                             st.just([]), st.lists(st.one_of(st.integers(), st.text()), min_size=1,
                                                                   max_size=3))),
    st.tuples(st.just("messages"), st.lists(st.fixed_dictionaries({"role": NOT_STR, "content": st.text()}),
                                            min_size=1, max_size=2)),
    st.tuples(st.just("messages"), st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                                   "content": st.one_of(st.integers(), st.booleans(),
                                                                                        st.floats(allow_nan=False, allow_infinity=False))}),
                                            min_size=1, max_size=2)),
    st.tuples(st.just("stream"), NOT_BOOL),
    st.tuples(st.just("model"), NOT_STR),
    st.tuples(st.just("cache_salt"), NOT_STR),
    st.tuples(st.just("max_tokens"), st.one_of(NOT_INT, st.integers(max_value=0), st.integers(min_value=MAX_OUTPUT + 1))),
    st.tuples(st.just("max_completion_tokens"), st.one_of(NOT_INT, st.integers(min_value=MAX_OUTPUT + 1))),
    st.tuples(st.just("n"), st.one_of(NOT_INT, st.integers(max_value=0), st.integers(min_value=129))),
    st.tuples(st.just("stream_options"), st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2))),
    st.tuples(st.just("stream_options"), st.fixed_dictionaries({"include_usage": NOT_BOOL})),
)


@FUZZ
@given(BAD_FIELDS)
def test_wrong_field_types_and_values_are_400(stack, field):
    name, value = field
    body = json.dumps({**GOOD, name: value}).encode()
    error = expect_error(stack, 400, "POST", "/v1/chat/completions", body)
    assert error["param"] == name or (name == "max_completion_tokens" and error["param"] == name)


@FUZZ
@given(st.sampled_from(["prompt", None]), st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.just([]),
                                                    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)))
def test_bad_completion_prompts_are_400(stack, name, value):
    body = {"model": "m", "max_tokens": 2} if name is None else {"model": "m", "prompt": value}
    expect_error(stack, 400, "POST", "/v1/completions", json.dumps(body).encode())


def test_huge_max_tokens_is_400(stack):
    error = expect_error(stack, 400, "POST", "/v1/chat/completions", json.dumps({**GOOD, "max_tokens": 10**12}).encode())
    assert error["param"] == "max_tokens" and str(MAX_OUTPUT) in error["message"]


@pytest.mark.parametrize("size", [LIMIT + 1, 4 * LIMIT])
def test_a_body_over_the_limit_is_413(stack, size):
    body = json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * size}]}).encode()
    assert expect_error(stack, 413, "POST", "/v1/chat/completions", body)["code"] == "request_too_large"


@FUZZ
@given(st.text(alphabet=st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=30))
def test_unknown_paths_are_404(stack, tail):
    assert expect_error(stack, 404, "POST", f"/v1/x{tail}", json.dumps(GOOD).encode())["type"] == "not_found_error"


def test_wrong_methods_are_405(stack):
    expect_error(stack, 405, "GET", "/v1/chat/completions")
    expect_error(stack, 405, "DELETE", "/v1/models")


@FUZZ
@given(st.one_of(st.none(), st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40)))
def test_missing_or_wrong_api_keys_are_401(stack, key):
    if key == KEY:
        return
    error = expect_error(stack, 401, "POST", "/v1/chat/completions", json.dumps(GOOD).encode(), key=key)
    assert error["type"] == "authentication_error" and KEY not in error["message"]
    expect_error(stack, 401, "GET", "/v1/models", key=key)


def test_a_non_bearer_authorization_is_401(stack):
    expect_error(stack, 401, "POST", "/v1/chat/completions", json.dumps(GOOD).encode(), key=None,
                 headers={"Authorization": f"Basic {KEY}"})


def test_an_oversized_routing_key_header_is_400(stack):
    error = expect_error(stack, 400, "POST", "/v1/chat/completions", json.dumps(GOOD).encode(),
                         headers={"x-cacheroute-key": "k" * 300})
    assert error["param"] == "x-cacheroute-key"


@pytest.mark.parametrize("raw", [b"k\xff\xfe", b"\xc3\x28key", b"ok\x80"])
def test_invalid_utf8_in_the_routing_key_header_is_400(stack, raw):
    """Issue 20: invalid UTF-8 in x-cacheroute-key was a 500 and a traceback."""
    error = expect_error(stack, 400, "POST", "/v1/chat/completions", json.dumps(GOOD).encode(),
                         headers={"x-cacheroute-key": raw})
    assert error["param"] == "x-cacheroute-key"


def test_still_serving_after_everything(stack):
    test_a_good_request_is_served(stack)


PROTOCOL_ERRORS = [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Bad\x01: y\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n  b\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
]


def test_protocol_errors_are_openai_shaped_400s_and_one_log_line(caplog):
    """Issue 20: protocol errors answered text/plain and each logged a traceback."""
    import asyncio
    import logging

    from aiohttp import web

    from services.http.server import start_http

    async def main():
        running = await start_http(web.Application(), "127.0.0.1", 0)
        try:
            answers = []
            for raw in PROTOCOL_ERRORS * 10:
                reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
                writer.write(raw)
                await writer.drain()
                answers.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
            return answers
        finally:
            await running.stop()

    with caplog.at_level(logging.DEBUG):
        answers = asyncio.run(main())
    for raw, answer in zip(PROTOCOL_ERRORS * 10, answers):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1].startswith(b"4"), (raw[:60], head[:80])
        assert b"application/json" in head.lower(), head
        error = json.loads(body)["error"]
        assert error["message"] and "\n" not in error["message"] and error["code"] == "bad_http_request"
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in records), "a protocol error logged a traceback"
    assert 1 <= len(records) <= 3, [r.getMessage() for r in records]
