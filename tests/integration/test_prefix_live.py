"""Prefix-aware plans end to end: two real dispatchers (--prefix-nodes 1) report each request's
prefix chain to a real collector (Redis); a real planner (--prefix-nodes 1) counts the shared
document, admits it as a prefix node and pushes the plan; requests of *new* keys that share the
document then land on its planned replica from either dispatcher, and hit its cache."""

from __future__ import annotations

import asyncio

import grpc

from cacheroute.v1 import common_pb2, dispatcher_pb2_grpc, engine_pb2
from services.collector.service import CollectorConfig
from services.collector.service import serve as serve_collector
from services.core.prefixes import node_name
from services.core.workloads import block_hashes
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig
from services.planner.service import serve as serve_planner
from services.rpc import ServerConfig
from tests.integration.test_dispatcher import dispatcher_config, wait_until

DOC_BLOCKS, OWN_BLOCKS = 256, 8               # a 4,096-token document, then 128 tokens of each key's own
DOC = block_hashes("doc", "contract", DOC_BLOCKS)


def request(key: str, i: int) -> engine_pb2.GenerateRequest:
    own = tuple(h ^ DOC[-1] for h in block_hashes("own", f"{key}/{i}", OWN_BLOCKS))    # chained after the doc
    blocks = DOC + own
    return engine_pb2.GenerateRequest(request_id=f"{key}-{i}", key=key, max_tokens=2, blocks=engine_pb2.PromptBlocks(
        block_hashes=blocks, prompt_tokens=16 * len(blocks) + 8))


async def first_chunk(stub, req) -> engine_pb2.GenerateChunk:
    first = None
    async for chunk in stub.Generate(req, timeout=10):
        first = first or chunk
    return first


def test_new_keys_sharing_a_document_land_on_its_planned_replica_and_hit(redis_url):
    async def main():
        collector = await serve_collector(CollectorConfig(server=ServerConfig(name="collector", port=0),
                                                          redis_url=redis_url))
        fleet = await EngineFleet(4, time_scale=0.01, collector=collector.address, report_interval=0.1).start()
        loop = LoopConfig(replica_ids=tuple(fleet.ids), q_cap=50.0, warm_slots=4, interval=0.5, window_seconds=60,
                          planner_id="p1", prefix=True)
        planner = await serve_planner(PlannerConfig(server=ServerConfig(name="planner", port=0), loop=loop,
                                                    redis_url=redis_url, watch_poll_seconds=0.2, repair=False))
        ds = [await serve(dispatcher_config(fleet, planner=planner.address, collector=collector.address,
                                            telemetry_interval=0.1, prefix_nodes=True, dispatcher_id=f"d{j}", seed=j))
              for j in (1, 2)]
        out = {}
        try:
            async with grpc.aio.insecure_channel(ds[0].address) as c1, grpc.aio.insecure_channel(ds[1].address) as c2:
                stubs = [dispatcher_pb2_grpc.DispatcherStub(c) for c in (c1, c2)]
                for i in range(3):                                  # six keys read the document
                    for k in range(6):
                        await first_chunk(stubs[k % 2], request(f"old-{k}", i))
                doc = node_name(DOC[DOC_BLOCKS - 1])

                def planned():
                    plans = [d.router.plan for d in ds]
                    return all(p is not None and doc in p.prefixes for p in plans) and plans
                await wait_until(planned, timeout=15, step=0.1)
                plan = ds[0].router.plan
                out["members"] = {plan.replica_ids[i] for i in plan.prefixes[doc].replicas}
                out["entry"] = plan.prefixes[doc]
                out["available"] = plan.extra.get("available_hit_rate")
                out["versions"] = {d.router.plan_version for d in ds}
                # new keys, never seen: cold for the key table, planned by their document
                out["new"] = [await first_chunk(stubs[k % 2], request(f"new-{k}", 0)) for k in range(8)]
                from clients.cli.status import planner_doc

                def status():                                          # what `cacheroute status` prints
                    with grpc.insecure_channel(planner.address) as ch:
                        doc = planner_doc(ch, 2.0)
                    return "achieved_hit_rate" in doc and doc
                await wait_until(lambda: planner.loop.status().hit_rates.get("achieved_hit_rate") is not None,
                                 timeout=10, step=0.1)
                out["status"] = await asyncio.to_thread(status)
                from clients import AsyncCacheRouteClient
                async with AsyncCacheRouteClient(ds[0].address, planner=planner.address) as client:
                    out["diff"] = await client.diff_plans(1, 0)              # the first stored version -> active
                    out["shown"] = await client.get_plan(0, summary_only=True)
        finally:
            for d in ds:
                await d.stop(0)
            await planner.stop(0)
            await fleet.stop()
            await collector.stop(0)
        return out

    out = asyncio.run(main())
    assert len(out["versions"]) == 1                                      # both dispatchers hold one plan
    assert out["entry"].keys >= 2 and out["entry"].tokens == 16 * DOC_BLOCKS
    assert 0 < out["available"] <= 1
    diff, shown = out["diff"], out["shown"]                               # `cacheroute plans diff / show`
    assert diff.prefixes_kept + diff.prefixes_moved + diff.prefixes_added == len(shown.prefixes) >= 1
    assert shown.HasField("available_hit_rate")
    assert 0 < out["status"]["available_hit_rate"] <= 1 and 0 <= out["status"]["achieved_hit_rate"] <= 1
    new = out["new"]
    assert all(c.route.reason == common_pb2.ROUTE_REASON_PLANNED for c in new), [c.route for c in new]
    assert all(c.route.replica_id in out["members"] for c in new)          # the document's planned replica
    assert all(c.cached_tokens >= 16 * DOC_BLOCKS for c in new[1:])         # and it has the document
