"""Bad input, systematically, over real gRPC against every service's RPCs.

One in-process stack for the module (planner, collector, engine and dispatcher in a
background event loop, a private redis-server, 1 MiB message limit), already holding
plans, an active version and telemetry. Hypothesis drives malformed bodies (corrupt wire
format, invalid UTF-8 in string fields, sent as raw bytes past the typed stubs), extreme
values (NaN, ±inf, negatives, huge counts, unknown versions), empty and oversized
messages. Every case must get the right status code with a one-line message, leave the
services SERVING, and leave what is stored (every Redis key and value; the dispatcher's
and engine's counters) exactly as it was.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import grpc
import pytest
import redis
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from cacheroute.v1 import (collector_pb2, collector_pb2_grpc, common_pb2, dispatcher_pb2, dispatcher_pb2_grpc,
                           engine_pb2, engine_pb2_grpc, planner_pb2, planner_pb2_grpc)
from services.collector.service import CollectorConfig, CollectorService
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.dispatcher.servicer import KeyRules
from services.engine.service import EngineConfig, EngineService
from services.local.redis_server import RedisProcess
from services.model import parse_replicas
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import TelemetryConfig

LIMIT = 1024 * 1024
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=600)
MAX_BATCH = 100
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# (service, method, kind, request type); kind: uu unary-unary, us unary-stream, su stream-unary
METHODS = [
    ("Planner", "GetPlan", "uu", planner_pb2.GetPlanRequest),
    ("Planner", "ListPlans", "uu", planner_pb2.ListPlansRequest),
    ("Planner", "WatchPlans", "us", planner_pb2.WatchPlansRequest),
    ("Planner", "BuildPlan", "uu", planner_pb2.BuildPlanRequest),
    ("Planner", "DiffPlans", "uu", planner_pb2.DiffPlansRequest),
    ("Planner", "ActivatePlan", "uu", planner_pb2.ActivatePlanRequest),
    ("Planner", "Rollback", "uu", planner_pb2.RollbackRequest),
    ("Planner", "SetMode", "uu", planner_pb2.SetModeRequest),
    ("Planner", "PinPlan", "uu", planner_pb2.PinPlanRequest),
    ("Planner", "ShadowPlan", "uu", planner_pb2.ShadowPlanRequest),
    ("Collector", "ReportArrivals", "su", collector_pb2.ArrivalBatch),
    ("Collector", "ReportCacheStats", "su", collector_pb2.CacheStatsBatch),
    ("Collector", "GetRates", "uu", collector_pb2.GetRatesRequest),
    ("Dispatcher", "Route", "uu", dispatcher_pb2.RouteRequest),
    ("Dispatcher", "RouteBatch", "uu", dispatcher_pb2.RouteBatchRequest),
    ("Dispatcher", "Generate", "us", engine_pb2.GenerateRequest),
    ("Engine", "Generate", "us", engine_pb2.GenerateRequest),
]
# messages with a string field, and a typed message holding a placeholder in it
STRING_FIELDS = {
    ("Planner", "ActivatePlan"): lambda s: planner_pb2.ActivatePlanRequest(version=1, reason=s),
    ("Planner", "BuildPlan"): lambda s: planner_pb2.BuildPlanRequest(rates=[planner_pb2.KeyRate(key=s, rate=1)]),
    ("Planner", "SetMode"): lambda s: planner_pb2.SetModeRequest(mode=common_pb2.MODE_FLAT, reason=s),
    ("Collector", "ReportArrivals"): lambda s: collector_pb2.ArrivalBatch(
        batch_id="x", arrivals=[collector_pb2.Arrival(key=s, time=time.time())]),
    ("Collector", "ReportCacheStats"): lambda s: collector_pb2.CacheStatsBatch(
        stats=[collector_pb2.CacheStat(replica_id=s, prompt_tokens=1, cached_tokens=1, requests=1)]),
    ("Dispatcher", "Route"): lambda s: dispatcher_pb2.RouteRequest(key=s),
    ("Dispatcher", "RouteBatch"): lambda s: dispatcher_pb2.RouteBatchRequest(
        requests=[dispatcher_pb2.RouteRequest(key="ok"), dispatcher_pb2.RouteRequest(prompt=s)]),
    ("Dispatcher", "Generate"): lambda s: engine_pb2.GenerateRequest(prompt=s, max_tokens=1),
    ("Engine", "Generate"): lambda s: engine_pb2.GenerateRequest(prompt=s, max_tokens=1),
}


class Stack:
    """The four services in a background event loop, plus sync channels to them."""

    def __init__(self) -> None:
        self.redis = RedisProcess().start()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.services = self.run(self._up())
        self.addresses = {name: s.address for name, s in self.services.items()}
        self.channels = {name: grpc.insecure_channel(a, options=[("grpc.max_send_message_length", 4 * LIMIT)])
                         for name, a in self.addresses.items()}
        self.r = redis.Redis.from_url(self.redis.url)

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _up(self) -> dict:
        def server(name: str) -> ServerConfig:
            return ServerConfig(name=name, port=0, metrics_port=-1, max_message_bytes=LIMIT)
        engine = await EngineService(EngineConfig(server=server("engine"), replica_id="e0", time_scale=0.01)).start()
        collector = await CollectorService(CollectorConfig(server=server("collector"), redis_url=self.redis.url,
                                                           telemetry=TELEMETRY, window_seconds=60)).start()
        loop = LoopConfig(replica_ids=("e0", "e1", "e2"), q_cap=10.0, warm_slots=4, planner_id="p")
        planner = await PlannerService(PlannerConfig(server=server("planner"), loop=loop, redis_url=self.redis.url,
                                                     telemetry=TELEMETRY, auto=False)).start()
        dispatcher = await DispatcherService(DispatcherConfig(
            server=server("dispatcher"), replicas=parse_replicas(f"e0={engine.address}"), planner=planner.address,
            redis_url=self.redis.url, rules=KeyRules(max_batch=MAX_BATCH), poll_interval=0.1, seed=1)).start()
        return {"Engine": engine, "Collector": collector, "Planner": planner, "Dispatcher": dispatcher}

    def seed(self) -> None:
        planner = planner_pb2_grpc.PlannerStub(self.channels["Planner"])
        rates = [planner_pb2.KeyRate(key=k, rate=r) for k, r in (("hot", 25.0), ("warm", 6.0), ("cool", 1.0))]
        v1 = planner.BuildPlan(planner_pb2.BuildPlanRequest(rates=rates, activate=True), timeout=10).plan.version
        planner.BuildPlan(planner_pb2.BuildPlanRequest(rates=rates[:2]), timeout=10)
        collector = collector_pb2_grpc.CollectorStub(self.channels["Collector"])
        now = time.time()
        collector.ReportArrivals(iter([collector_pb2.ArrivalBatch(batch_id="seed", arrivals=[
            collector_pb2.Arrival(key="hot", time=now - i * 0.1, prompt_tokens=10) for i in range(20)])]), timeout=5)
        collector.ReportCacheStats(iter([collector_pb2.CacheStatsBatch(batch_id="seed", stats=[
            collector_pb2.CacheStat(replica_id="e0", prompt_tokens=10, cached_tokens=5, requests=1)])]), timeout=5)
        deadline = time.monotonic() + 5
        while self.services["Dispatcher"].router.plan_version != v1:
            assert time.monotonic() < deadline, "dispatcher never got the plan"
            time.sleep(0.02)

    def state(self) -> dict:
        """Everything stored: every Redis key's value, and the data plane's counters."""
        out = {}
        for key in sorted(self.r.keys("*")):
            kind = self.r.type(key).decode()
            read = {"string": self.r.get, "hash": self.r.hgetall, "list": lambda k: self.r.lrange(k, 0, -1),
                    "zset": lambda k: self.r.zrange(k, 0, -1, withscores=True), "set": self.r.smembers}[kind]
            out[key] = read(key)
        router = self.services["Dispatcher"].router
        model = self.services["Engine"].model
        out["dispatcher"] = (router.routed, tuple(router.counts), len(router.telemetry), router.plan_version)
        out["engine"] = (model.requests, model.prompt_tokens, model.waiting, model.running)
        return out

    def healthy(self) -> bool:
        for name, channel in self.channels.items():
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=f"cacheroute.v1.{name}"), timeout=2)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return False
        return True

    def call(self, service: str, method: str, kind: str, body) -> tuple[str, str]:
        """Send `body` (bytes: raw, else a message) and return (code name, details)."""
        raw = isinstance(body, bytes)
        path = f"/cacheroute.v1.{service}/{method}"
        ser = None if raw else (lambda m: m.SerializeToString())
        channel = self.channels[service]
        try:
            if kind == "uu":
                channel.unary_unary(path, request_serializer=ser, response_deserializer=None)(body, timeout=5)
            elif kind == "us":
                call = channel.unary_stream(path, request_serializer=ser, response_deserializer=None)(body, timeout=5)
                next(call)                           # the first item, or the error
                call.cancel()
            else:
                channel.stream_unary(path, request_serializer=ser, response_deserializer=None)(iter([body]), timeout=5)
        except grpc.RpcError as err:
            return err.code().name, err.details() or ""
        return "OK", ""

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

        async def down():
            for s in self.services.values():
                await s.stop(0)
        self.run(down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.r.close()
        self.redis.close()


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    try:
        s.seed()
        yield s
    finally:
        s.close()


def one_line(details: str) -> bool:
    return bool(details) and "\n" not in details and "Traceback" not in details and len(details) <= 1024


def check_unchanged(stack: Stack, before: dict) -> None:
    assert stack.state() == before
    assert stack.healthy()


def parses(message_type, body: bytes) -> bool:
    try:
        message_type.FromString(body)
    except DecodeError:
        return False
    return True


# ------------------------------------------------------------------ malformed bodies

METHOD = st.sampled_from(METHODS)


@FUZZ
@given(target=METHOD, body=st.binary(min_size=1, max_size=300))
def test_corrupt_wire_format_is_invalid_argument_everywhere(stack, target, body):
    service, method, kind, message_type = target
    assume(not parses(message_type, body))
    before = stack.state()
    code, details = stack.call(service, method, kind, body)
    assert code == "INVALID_ARGUMENT" and details.startswith("malformed request") and one_line(details), (code, details)
    check_unchanged(stack, before)


@FUZZ
@given(target=st.sampled_from(sorted(STRING_FIELDS)), bad=st.binary(min_size=1, max_size=64))
def test_invalid_utf8_in_string_fields_is_invalid_argument(stack, target, bad):
    try:
        bad.decode("utf-8")
        assume(False)
    except UnicodeDecodeError:
        pass
    service, method = target
    kind = next(k for s, m, k, _ in METHODS if (s, m) == target)
    if len(bad) % 2:
        bad += b"\xff"
    placeholder = "\u00e9" * (len(bad) // 2)                 # c3 a9 ...: the same byte length as `bad`
    typed = STRING_FIELDS[target](placeholder).SerializeToString()
    assert typed.count(placeholder.encode()) == 1
    body = typed.replace(placeholder.encode(), bad)
    before = stack.state()
    code, details = stack.call(service, method, kind, body)
    assert code == "INVALID_ARGUMENT" and "UTF-8" in details and one_line(details), (code, details)
    check_unchanged(stack, before)


@pytest.mark.parametrize("service,method,kind", [(s, m, k) for s, m, k, _ in METHODS if m in
                                                  ("BuildPlan", "ReportArrivals", "RouteBatch", "Generate")])
def test_messages_above_the_size_limit_are_resource_exhausted(stack, service, method, kind):
    before = stack.state()
    code, details = stack.call(service, method, kind, b"\x0a" + b"\xff" * (LIMIT + 1024))
    assert code == "RESOURCE_EXHAUSTED" and one_line(details), (code, details)
    check_unchanged(stack, before)


# ------------------------------------------------------------------ extreme values, typed

BAD_FLOAT = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-300, -1e308])
HUGE = st.integers(min_value=0, max_value=2**64 - 1)
TEXT = st.text(max_size=40)
KEY = st.text(min_size=1, max_size=30)


def planner(stack):
    return planner_pb2_grpc.PlannerStub(stack.channels["Planner"])


def code_of(fn) -> tuple[str, str]:
    try:
        fn()
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""
    return "OK", ""


def stored_versions(stack) -> set[int]:
    return {int(v) for v in stack.r.zrange("cr:{plans}:index", 0, -1)}


@FUZZ
@given(version=HUGE, before=HUGE, frm=HUGE, to=HUGE, limit=st.integers(0, 2**32 - 1), summary=st.booleans())
def test_planner_reads_with_any_numbers(stack, version, before, frm, to, limit, summary):
    known = stored_versions(stack)
    state = stack.state()
    p = planner(stack)
    got = code_of(lambda: p.GetPlan(planner_pb2.GetPlanRequest(version=version, summary_only=summary), timeout=5))
    assert got[0] == ("OK" if version == 0 or version in known else "NOT_FOUND"), got
    listed = p.ListPlans(planner_pb2.ListPlansRequest(limit=limit, before_version=before), timeout=5)
    assert len(listed.plans) <= min(limit or 20, 1000)
    diff = code_of(lambda: p.DiffPlans(planner_pb2.DiffPlansRequest(from_version=frm, to_version=to), timeout=5))
    assert diff[0] == ("OK" if frm in known and (to == 0 or to in known) else "NOT_FOUND"), diff
    assert all(one_line(d) for c, d in (got, diff) if c != "OK")
    check_unchanged(stack, state)


BAD_RATES = st.lists(st.tuples(KEY, BAD_FLOAT), min_size=1, max_size=5).map(
    lambda xs: [planner_pb2.KeyRate(key=k, rate=r) for k, r in xs])


@st.composite
def bad_build(draw) -> planner_pb2.BuildPlanRequest:
    good = [planner_pb2.KeyRate(key=f"k{i}", rate=float(i + 1)) for i in range(draw(st.integers(1, 4)))]
    flaw = draw(st.sampled_from(["rate", "dup_key", "empty_key", "q_cap", "dup_replica", "empty_replica"]))
    req = planner_pb2.BuildPlanRequest(rates=good, activate=draw(st.booleans()))
    if flaw == "rate":
        req = planner_pb2.BuildPlanRequest(rates=good + draw(BAD_RATES))
    elif flaw == "dup_key":
        req.rates.append(planner_pb2.KeyRate(key=good[0].key, rate=1.0))
    elif flaw == "empty_key":
        req.rates.append(planner_pb2.KeyRate(key="", rate=1.0))
    elif flaw == "q_cap":
        req.q_cap = draw(BAD_FLOAT)
    elif flaw == "dup_replica":
        req.replica_ids.extend(["e0", "e1", "e0"])
    else:
        req.replica_ids.extend(["e0", ""])
    return req


@FUZZ
@given(req=bad_build())
def test_invalid_build_requests_store_nothing(stack, req):
    before = stack.state()
    code, details = code_of(lambda: planner(stack).BuildPlan(req, timeout=10))
    assert code == "INVALID_ARGUMENT" and one_line(details), (code, details, req)
    check_unchanged(stack, before)


@FUZZ
@given(version=HUGE, expected=HUGE, to=HUGE, mode=st.integers(3, 2**31 - 1) | st.just(0), pin=HUGE, reason=TEXT)
def test_refused_control_calls_change_nothing(stack, version, expected, to, mode, pin, reason):
    known = stored_versions(stack)
    active = int(stack.r.get("cr:{plans}:active") or 0)
    assume(version not in known and expected != active and pin != 0 and pin != active)
    before = stack.state()
    p = planner(stack)
    results = {
        "activate": code_of(lambda: p.ActivatePlan(planner_pb2.ActivatePlanRequest(
            version=version, expected_active_version=expected, reason=reason), timeout=5)),
        "rollback": code_of(lambda: p.Rollback(planner_pb2.RollbackRequest(
            expected_active_version=expected, to_version=to, reason=reason), timeout=5)),
        "mode": code_of(lambda: p.SetMode(planner_pb2.SetModeRequest(mode=mode, reason=reason), timeout=5)),
        "pin": code_of(lambda: p.PinPlan(planner_pb2.PinPlanRequest(version=pin), timeout=5)),
    }
    allowed = {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"}
    assert all(c in allowed and one_line(d) for c, d in results.values()), results
    assert results["mode"][0] == "INVALID_ARGUMENT"
    check_unchanged(stack, before)


@st.composite
def bad_arrival(draw) -> collector_pb2.Arrival:
    now = time.time()
    flaw = draw(st.sampled_from(["empty", "long", "nan", "future", "old"]))
    key = {"empty": "", "long": "k" * draw(st.integers(257, 2000))}.get(flaw, draw(KEY))
    t = {"nan": draw(st.sampled_from([math.nan, math.inf, -math.inf])), "future": now + draw(st.floats(120, 1e12)),
         "old": now - draw(st.floats(700, 1e12))}.get(flaw, now)
    return collector_pb2.Arrival(key=key, time=t, prompt_tokens=draw(st.integers(0, 2**32 - 1)),
                                 prefix_tokens=draw(st.integers(0, 2**32 - 1)))


BAD_STAT = st.builds(
    lambda rid, p, c, n: collector_pb2.CacheStat(replica_id=rid, prompt_tokens=p, cached_tokens=c, requests=n),
    st.sampled_from(["", "a|b", "x" * 300, "e0"]), st.integers(-2**63, -1) | st.just(5),
    st.integers(6, 2**63 - 1), st.integers(-2**63, 2**63 - 1))


@FUZZ
@given(arrivals=st.lists(bad_arrival(), min_size=1, max_size=30), stats=st.lists(BAD_STAT, min_size=1, max_size=10),
       batch_id=st.text(max_size=200))
def test_invalid_telemetry_is_rejected_record_by_record(stack, arrivals, stats, batch_id):
    c = collector_pb2_grpc.CollectorStub(stack.channels["Collector"])
    before = stack.state()
    got = c.ReportArrivals(iter([collector_pb2.ArrivalBatch(batch_id=batch_id, arrivals=arrivals)]), timeout=5)
    cached = c.ReportCacheStats(iter([collector_pb2.CacheStatsBatch(batch_id=batch_id, stats=stats)]), timeout=5)
    assert (got.accepted, got.rejected) == (0, len(arrivals)) and "\n" not in got.first_rejection
    assert (cached.accepted, cached.rejected) == (0, len(stats)) and "\n" not in cached.first_rejection
    check_unchanged(stack, before)


def test_a_huge_batch_of_invalid_arrivals_is_rejected_in_full(stack):
    c = collector_pb2_grpc.CollectorStub(stack.channels["Collector"])
    before = stack.state()
    batch = collector_pb2.ArrivalBatch(batch_id="huge", arrivals=[collector_pb2.Arrival(key="", time=1.0)] * 60_000)
    assert batch.ByteSize() < LIMIT
    got = c.ReportArrivals(iter([batch]), timeout=20)
    assert (got.accepted, got.rejected) == (0, 60_000)
    check_unchanged(stack, before)


@FUZZ
@given(window=BAD_FLOAT | st.floats(601, 1e300) | st.just(math.inf), limit=st.integers(0, 2**32 - 1))
def test_get_rates_rejects_impossible_windows(stack, window, limit):
    c = collector_pb2_grpc.CollectorStub(stack.channels["Collector"])
    code, details = code_of(lambda: c.GetRates(collector_pb2.GetRatesRequest(window_seconds=window, limit=limit),
                                               timeout=5))
    assert code == "INVALID_ARGUMENT" and one_line(details), (window, code, details)
    assert stack.healthy()


@st.composite
def bad_route(draw) -> dispatcher_pb2.RouteRequest:
    flaw = draw(st.sampled_from(["none", "empty_key", "long_key", "no_hashes", "empty_prompt"]))
    req = dispatcher_pb2.RouteRequest(prompt_tokens=draw(st.integers(0, 2**32 - 1)), request_id=draw(TEXT))
    if flaw == "empty_key":
        req.key = ""
    elif flaw == "long_key":
        req.key = "k" * draw(st.integers(257, 5000))
    elif flaw == "no_hashes":
        req.prefix.SetInParent()
    elif flaw == "empty_prompt":
        req.prompt = ""
    return req


ENGINE_LIMITS = ("max_tokens", "too_long")   # only the engine knows its limits: the dispatcher routes these


@st.composite
def bad_generate(draw) -> tuple[engine_pb2.GenerateRequest, str]:
    flaw = draw(st.sampled_from(["no_prompt", "max_tokens", "too_long", "empty_blocks"]))
    req = engine_pb2.GenerateRequest(prompt="hello world", max_tokens=draw(st.integers(1, 64)))
    if flaw == "no_prompt":
        req.ClearField("prompt")
    elif flaw == "max_tokens":
        req.max_tokens = draw(st.just(0) | st.integers(10_000, 2**32 - 1))
    elif flaw == "too_long":
        req.blocks.prompt_tokens = draw(st.integers(200_000, 2**32 - 1))
        req.blocks.block_hashes.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=5)))
    else:
        req.blocks.SetInParent()
    return req, flaw


@FUZZ
@given(route=bad_route(), batch_good=st.integers(0, 5), generate=bad_generate())
def test_data_plane_rejects_bad_requests_without_routing_them(stack, route, batch_good, generate):
    generate, flaw = generate
    d = dispatcher_pb2_grpc.DispatcherStub(stack.channels["Dispatcher"])
    e = engine_pb2_grpc.EngineStub(stack.channels["Engine"])
    before = stack.state()
    good = [dispatcher_pb2.RouteRequest(key=f"g{i}") for i in range(batch_good)]
    results = [
        code_of(lambda: d.Route(route, timeout=5)),
        code_of(lambda: d.RouteBatch(dispatcher_pb2.RouteBatchRequest(requests=good + [route] + good), timeout=5)),
        code_of(lambda: next(d.Generate(generate, timeout=5))),
        code_of(lambda: next(e.Generate(generate, timeout=5))),
    ]
    assert all(c == "INVALID_ARGUMENT" and one_line(m) for c, m in results), (results, route, generate)
    after = stack.state()
    if flaw in ENGINE_LIMITS:   # routed (and counted as an arrival), then refused by the engine
        before.pop("dispatcher"), after.pop("dispatcher")
    assert after == before and stack.healthy()


def test_route_batch_above_the_batch_limit(stack):
    d = dispatcher_pb2_grpc.DispatcherStub(stack.channels["Dispatcher"])
    before = stack.state()
    big = dispatcher_pb2.RouteBatchRequest(requests=[dispatcher_pb2.RouteRequest(key="k")] * (MAX_BATCH + 1))
    code, details = code_of(lambda: d.RouteBatch(big, timeout=5))
    assert code == "INVALID_ARGUMENT" and one_line(details)
    check_unchanged(stack, before)
