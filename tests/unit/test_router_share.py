"""The dispatcher's share of the cluster's requests in flight (services/dispatcher/router.py,
module header): own open streams over the engines' running + waiting, clamped, EWMA-smoothed over
polls with evidence, 1.0 until then. It feeds the cold-home rule's share gate."""

from __future__ import annotations

import pytest

from services.dispatcher.router import SHARE_ROUNDS, Router
from services.model import Replica


class _Stats:
    kv_blocks = 0
    prefill_tokens = 0


def router(n=4):
    return Router([Replica(f"e{i}", f"127.0.0.1:{i + 1}") for i in range(n)], seed=1)


def poll(r, i, running, waiting=0):
    r.stats_received(i, r.poll_sent(i), waiting, running, 0.1, _Stats())


def test_one_until_evidence():
    r = router()
    assert r.state.share == 1.0
    for i in range(4):
        poll(r, i, 0)                       # idle engines: no evidence
    assert r.state.share == 1.0
    for i in range(4):
        poll(r, i, 10)                      # load, but this dispatcher never proxied a stream (Route only)
    assert r.state.share == 1.0


def test_converges_to_own_streams_over_engine_load():
    r = router()
    for i in range(4):
        for _ in range(3):
            r.stream_opened(i)              # 12 of our streams
    for _ in range(50):
        for i in range(4):
            poll(r, i, 10, 2)               # 48 in flight at the engines: a quarter is ours
    assert r.state.share == pytest.approx(0.25, abs=1e-3)


def test_one_step_is_an_ewma_of_weight_one_over_rounds_times_replicas():
    r = router()
    r.stream_opened(0)
    poll(r, 0, 4)                            # engine load 4, our 1: sample 0.25
    assert r.state.share == pytest.approx(1.0 - 0.75 / (SHARE_ROUNDS * 4))


def test_clamped_to_one_when_the_engine_counts_lag_our_streams():
    r = router()
    r.state.share = 0.5
    for _ in range(5):
        r.stream_opened(1)
    for _ in range(200):
        poll(r, 1, 2)                        # engines report 2, we have 5 open: sample clamps to 1
    assert 0.99 < r.state.share <= 1.0
