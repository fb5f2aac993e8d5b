"""The backend contract and the parts every kind shares: health and load (`check`, `poll`)
and the request itself (`complete` for the OpenAI HTTP API, `generate` for gRPC Generate),
with every engine failure raised as one EngineError classification."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from services.http import oai

KINDS = ("cacheroute", "vllm", "sglang", "llamacpp", "openai")
HTTP_KINDS = frozenset(KINDS[1:])


@dataclass(slots=True)
class EngineStats:
    """What one poll learned about a replica. Counters are cumulative since the engine
    started (`has_counters` False: the engine exposes none)."""

    replica_id: str = ""
    model: str = ""
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    has_counters: bool = False
    has_load: bool = False
    kv_blocks: int = 0          # the KV pool in 16-token blocks (0: not reported; the hold rule needs it)
    preemptions: int = 0


class BackendDown(Exception):
    """A health check or poll failed; `timeout` tells a slow answer from a refusal or an error,
    `answered` an engine that answered "not healthy" (non-2xx /health, NOT_SERVING)."""

    def __init__(self, why: str, *, timeout: bool = False, answered: bool = False) -> None:
        super().__init__(why)
        self.timeout = timeout
        self.answered = answered


class EngineError(Exception):
    """A request to an engine failed; the one classification both front doors map from
    (services.dispatcher.dispatch maps it to an HTTP status and a gRPC status, once).

    `kind`: "invalid" (the engine refused the request as malformed), "full" (no capacity
    now), "denied" (the engine refused the credentials: 401/403), "timeout" (no answer in time), "unreachable" (no connection: nothing was sent),
    "unavailable" (the engine is gone: the replica is down), "failed" (any other engine
    error, a 5xx answer, a broken connection). `code`: the engine's own code; `detail`: what
    follows "replica ID" in the one-line message ("answered HTTP 500", ": queue full"); for
    "invalid" the whole message. `retry`: nothing the engine did can have happened (refused, not
    connected, answered 5xx or "full" before any output), so another replica may be asked
    once. `param`: the request field at fault ("invalid")."""

    KINDS = ("invalid", "full", "denied", "timeout", "unreachable", "unavailable", "failed")

    def __init__(self, kind: str, code: str, detail: str = "", *, retry: bool = False,
                 param: str | None = None) -> None:
        super().__init__(detail or code)
        self.kind, self.code, self.detail, self.retry, self.param = kind, code, detail, retry, param
        self.replica_id = ""                 # set by the dispatcher: the replica that failed
        self.headers: dict[str, str] = {}    # set by the dispatcher: its decision headers (HTTP API)

    @property
    def engine_failure(self) -> bool:
        """Counts against the replica (passive ejection); "invalid" and "full" are answers."""
        return self.kind not in ("invalid", "full")


@dataclass(frozen=True)
class Deadlines:
    """How long a request may wait for its engine, in seconds."""

    connect: float = 3.0          # to a connection (HTTP engines); then one retry elsewhere
    first_byte: float = 60.0      # to the engine's headers, and to a stream's first event
    idle: float = 600.0           # without a byte from the engine mid-response


@dataclass(frozen=True)
class ApiCall:
    """One OpenAI API request as the front door parsed it (services.http.oai)."""

    path: str                         # /v1/chat/completions or /v1/completions
    doc: dict                         # the parsed body
    body: bytes                       # the body exactly as the client sent it
    request: oai.ApiRequest           # the fields routing read
    key: str                          # the routing key (the gRPC engine's cache key)
    deadlines: Deadlines = Deadlines()
    cache_salt: str | None = None     # vllm: the tenant's cache_salt (tenant cache isolation)
    authorization: str | None = field(default=None, repr=False)   # the client's, when forwarded


async def _nothing() -> None:
    return None


@dataclass
class Reply:
    """An engine's answer to an ApiCall, headers known, no byte sent to the client yet.

    `body` is the whole answer, or `events` yields it in blocks (bytes exactly as the engine
    sent them: each network chunk as it came, or whole SSE events when the usage chunk is
    stripped; services.backends.relay) and may raise EngineError mid-stream. `usage`:
    (prompt tokens, cached tokens, completion tokens or None) once seen (streams: set while `events` runs). `close()`
    releases the engine request, cancelling it if unfinished."""

    status: int
    content_type: str
    body: bytes = b""
    events: AsyncIterator[bytes] | None = None
    usage: tuple[int, int, int | None] | None = None
    close: Callable[[], Awaitable[None]] = _nothing


def parse_endpoint(address: str, default_kind: str = "cacheroute") -> tuple[str, str]:
    """`[KIND+]address` -> (kind, address); ValueError (one line) when it does not fit the kind."""
    text = address.strip()
    kind = default_kind
    head, plus, rest = text.partition("+")
    if plus and head in KINDS:
        kind, text = head, rest.strip()
    if kind not in KINDS:
        raise ValueError(f"unknown engine kind {kind!r} (one of {', '.join(KINDS)})")
    is_url = text.startswith(("http://", "https://"))
    if kind == "cacheroute":
        if is_url or "/" in text or ":" not in text:
            raise ValueError(f"a cacheroute replica is host:port, got {address!r}")
        return kind, text
    if not is_url:
        if ":" in text and "/" not in text:
            text = "http://" + text          # host:port of an HTTP engine
        else:
            raise ValueError(f"a {kind} replica is http(s)://host:port, got {address!r}")
    return kind, text.rstrip("/")


class Backend(ABC):
    """One engine replica as the dispatcher and planner see it.

    `http` is True when the replica serves the OpenAI HTTP API itself (its responses are
    passed through); False for the gRPC engine. `check` and `poll` raise nothing but
    BackendDown (and CancelledError); `complete` and `generate` nothing but EngineError."""

    kind: str
    replica_id: str
    address: str
    http: bool

    async def open(self) -> None:
        """Create connections (inside the event loop). Idempotent."""

    async def close(self) -> None:
        """Release connections."""

    @abstractmethod
    async def check(self, timeout: float) -> None:
        """Health only: returns if the replica is healthy, BackendDown otherwise."""

    @abstractmethod
    async def poll(self, timeout: float) -> EngineStats:
        """Health plus load and counters; BackendDown if unhealthy or unreachable."""

    @abstractmethod
    async def complete(self, call: ApiCall) -> Reply:
        """An OpenAI API request: the engine's answer with its headers (Reply); EngineError
        if it failed before any of it could be relayed."""

    @abstractmethod
    def generate(self, request, timeout: float, *, authorization: str | None = None) -> AsyncIterator:
        """A gRPC GenerateRequest as an async iterator of GenerateChunks (`timeout`: the whole
        call); EngineError for any engine failure. Close it (`aclose`) to cancel early."""

    async def models(self, timeout: float) -> list[dict]:
        """The models the replica serves (OpenAI `/v1/models` entries); [] if unknown."""
        return []
