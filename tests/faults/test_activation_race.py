"""Two planner processes receive ActivatePlan at the same moment with the same expected
version: exactly one wins, the other gets FAILED_PRECONDITION, every round."""

from __future__ import annotations

import grpc
import pytest

from cacheroute.v1 import planner_pb2 as pb, planner_pb2_grpc
from tests.faults.procs import Procs

pytestmark = [pytest.mark.timeout(60)]

ROUNDS = 15


def test_concurrent_activations_on_two_planners_exactly_one_wins(procs: Procs, redis_url):
    args = ["--redis", redis_url, "--replicas", "r1,r2,r3", "--q-cap", "10", "--warm-slots", "4", "--auto", "0"]
    planners = [procs.spawn("planner", f"planner-{i}", args + ["--planner-id", f"p{i}"]) for i in (1, 2)]
    procs.wait(*planners)
    channels = [grpc.insecure_channel(p.address) for p in planners]
    stubs = [planner_pb2_grpc.PlannerStub(c) for c in channels]
    outcomes, actives = [], []
    try:
        versions = [stubs[0].BuildPlan(pb.BuildPlanRequest(rates=[pb.KeyRate(key=f"k{i}", rate=5.0 + i)]),
                                       timeout=10).plan.version for i in range(2 * ROUNDS + 1)]
        stubs[1].ActivatePlan(pb.ActivatePlanRequest(version=versions[0]), timeout=5)
        active = versions[0]
        for r in range(ROUNDS):
            a, b = versions[1 + 2 * r], versions[2 + 2 * r]
            futures = [stubs[0].ActivatePlan.future(pb.ActivatePlanRequest(version=a, expected_active_version=active),
                                                    timeout=5),
                       stubs[1].ActivatePlan.future(pb.ActivatePlanRequest(version=b, expected_active_version=active),
                                                    timeout=5)]
            codes = []
            for f in futures:
                try:
                    f.result()
                    codes.append("OK")
                except grpc.RpcError as err:
                    codes.append(err.code().name)
            outcomes.append(codes)
            active = stubs[r % 2].GetStatus(pb.GetPlannerStatusRequest(), timeout=5).active_version
            actives.append((active, a if codes[0] == "OK" else b))
    finally:
        for c in channels:
            c.close()
    assert all(sorted(codes) == ["FAILED_PRECONDITION", "OK"] for codes in outcomes), outcomes
    assert all(active == winner for active, winner in actives)
