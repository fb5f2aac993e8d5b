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
answers, the `x-engine-replica` header the simulated engine sets (the peers pass it through, so
the harness knows which replica served each request under every router), and the HTTP status
plus a one-line error otherwise.

A tier of routers: `replay` takes one URL or a `Rotation` of several (router instances behind a
Kubernetes Service): each request goes to the next live instance, round robin, at its send
time; the harness takes an instance out of the rotation while it restarts, or for good when
it is killed, as a Service does when an endpoint goes unready. `events` run callbacks at given
offsets of the schedule (snapshots, restarts, kills).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import aiohttp
import orjson

REPLICA_HEADER = "x-cacheroute-replica"
REASON_HEADER = "x-cacheroute-reason"
ENGINE_HEADER = "x-engine-replica"


class Rotation:
    """Router instances a client spreads requests over, round robin over the live ones."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("a rotation needs at least one URL")
        self.urls = list(urls)
        self.live = list(range(len(self.urls)))
        self._next = 0

    def pick(self) -> tuple[int, str]:
        """(instance index, URL) of the next live instance; (-1, "") when none is live."""
        if not self.live:
            return -1, ""
        i = self.live[self._next % len(self.live)]
        self._next += 1
        return i, self.urls[i]

    def remove(self, i: int) -> None:
        if i in self.live:
            self.live.remove(i)

    def restore(self, i: int, url: str | None = None) -> None:
        if url is not None:
            self.urls[i] = url
        if i not in self.live:
            self.live.append(i)
            self.live.sort()


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
    engine: str = ""          # x-engine-replica: the simulated engine that served it (any router)
    target: int = 0           # the router instance it was sent to (Rotation index)

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
            out.engine = resp.headers.get(ENGINE_HEADER, "")
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


async def replay(url: str | Rotation, schedule: Sequence[tuple[int, float, bytes]], *, timeout: float = 120.0,
                 progress: Callable[[int, int], None] | None = None,
                 at_offset: tuple[float, Callable[[], Any]] | None = None,
                 events: Sequence[tuple[float, Callable[[], Any]]] = (), path: str = "") -> list[Outcome]:
    """Send each (rid, offset seconds, body) to `url` (or the next live instance of a Rotation,
    with `path` appended) at its offset; the outcomes in schedule order.

    `progress(sent, done)` is called about twice a second; `at_offset=(t, fn)` and each of
    `events` call fn once when the schedule reaches offset t (bench/peers.py snapshots
    counters at the end of the warm-up, restarts and kills router instances); a coroutine fn
    runs as a task, awaited before replay returns. A request sent while no instance is live
    fails with "no live router instance".
    """
    rotation = url if isinstance(url, Rotation) else None
    outcomes = [Outcome(rid, at) for rid, at, _ in schedule]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    done = 0
    marks = sorted([*([at_offset] if at_offset is not None else []), *events], key=lambda e: e[0])
    spawned: list[asyncio.Task] = []

    def fire(fn: Callable[[], Any]) -> None:
        res = fn()
        if inspect.isawaitable(res):
            spawned.append(asyncio.ensure_future(res))

    async with aiohttp.ClientSession(connector=connector) as session:
        tasks: list[asyncio.Task] = []

        def finished(_: asyncio.Task) -> None:
            nonlocal done
            done += 1

        start = time.perf_counter()
        last_report = start
        k = 0
        for i, (_, at, body) in enumerate(schedule):
            while k < len(marks) and at >= marks[k][0]:
                delay = start + marks[k][0] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                fire(marks[k][1])
                k += 1
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if rotation is None:
                target = url
            else:
                outcomes[i].target, base = rotation.pick()
                if not base:
                    outcomes[i].lag = time.perf_counter() - start - at
                    outcomes[i].error = "no live router instance"
                    done += 1
                    continue
                target = base + path
            task = asyncio.create_task(send_one(session, target, body, outcomes[i], start, timeout))
            task.add_done_callback(finished)
            tasks.append(task)
            now = time.perf_counter()
            if progress is not None and now - last_report > 0.5:
                progress(i + 1, done)
                last_report = now
        for t, fn in marks[k:]:
            delay = start + t - time.perf_counter()
            if delay > 0 and t <= (schedule[-1][1] if schedule else 0.0) + 1.0:
                await asyncio.sleep(delay)
            fire(fn)
        pending = set(tasks) | set(spawned)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.5)
            if progress is not None:
                progress(len(schedule), done)
            pending |= {t for t in spawned if not t.done()}
        for t in spawned:
            t.result()     # an event that failed (e.g. a restart that never came up) is not silent
    return outcomes
