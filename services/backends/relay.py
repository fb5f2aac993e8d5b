"""The bytes of an HTTP engine's answer, relayed unchanged: SSE event alignment and usage.

A stream is relayed as the engine's network chunks arrive, each passed on unchanged in one
block, wherever its boundaries fall (one client write per engine read; the block
ending in `data: [DONE]` goes out with the body's end, services.dispatcher.http). The usage figures
are found by scanning the bytes: the events completed so far (a blank line with any of the
spec's line endings ends one: LF, CRLF or CR) are parsed only if they contain a `"usage": {`
object (the `"usage":null` of every chunk is skipped by a byte test), a partial event is
kept back for the scan only, so the figures reach cache telemetry without re-serialising the
stream (STYLE.md, aiohttp / OpenAI API). When the dispatcher asked for the usage chunk
itself (`strip`: the client did not), the stream is relayed event-aligned instead: chunks are
passed on as soon as they end on an event boundary, a partial event waits for its end, and
that chunk (`"choices": []`) is dropped; separators are kept as they came.

Errors: no event within `first_byte` seconds of the headers, or no byte for `idle` seconds
after that, is EngineError "timeout"; a broken connection "failed" (both mid-stream: the
client has the headers, so no retry).
"""

from __future__ import annotations

import asyncio
import re
from typing import AsyncIterator

import orjson

from services.http import oai
from services.backends.base import Deadlines, EngineError, Reply
from services.backends.rawhttp import Answer, HttpError

# the end of an SSE event: a blank line, with any of the spec's line endings (LF, CRLF, CR)
EVENT_END = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")


def last_event_end(data: bytes) -> int:
    """The offset just past the last complete SSE event in `data`; -1 if there is none."""
    if data.endswith(_EVENT_ENDS):      # the usual block: whole events (one endswith, no three scans)
        return len(data)
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (at := data.rfind(sep)) >= 0]
    return max(ends) if ends else -1


def ends_with_done(block: bytes) -> bool:
    """Whether a relayed block's last line is the stream's `data: [DONE]` (any line ending)."""
    if b"[DONE]" not in block[-16:]:    # every other block, without copying it (rstrip would)
        return False
    end = block.rstrip(b"\r\n")
    if not end.endswith(b"[DONE]"):
        return False
    line = end[max(end.rfind(b"\n"), end.rfind(b"\r")) + 1:]
    return line.startswith(b"data:") and line[5:].strip() == b"[DONE]"


def has_usage(data: bytes) -> bool:
    return b'"usage":{' in data or b'"usage": {' in data      # not the `"usage":null` of every chunk


def usage_events(ready: bytes, strip: bool) -> tuple[bytes, tuple[int, int, int | None] | None]:
    """(the events of `ready` to relay, the usage figures found): whole events, any framing;
    the usage-only chunk is dropped if `strip`."""
    parts = EVENT_END.split(ready)          # event, separator, event, separator, ..., ""
    out, found = [], None
    for event, sep in zip(parts[::2], parts[1::2] + [b""]):
        line = event.lstrip(b"\r\n")
        if has_usage(line) and line.startswith(b"data: {"):
            try:
                doc = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                doc = None
            figures = oai.usage_of(doc)
            if figures is not None:
                found = figures
                if strip and doc.get("choices") == []:
                    continue
        out += (event, sep)
    return b"".join(out), found


def whole_usage(data: bytes) -> tuple[int, int, int | None] | None:
    """The usage figures of a whole JSON answer; None if it has none."""
    try:
        return oai.usage_of(orjson.loads(data))
    except orjson.JSONDecodeError:
        return None


async def read_whole(upstream: Answer, idle: float) -> bytes:
    """A whole answer's body; EngineError timeout / failed."""
    try:
        return await upstream.read()
    except TimeoutError:
        raise EngineError("timeout", "idle", f"sent nothing for {idle:g}s") from None
    except HttpError as exc:
        raise EngineError("failed", type(exc).__name__, f"closed the response: {type(exc).__name__}") from None


async def relay_events(upstream: Answer, reply: Reply, strip: bool,
                       deadlines: Deadlines, *, whole: bool = False) -> AsyncIterator[bytes]:
    """The bytes of `upstream`'s SSE stream in blocks, usage recorded on `reply` (module header):
    each network chunk as it came, or, with `strip` or `whole`, blocks of whole events."""
    tail, waiting = b"", deadlines.first_byte
    aligned = strip or whole
    readany = upstream.readany
    try:
        while True:
            if waiting is None:     # after the first event: the answer's idle timer (services.backends.rawhttp)
                data = await readany()
            else:                   # not wait_for: no task per read (Python 3.11)
                async with asyncio.timeout(waiting):
                    data = await readany()
            if not data:
                break
            waiting = None
            if not aligned:         # pass the chunk on as it came; scan whole events for usage
                scan = tail + data if tail else data
                cut = last_event_end(scan)
                if cut < 0:
                    tail = scan
                else:
                    if has_usage(scan) and (found := usage_events(scan[:cut], False)[1]) is not None:
                        reply.usage = found
                    tail = scan[cut:] if cut < len(scan) else b""
                yield data
                continue
            data = tail + data if tail else data
            cut = last_event_end(data)
            if cut < 0:
                tail = data
                continue
            ready, tail = data[:cut], data[cut:]
            if has_usage(ready):
                ready, found = usage_events(ready, strip)
                reply.usage = found or reply.usage
            if ready:
                yield ready
        if tail and aligned:
            yield tail
    except TimeoutError:
        waited = deadlines.idle if waiting is None else waiting
        raise EngineError("timeout", "idle", f"sent nothing for {waited:g}s") from None
    except HttpError as exc:
        raise EngineError("failed", type(exc).__name__, f"closed the stream: {type(exc).__name__}") from None
