"""The background-loop helpers in services.rpc: Backoff, every, stop_tasks, reconnect options,
bearer metadata."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest

from services.rpc import FAST_RECONNECT, Backoff, bearer_metadata, channel_options, every, stop_tasks


def test_backoff_doubles_to_its_cap_and_resets():
    b = Backoff(0.1, 1.0)
    assert [round(next(b), 6) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert next(b) == 0.1


def test_backoff_jitter_stays_in_the_upper_half_and_is_seeded():
    b, c = Backoff(0.1, 5.0, random.Random(3)), Backoff(0.1, 5.0, random.Random(3))
    plain = Backoff(0.1, 5.0)
    for _ in range(40):
        d, cap = next(b), next(plain)
        assert cap / 2 <= d <= cap and d == next(c)


@pytest.mark.parametrize("initial, maximum", [(0, 1), (-1, 1), (2, 1)])
def test_backoff_refuses_bad_bounds(initial, maximum):
    with pytest.raises(ValueError):
        Backoff(initial, maximum)


def test_every_runs_start_to_start_without_overlap_and_stops_on_the_flag():
    async def main():
        starts, running, overlaps = [], [0], [0]

        async def step():
            starts.append(time.monotonic())
            running[0] += 1
            overlaps[0] = max(overlaps[0], running[0])
            await asyncio.sleep(0.06 if len(starts) != 3 else 0.25)   # the third step overruns
            running[0] -= 1

        t0 = time.monotonic()
        await asyncio.wait_for(every(0.1, step, lambda: len(starts) >= 6), 5)
        return t0, starts, overlaps[0]

    t0, starts, overlap = asyncio.run(main())
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    regular = sorted(g for i, g in enumerate(gaps) if i != 2)
    assert len(starts) == 6 and overlap == 1
    assert starts[0] - t0 >= 0.095                                      # the first one interval from now
    assert regular[0] >= 0.095 and regular[len(regular) // 2] < 0.15, gaps   # period 0.1, not 0.1 + 0.06
    assert gaps[2] >= 0.25                                              # an overrun delays the next step


def test_stop_tasks_is_bounded_and_reports_a_task_that_had_died(caplog):
    async def stubborn():                                               # swallows a cancel, as 3.11 can
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)

    async def broken():
        raise RuntimeError("boom")

    async def main():
        tasks = [asyncio.create_task(stubborn(), name="stubborn"), asyncio.create_task(broken(), name="broken"), None]
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await stop_tasks(tasks, timeout=0.2)
        elapsed = time.monotonic() - started
        await tasks[0]
        return elapsed

    with caplog.at_level(logging.WARNING, logger="cacheroute.rpc"):
        elapsed = asyncio.run(main())
    assert 0.19 <= elapsed < 0.45
    messages = {r.getMessage(): r for r in caplog.records}
    assert messages["background task had failed"].fields == {"task": "broken"}
    assert messages["background tasks did not stop in time"].fields == {"tasks": ["stubborn"]}


def test_reconnect_options_and_bearer_metadata():
    opts = dict(channel_options(reconnect=FAST_RECONNECT))
    assert (opts["grpc.min_reconnect_backoff_ms"], opts["grpc.max_reconnect_backoff_ms"]) == (100, 500)
    assert "grpc.min_reconnect_backoff_ms" not in dict(channel_options())
    assert bearer_metadata("t0k") == (("authorization", "Bearer t0k"),)
    assert bearer_metadata(None) is None and bearer_metadata("") is None


def test_env_number_names_the_variable_when_the_value_is_bad(monkeypatch):
    import pytest

    from services.rpc import env_number

    monkeypatch.setenv("CACHEROUTE_TEST_KNOB", "2.5")
    assert env_number("TEST_KNOB", "1", float) == 2.5
    monkeypatch.delenv("CACHEROUTE_TEST_KNOB")
    assert env_number("TEST_KNOB", "7", int) == 7
    monkeypatch.setenv("CACHEROUTE_TEST_KNOB", "lots")
    with pytest.raises(ValueError, match=r"^CACHEROUTE_TEST_KNOB='lots' is not a valid int$"):
        env_number("TEST_KNOB", "7", int)
