"""Open-loop OpenAI-API load: send prepared requests at their scheduled times, whatever the
server's state, and record what the client sees (bench/peers.py).

Open loop: every request is sent at its own scheduled offset from the start, not when an
earlier one finished, so a slow router meets the same offered load as a fast one (a closed
loop would slow the load down exactly where the router is worst). TTFT is measured from the
*scheduled* time to the first streamed content chunk, so a client that falls behind its
schedule is charged to the system under test only if the system caused it; the client's own
lag (actual send - scheduled) is recorded per request so a saturated client shows.

Streaming is parsed by hand from aiohttp's line reader (`data: {...}` SSE lines, one JSON
document per chunk, `data: [DONE]` at the end) instead of with the `openai` SDK: the SDK builds
a pydantic object per chunk, which at a few hundred streamed chunks per second costs the
2-core machine more CPU than the routers under test. What is read per request: the first
chunk with non-empty content (TTFT), the final usage chunk (`prompt_tokens`,
`prompt_tokens_details.cached_tokens`; requested with `stream_options.include_usage`), the
`x-cacheroute-replica` and `x-cacheroute-reason` response headers when a CacheRoute dispatcher
answers, and the HTTP
status plus a one-line error otherwise.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import aiohttp
import orjson

REPLICA_HEADER = "x-cacheroute-replica"
REASON_HEADER = "x-cacheroute-reason"


@dataclass(slots=True)
class Outcome:
    rid: int
    at: float                 # scheduled offset from the start, seconds
    lag: float = 0.0          # actual send - scheduled, seconds
    ttft: float | None = None  # first content chunk - scheduled, seconds
    latency: float | None = None
    status: int = 0           # HTTP status (0: no response)
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    replica: str = ""
    reason: str = ""          # x-cacheroute-reason (planned / cold / fallback) when CacheRoute answers

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.ttft is not None


def _first_content(doc: dict) -> bool:
    for choice in doc.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return True
        if choice.get("text"):
            return True
    return False


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes, out: Outcome, start: float,
                   timeout: float) -> None:
    """POST one streaming chat completion and fill `out` (never raises for HTTP trouble)."""
    out.lag = time.perf_counter() - start - out.at
    scheduled = start + out.at
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            out.status = resp.status
            out.replica = resp.headers.get(REPLICA_HEADER, "")
            out.reason = resp.headers.get(REASON_HEADER, "")
            if resp.status != 200:
                text = (await resp.read())[:300].decode("utf-8", "replace")
                out.error = " ".join(text.split()) or f"HTTP {resp.status}"
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                try:
                    doc = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    out.error = "unparseable SSE chunk"
                    break
                if "error" in doc:
                    err = doc["error"]
                    out.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
                    break
                if out.ttft is None and _first_content(doc):
                    out.ttft = time.perf_counter() - scheduled
                usage = doc.get("usage")
                if isinstance(usage, dict):
                    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    out.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    out.cached_tokens = int(details.get("cached_tokens") or 0)
            out.latency = time.perf_counter() - scheduled
            if out.ttft is None and not out.error:
                out.error = "stream ended without content"
    except asyncio.TimeoutError:
        out.error = f"timeout after {timeout:g}s"
    except aiohttp.ClientError as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:300]


async def replay(url: str, schedule: Sequence[tuple[int, float, bytes]], *, timeout: float = 120.0,
                 progress: Callable[[int, int], None] | None = None,
                 at_offset: tuple[float, Callable[[], None]] | None = None) -> list[Outcome]:
    """Send each (rid, offset seconds, body) to `url` at its offset; the outcomes in schedule order.

    `progress(sent, done)` is called about twice a second; `at_offset=(t, fn)` calls fn once
    when the schedule reaches offset t (bench/peers.py snapshots counters at the end of the
    warm-up there).
    """
    outcomes = [Outcome(rid, at) for rid, at, _ in schedule]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    done = 0

    async with aiohttp.ClientSession(connector=connector) as session:
        tasks: list[asyncio.Task] = []

        def finished(_: asyncio.Task) -> None:
            nonlocal done
            done += 1

        start = time.perf_counter()
        last_report = start
        mark = at_offset
        for i, (_, at, body) in enumerate(schedule):
            if mark is not None and at >= mark[0]:
                delay = start + mark[0] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                mark[1]()
                mark = None
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send_one(session, url, body, outcomes[i], start, timeout))
            task.add_done_callback(finished)
            tasks.append(task)
            now = time.perf_counter()
            if progress is not None and now - last_report > 0.5:
                progress(i + 1, done)
                last_report = now
        if mark is not None:
            mark[1]()
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.5)
            if progress is not None:
                progress(len(schedule), done)
    return outcomes
