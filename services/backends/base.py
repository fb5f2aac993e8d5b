"""The backend contract and the parts every kind shares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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


class BackendDown(Exception):
    """A health check or poll failed; `timeout` tells a slow answer from a refusal or an error,
    `answered` an engine that answered "not healthy" (non-2xx /health, NOT_SERVING)."""

    def __init__(self, why: str, *, timeout: bool = False, answered: bool = False) -> None:
        super().__init__(why)
        self.timeout = timeout
        self.answered = answered


class EngineError(Exception):
    """A request to an engine failed; the one classification both front doors map from.

    `kind`: "invalid" (the engine refused the request as malformed), "full" (no capacity
    now), "timeout" (no answer in time), "unavailable" (unreachable or gone: the replica is
    down), "failed" (any other engine error). `code`: the engine's own code, for messages."""

    KINDS = ("invalid", "full", "timeout", "unavailable", "failed")

    def __init__(self, kind: str, code: str, detail: str = "") -> None:
        super().__init__(detail or code)
        self.kind, self.code, self.detail = kind, code, detail


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
    passed through); False for the gRPC engine. Neither method raises anything but
    BackendDown (and CancelledError)."""

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
