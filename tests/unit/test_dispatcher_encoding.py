"""RouteBatch's hand-assembled wire bytes parse to exactly the message the protobuf API builds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cacheroute.v1 import common_pb2, dispatcher_pb2
from services.dispatcher.router import Router
from services.dispatcher.servicer import DecisionEncoder, _varint
from services.model import Replica

IDS = ("r0", "replica-with-a-longer-id", "é" * 70)
ADDRESSES = ("127.0.0.1:1", "host.example:65535", "[::1]:50061" * 13)

picks = st.lists(st.tuples(st.integers(0, len(IDS) - 1), st.sampled_from([0, 1, 2, 3]),
                           st.text(min_size=1, max_size=90)), max_size=30)


@given(picks=picks, versions=st.lists(st.sampled_from([0, 1, 2**40, 2**64 - 1]), min_size=1, max_size=3))
def test_encoded_batch_equals_api_built_batch(picks, versions):
    encoder = DecisionEncoder(IDS, ADDRESSES)
    for version in versions:          # the per-version cache must follow version changes
        wire = encoder.encode([(i, r) for i, r, _ in picks], [k for _, _, k in picks], version)
        expected = dispatcher_pb2.RouteBatchResponse(decisions=[
            common_pb2.RouteDecision(replica_id=IDS[i], address=ADDRESSES[i], plan_version=version, reason=r, key=k)
            for i, r, k in picks])
        assert dispatcher_pb2.RouteBatchResponse.FromString(wire) == expected


def test_varint_matches_protobuf():
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**35):
        msg = common_pb2.RouteDecision(plan_version=n).SerializeToString()
        assert msg == (b"\x18" + _varint(n) if n else b"")


def test_route_many_accounts_like_route():
    def fresh() -> Router:
        router = Router([Replica(f"r{i}", f"h:{i}") for i in range(4)], seed=3, telemetry_capacity=5)
        router.state.healthy[:] = [True] * 4
        return router

    requests = [(f"k{i % 3}", 10 + i, i) for i in range(8)]
    one, many = fresh(), fresh()
    singles = [one.route(k, 5.0, p, x) for k, p, x in requests]
    assert many.route_many(requests, 5.0) == singles
    for field in ("recent", "routed_to", "counts", "telemetry", "telemetry_dropped"):
        assert getattr(many, field) == getattr(one, field), field
    assert many.state.in_flight == one.state.in_flight
