"""Traffic driver: replay a list of Requests through the dispatchers' Generate, open loop.

Each request is sent at its arrival time (seconds from the start of the run) whatever
happened to the earlier ones, as real clients do; a concurrency cap bounds the streams in
flight, and a request that has to wait for a slot records how late it went out. Requests
carry their explicit routing key and their prompt as chained block hashes plus a token
count (what traces and the synthetic workloads hold), so the engines see the same prefix
structure the simulator does. Output length is capped (`max_tokens`): routing effects
(hit rate, TTFT) are decided at prefill, and every output token is one streamed message
through two gRPC hops, which on a small machine costs more CPU than the engines.

Metrics (services.core.metrics, SPEC section 6): hit rate is token-weighted from the first
chunks' cached_tokens / prompt_tokens; TTFT is the engine's (model seconds: arrival at the
replica's queue -> end of the step that finished the prefill), so it does not include
gRPC hops and is independent of the engines' time scale.

Comparing two routing modes on one live stack: caches cannot be flushed between runs, so
`relabel` gives a second copy of the same traffic (same arrivals, lengths and key
popularity) disjoint keys and block hashes; neither copy can reuse the other's cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import grpc

from cacheroute.v1 import common_pb2
from clients.client import AsyncCacheRouteClient
from services.core.metrics import hit_rate, imbalance, percentile
from services.core.request import BLOCK_TOKENS, Request

MASK63 = (1 << 63) - 1
REASONS = {common_pb2.ROUTE_REASON_PLANNED: "planned", common_pb2.ROUTE_REASON_COLD: "cold",
           common_pb2.ROUTE_REASON_FALLBACK: "fallback"}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one request."""

    rid: int
    key: str
    arrival: float            # scheduled send time, seconds from the run's start
    late: float               # how much later it actually went out (waiting for a slot)
    replica: str = ""
    reason: str = ""          # planned / cold / fallback
    plan_version: int = 0
    ttft: float = math.nan    # engine TTFT, model seconds
    cached_tokens: int = 0
    prompt_tokens: int = 0
    latency: float = math.nan  # wall seconds from send to the last chunk
    error: str = ""


def relabel(requests: Sequence[Request], tag: str) -> list[Request]:
    """The same requests with keys `tag:key` and block hashes XORed with a tag-derived salt.

    XOR with one constant keeps equal hashes equal and distinct ones distinct, so the
    prefix-sharing structure is unchanged while no block matches the original's."""
    salt = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little") & MASK63
    salted: dict[int, tuple[int, ...]] = {}
    out = []
    for r in requests:
        blocks = salted.get(id(r.blocks))
        if blocks is None:
            blocks = salted[id(r.blocks)] = tuple(h ^ salt for h in r.blocks)
        out.append(Request(r.rid, r.arrival, f"{tag}:{r.key}", r.prompt_tokens, r.output_tokens, blocks))
    return out


def window(requests: Sequence[Request], start: float, end: float) -> list[Request]:
    """Requests arriving in [start, end), re-timed to start at 0."""
    return [Request(r.rid, r.arrival - start, r.key, r.prompt_tokens, r.output_tokens, r.blocks)
            for r in requests if start <= r.arrival < end]


async def send_one(client: AsyncCacheRouteClient, r: Request, *, max_tokens: int, late: float,
                   timeout: float) -> Outcome:
    """One Generate call, consumed to the end."""
    blocks = r.blocks[: -(-r.prompt_tokens // BLOCK_TOKENS)]   # at most the prompt's blocks
    started = time.monotonic()
    first = None
    try:
        async for chunk in client.generate(blocks=blocks, prompt_tokens=r.prompt_tokens,
                                           max_tokens=max(1, min(max_tokens, r.output_tokens)), key=r.key,
                                           request_id=str(r.rid), timeout=timeout):
            if first is None:
                first = chunk
    except grpc.RpcError as err:
        code = err.code().name if hasattr(err, "code") else "ERROR"  # type: ignore[attr-defined]
        return Outcome(r.rid, r.key, r.arrival, late, error=code)
    if first is None:
        return Outcome(r.rid, r.key, r.arrival, late, error="EMPTY_STREAM")
    d = first.route
    return Outcome(r.rid, r.key, r.arrival, late, replica=first.replica_id or d.replica_id,
                   reason=REASONS.get(d.reason, "unspecified"), plan_version=d.plan_version,
                   ttft=first.ttft_seconds, cached_tokens=first.cached_tokens, prompt_tokens=first.prompt_tokens,
                   latency=time.monotonic() - started)


def spread_clients(dispatchers: Sequence[str], **kwargs: Any) -> list[AsyncCacheRouteClient]:
    """One client per dispatcher, each failing over to the others: `drive` alternates between
    them so every dispatcher carries traffic (a single client sticks to its first address)."""
    n = len(dispatchers)
    return [AsyncCacheRouteClient([dispatchers[(i + j) % n] for j in range(n)], **kwargs) for i in range(n)]


async def drive(clients: Sequence[AsyncCacheRouteClient], requests: Sequence[Request], *, max_tokens: int = 16,
                concurrency: int = 256, timeout: float = 60.0,
                on_result: Callable[[Outcome], None] | None = None, send=None) -> list[Outcome]:
    """Send every request at its arrival time, request i through clients[i % len(clients)];
    outcomes in completion order. `send` is how one request goes out (default `send_one`,
    gRPC Generate; clients.httpload.http_send_one for the OpenAI HTTP API)."""
    send = send or send_one
    if concurrency < 1 or not clients:
        raise ValueError("need concurrency >= 1 and at least one client")
    slots = asyncio.Semaphore(concurrency)
    outcomes: list[Outcome] = []
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(client: AsyncCacheRouteClient, r: Request, late: float) -> None:
        try:
            outcome = await send(client, r, max_tokens=max_tokens, late=late, timeout=timeout)
        finally:
            slots.release()
        outcomes.append(outcome)
        if on_result is not None:
            on_result(outcome)

    tasks = []
    for i, r in enumerate(sorted(requests, key=lambda q: q.arrival)):
        delay = start + r.arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await slots.acquire()
        late = max(0.0, loop.time() - start - r.arrival)
        tasks.append(asyncio.create_task(one(clients[i % len(clients)], r, late)))
    await asyncio.gather(*tasks)
    return outcomes


@dataclass
class Summary:
    """A run's figures (SPEC section 6) plus what the dispatchers said about their decisions."""

    requests: int
    errors: int
    hit_rate: float
    ttft_p50: float
    ttft_p99: float
    plan_versions: list[int]
    by_reason: dict[str, int]
    by_replica: dict[str, int]
    imbalance: float
    max_late: float
    error_codes: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def summarize(outcomes: Sequence[Outcome], replicas: Sequence[str] = ()) -> Summary:
    """Figures over `outcomes`; `replicas` lists every replica so idle ones count in the imbalance."""
    ok = [o for o in outcomes if not o.error]
    errors = Counter(o.error for o in outcomes if o.error)
    per_replica = Counter(o.replica for o in ok)
    for rid in replicas:
        per_replica.setdefault(rid, 0)
    ttft = [o.ttft for o in ok]
    return Summary(
        requests=len(outcomes), errors=sum(errors.values()),
        hit_rate=hit_rate([o.cached_tokens for o in ok], [o.prompt_tokens for o in ok]),
        ttft_p50=percentile(ttft, 50), ttft_p99=percentile(ttft, 99),
        plan_versions=sorted({o.plan_version for o in ok}),
        by_reason=dict(sorted(Counter(o.reason for o in ok).items())),
        by_replica=dict(sorted(per_replica.items())),
        imbalance=imbalance(list(per_replica.values())) if per_replica else math.nan,
        max_late=max((o.late for o in outcomes), default=0.0), error_codes=dict(errors))
