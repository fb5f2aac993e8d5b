"""services.backends.relay's event boundary: the endswith fast path gives the full scan's answer; the
[DONE] test of the block the dispatcher writes with the body's end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.backends.relay import ends_with_done, last_event_end


def scan(data: bytes) -> int:
    """The definition: just past the last blank line of any framing (LF, CRLF, CR); -1 without one."""
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (at := data.rfind(sep)) >= 0]
    return max(ends) if ends else -1


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"data: {}", b"\r\n", b"\n\n"]), max_size=24).map(b"".join))
def test_last_event_end_is_the_scan(data):
    assert last_event_end(data) == scan(data)


def test_usual_blocks():
    assert last_event_end(b"data: 1\n\ndata: 2\n\n") == 18
    assert last_event_end(b"data: 1\r\n\r\ndata: 2") == 11
    assert last_event_end(b"data: 1\r\rdata") == 9
    assert last_event_end(b"data: 1\n") == -1


@pytest.mark.parametrize("block, done", [
    (b"data: [DONE]\n\n", True),
    (b'data: {"choices":[]}\n\ndata: [DONE]\r\n\r\n', True),
    (b"data:[DONE]\r\r", True),
    (b"data: [DONE]", True),                        # its blank line still to come: held all the same
    (b'data: {"text":"[DONE]"}\n\n', False),         # the text, not the event
    (b"data: [DONE]\n\ndata: {}\n\n", False),        # something after it
    (b": [DONE]\n\n", False),                       # a comment line
    (b"", False),
])
def test_ends_with_done_finds_the_streams_last_event_only(block, done):
    assert ends_with_done(block) is done
