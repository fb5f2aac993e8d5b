"""Security controls on real servers: bearer token on the planner's control RPCs and the
collector's telemetry writes (sent by dispatchers and engines), TLS and
mutual TLS on every service (and on every channel the dispatcher and engine open), Redis
AUTH and TLS taken from the URL, secrets never logged, explicit deadlines on proxied
streams. Certificates are made at test time with the openssl CLI and never committed."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from dataclasses import replace

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import collector_pb2, collector_pb2_grpc, common_pb2, engine_pb2, planner_pb2, planner_pb2_grpc
from clients import AsyncCacheRouteClient
from services.collector.service import CollectorConfig, CollectorService
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.engine.service import EngineConfig, EngineService
from services.errors import Unavailable
from services.local.redis_server import RedisProcess, find_redis_server, free_port
from services.model import parse_replicas
from services.planner.control import LoopConfig
from services.planner.service import PROTECTED, PlannerConfig, PlannerService
from services.rpc import ServerConfig, TLSFiles
from services.store import Mode, RedisStore, TelemetryConfig
from tests.faults.procs import Procs

TOKEN = "tok-7f3a9c-not-for-logs"
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=120)


# ------------------------------------------------------------------ certificates

def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _issue(d, name: str, ca: str, subject: str, san: str | None) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name, cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server cert for 127.0.0.1/localhost, a client cert, and a rogue CA's client cert."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}", cwd=d)
    _issue(d, "server", "ca", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost")
    _issue(d, "client", "ca", "/CN=client", None)
    _issue(d, "rogue", "rogue-ca", "/CN=rogue", None)
    return {name: str(d / f"{name}.pem") for name in ("ca", "server", "client", "rogue")} | {
        f"{name}.key": str(d / f"{name}.key") for name in ("server", "client", "rogue")}


def server_tls(pki, *, mutual: bool) -> TLSFiles:
    """A service's TLS: its cert (also its client cert toward others), the CA for both directions."""
    return TLSFiles(cert=pki["server"], key=pki["server.key"], client_ca=pki["ca"] if mutual else None, ca=pki["ca"])


def client_creds(pki, who: str | None) -> grpc.ChannelCredentials:
    ca = open(pki["ca"], "rb").read()
    if who is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=open(pki[f"{who}.key"], "rb").read(),
                                        certificate_chain=open(pki[who], "rb").read())


async def health(address: str, service: str, creds: grpc.ChannelCredentials | None) -> str:
    channel = grpc.aio.secure_channel(address, creds) if creds else grpc.aio.insecure_channel(address)
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                                timeout=3)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.aio.AioRpcError as err:
        return err.code().name
    finally:
        await channel.close()


def redis_state(url: str) -> dict:
    r = redis.Redis.from_url(url)
    try:
        return {k: r.dump(k) for k in sorted(r.keys("*"))}
    finally:
        r.close()


# ------------------------------------------------------------------ bearer token

def test_every_control_rpc_needs_the_token_on_the_real_planner(redis_url):
    requests = {"BuildPlan": planner_pb2.BuildPlanRequest(rates=[planner_pb2.KeyRate(key="k", rate=3)], activate=True),
                "ActivatePlan": planner_pb2.ActivatePlanRequest(version=1, expected_active_version=1),
                "Rollback": planner_pb2.RollbackRequest(expected_active_version=1),
                "SetMode": planner_pb2.SetModeRequest(mode=common_pb2.MODE_FLAT),
                "PinPlan": planner_pb2.PinPlanRequest(version=1), "UnpinPlan": planner_pb2.UnpinPlanRequest(),
                "ShadowPlan": planner_pb2.ShadowPlanRequest(version=1),
                "AddEngine": planner_pb2.AddEngineRequest(address="127.0.0.1:1"),
                "DrainEngine": planner_pb2.DrainEngineRequest(engine="r1"),
                "RemoveEngine": planner_pb2.RemoveEngineRequest(engine="r1", force=True),
                "BuildPlanStream": [planner_pb2.BuildPlanRequest(rates=[planner_pb2.KeyRate(key="k", rate=3)],
                                                                 activate=True)]}   # client-streaming
    assert set(requests) == PROTECTED

    async def scenario():
        loop = LoopConfig(replica_ids=("r1", "r2"), q_cap=10.0, warm_slots=2, planner_id="p")
        service = await PlannerService(PlannerConfig(server=ServerConfig(name="planner", port=0, auth_token=TOKEN),
                                                     loop=loop, redis_url=redis_url, auto=False)).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                good = [("authorization", f"Bearer {TOKEN}")]
                await stub.BuildPlan(requests["BuildPlan"], metadata=good, timeout=5)      # v1 active
                before = redis_state(redis_url)
                for method, request in requests.items():
                    for label, metadata in (("none", None), ("wrong", [("authorization", "Bearer nope")]),
                                            ("basic", [("authorization", f"Basic {TOKEN}")]),
                                            ("empty", [("authorization", "Bearer ")])):
                        try:
                            arg = iter(request) if isinstance(request, list) else request
                            await getattr(stub, method)(arg, metadata=metadata, timeout=5)
                            out[method, label] = ("OK", "")
                        except grpc.aio.AioRpcError as err:
                            out[method, label] = (err.code().name, err.details())
                out["after"] = redis_state(redis_url)
                out["before"] = before
                out["open"] = (await stub.GetStatus(planner_pb2.GetPlannerStatusRequest(), timeout=5)).active_version
                out["with_token"] = (await stub.SetMode(requests["SetMode"], metadata=good, timeout=5)).mode
        finally:
            await service.stop(0)
        return out

    out = asyncio.run(scenario())
    for method in requests:
        assert out[method, "none"] == ("UNAUTHENTICATED", "missing bearer token")
        for label in ("wrong", "basic", "empty"):
            assert out[method, label] == ("PERMISSION_DENIED", "invalid bearer token"), (method, label)
    assert out["after"] == out["before"]                         # a refused call stores nothing
    assert out["open"] == 1 and out["with_token"] == common_pb2.MODE_FLAT


def test_collector_refuses_unauthenticated_telemetry_writes(redis_url):
    """With a token the collector's writes are protected (forged arrivals would skew the planner's
    rates); a refused stream stores nothing; GetRates needs the token too."""
    now = time.time()

    def arrivals(batch_id: str):
        return iter([collector_pb2.ArrivalBatch(batch_id=batch_id, source="x", arrivals=[
            collector_pb2.Arrival(key="forged", time=now, prompt_tokens=100, prefix_tokens=50)])])

    def stats(batch_id: str):
        return iter([collector_pb2.CacheStatsBatch(batch_id=batch_id, source="x", stats=[
            collector_pb2.CacheStat(replica_id="e9", prompt_tokens=100, cached_tokens=90, requests=1)])])

    async def scenario():
        collector = await CollectorService(CollectorConfig(
            server=ServerConfig(name="collector", port=0, auth_token=TOKEN), redis_url=redis_url,
            telemetry=TELEMETRY, window_seconds=30)).start()
        out = {}
        try:
            before = redis_state(redis_url)
            async with grpc.aio.insecure_channel(collector.address) as ch:
                stub = collector_pb2_grpc.CollectorStub(ch)
                for label, metadata in (("none", None), ("wrong", [("authorization", "Bearer nope")]),
                                        ("basic", [("authorization", f"Basic {TOKEN}")])):
                    for method, batches in (("ReportArrivals", arrivals), ("ReportCacheStats", stats)):
                        try:
                            await getattr(stub, method)(batches(f"{method}-{label}"), metadata=metadata, timeout=5)
                            out[method, label] = ("OK", "")
                        except grpc.aio.AioRpcError as err:
                            out[method, label] = (err.code().name, err.details())
                out["after"] = redis_state(redis_url)
                out["before"] = before
                good = [("authorization", f"Bearer {TOKEN}")]
                try:
                    await stub.GetRates(collector_pb2.GetRatesRequest(), timeout=5)
                    out["rates_open"] = "OK"
                except grpc.aio.AioRpcError as err:
                    out["rates_open"] = err.code().name
                out["rates"] = (await stub.GetRates(collector_pb2.GetRatesRequest(), metadata=good, timeout=5)).total_arrivals
                out["with_token"] = (await stub.ReportArrivals(arrivals("good"), metadata=good, timeout=5)).accepted
        finally:
            await collector.stop(0)
        return out

    out = asyncio.run(scenario())
    for method in ("ReportArrivals", "ReportCacheStats"):
        assert out[method, "none"] == ("UNAUTHENTICATED", "missing bearer token")
        assert out[method, "wrong"] == out[method, "basic"] == ("PERMISSION_DENIED", "invalid bearer token")
    assert out["after"] == out["before"]                          # nothing reached Redis
    assert out["rates_open"] == "UNAUTHENTICATED" and out["rates"] == 0 and out["with_token"] == 1


def test_dispatcher_and_engine_with_the_token_get_their_telemetry_counted(redis_url, caplog):
    """One token per deployment: the dispatcher's arrivals and the engine's cache stats reach a
    collector that requires it; a dispatcher started without it has its arrivals refused (logged
    and counted as dropped). The token appears in no log record."""
    caplog.set_level(logging.DEBUG)

    async def scenario():
        def server(name: str, token: str | None = TOKEN) -> ServerConfig:
            return ServerConfig(name=name, port=0, metrics_port=-1, auth_token=token)
        collector = await CollectorService(CollectorConfig(server=server("collector"), redis_url=redis_url,
                                                           telemetry=TELEMETRY, window_seconds=30)).start()
        engine = await EngineService(EngineConfig(server=server("engine"), replica_id="e0", time_scale=0.01,
                                                  collector=collector.address, report_interval=0.1)).start()
        replicas = parse_replicas(f"e0={engine.address}")
        dispatchers = {token_label: await DispatcherService(DispatcherConfig(
            server=server(f"dispatcher-{token_label}", token), replicas=replicas, collector=collector.address,
            dispatcher_id=f"d-{token_label}", telemetry_interval=0.1, poll_interval=0.1, seed=1)).start()
            for token_label, token in (("token", TOKEN), ("none", None))}
        store = RedisStore(redis_url, telemetry=TELEMETRY)
        out = {}
        try:
            async with AsyncCacheRouteClient(dispatchers["token"].address, token=TOKEN) as client:   # data plane too
                for key in ("a", "b", "c"):
                    await client.route(key)
                out["chunks"] = [c async for c in client.generate("counted", max_tokens=2, timeout=10)]
            async with AsyncCacheRouteClient(dispatchers["none"].address) as client:
                for key in ("x", "y"):
                    await client.route(key)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                snap = await store.window_rates(time.time(), 30)
                totals = await store.cache_totals()
                if snap.total_arrivals >= 4 and "e0" in totals and dispatchers["none"].router.telemetry_dropped >= 2:
                    break
                await asyncio.sleep(0.05)
            out["keys"], out["totals"] = set(snap.keys), totals
            out["dropped"] = {label: d.router.telemetry_dropped for label, d in dispatchers.items()}
            out["reporter"] = (engine.reporter.sent_batches, engine.reporter.dropped_batches)
        finally:
            await store.close()
            for d in dispatchers.values():
                await d.stop(0)
            await engine.stop(0)
            await collector.stop(0)
        return out

    out = asyncio.run(scenario())
    assert out["chunks"][-1].finished
    assert {"a", "b", "c"} <= out["keys"] and len(out["keys"]) == 4      # + the prompt's key; no x, y
    assert out["dropped"] == {"token": 0, "none": 2}                # the token-less dispatcher was refused
    assert "e0" in out["totals"] and out["totals"]["e0"].requests == 1
    assert out["reporter"][0] >= 1 and out["reporter"][1] == 0
    dropped = [r for r in caplog.records if r.getMessage() == "arrivals dropped"]
    assert dropped and {r.fields["code"] for r in dropped} == {"UNAUTHENTICATED"}
    assert not any(TOKEN in f"{r.getMessage()} {getattr(r, 'fields', '')}" for r in caplog.records)


# ------------------------------------------------------------------ TLS and mTLS on every service

async def _tls_services(pki, redis_url: str, *, mutual: bool):
    tls = server_tls(pki, mutual=mutual)

    def server(name: str) -> ServerConfig:
        return ServerConfig(name=name, port=0, metrics_port=-1, tls=tls)
    collector = await CollectorService(CollectorConfig(server=server("collector"), redis_url=redis_url,
                                                       telemetry=TELEMETRY, window_seconds=30)).start()
    engine = await EngineService(EngineConfig(server=server("engine"), replica_id="e0", time_scale=0.01,
                                              collector=collector.address, report_interval=0.1)).start()
    loop = LoopConfig(replica_ids=("e0",), q_cap=10.0, warm_slots=2, planner_id="p")
    planner = await PlannerService(PlannerConfig(server=server("planner"), loop=loop, redis_url=redis_url,
                                                 telemetry=TELEMETRY, auto=False, watch_poll_seconds=0.2)).start()
    dispatcher = await DispatcherService(DispatcherConfig(
        server=server("dispatcher"), replicas=parse_replicas(f"e0={engine.address}"), planner=planner.address,
        collector=collector.address, telemetry_interval=0.1, poll_interval=0.1, seed=1)).start()
    return {"Collector": collector, "Engine": engine, "Planner": planner, "Dispatcher": dispatcher}


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_tls_on_every_service_and_every_outgoing_channel(pki, redis_url, mutual):
    async def scenario():
        services = await _tls_services(pki, redis_url, mutual=mutual)
        out = {}
        try:
            for name, s in services.items():
                full = f"cacheroute.v1.{name}"
                out[name, "plaintext"] = await health(s.address, full, None)
                out[name, "no_cert"] = await health(s.address, full, client_creds(pki, None))
                out[name, "client_cert"] = await health(s.address, full, client_creds(pki, "client"))
                out[name, "rogue_cert"] = await health(s.address, full, client_creds(pki, "rogue"))
            client_tls = TLSFiles(cert=pki["client"], key=pki["client.key"], ca=pki["ca"])
            dispatcher, planner = services["Dispatcher"], services["Planner"]
            async with AsyncCacheRouteClient(dispatcher.address, planner=planner.address, tls=client_tls) as client:
                built = await client.build_plan({"hot": 25.0, "warm": 4.0}, activate=True)
                deadline = time.monotonic() + 5
                while dispatcher.router.plan_version != built.plan.version and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                out["route"] = await client.route("hot")
                out["chunks"] = [c async for c in client.generate("hello over tls", max_tokens=3, timeout=10)]
                out["source"] = dispatcher.router.plan_source
                out["healthy"] = list(dispatcher.router.state.healthy)
            store = RedisStore(redis_url, telemetry=TELEMETRY)
            try:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    arrivals = (await store.window_rates(time.time(), 30)).total_arrivals
                    totals = await store.cache_totals()
                    if arrivals >= 2 and totals:
                        break
                    await asyncio.sleep(0.05)
                out["arrivals"], out["cache_totals"] = arrivals, totals
            finally:
                await store.close()
        finally:
            for s in reversed(list(services.values())):
                await s.stop(0)
        return out

    out = asyncio.run(scenario())
    for name in ("Collector", "Engine", "Planner", "Dispatcher"):
        assert out[name, "plaintext"] == "UNAVAILABLE", name                 # plaintext client refused
        assert out[name, "client_cert"] == "SERVING", name
        assert out[name, "no_cert"] == ("UNAVAILABLE" if mutual else "SERVING"), name
        assert out[name, "rogue_cert"] == ("UNAVAILABLE" if mutual else "SERVING"), name
    # the dispatcher reached the engine (health poll, Generate), the planner (watch) and the
    # collector (arrivals), and the engine reached the collector (cache stats), all over TLS
    assert out["healthy"] == [True] and out["source"] == "watch"
    assert out["route"].reason == common_pb2.ROUTE_REASON_PLANNED and out["chunks"][-1].finished
    assert out["arrivals"] >= 2 and "e0" in out["cache_totals"]


# ------------------------------------------------------------------ Redis AUTH and TLS

def test_redis_auth_from_the_url_and_the_password_never_echoed():
    password = "pw-93be1d-secret"

    async def scenario(server: RedisProcess):
        out = {}
        for label, url in (("right", server.url), ("none", f"redis://127.0.0.1:{server.port}/0"),
                           ("wrong", f"redis://:wrong-{password}@127.0.0.1:{server.port}/0")):
            store = RedisStore(url, timeout=1.0)
            try:
                await store.set_mode(Mode.FLAT, reason=label, now=1.0)
                out[label] = "OK"
            except Unavailable as exc:
                out[label] = str(exc)
            finally:
                await store.close()
        return out

    with RedisProcess(password=password) as server:
        out = asyncio.run(scenario(server))
    assert out["right"] == "OK"
    for label in ("none", "wrong"):
        assert out[label].startswith("redis unavailable at 127.0.0.1:") and password not in out[label], out[label]


def test_redis_tls_from_a_rediss_url(pki, tmp_path):
    port = free_port()
    proc = subprocess.Popen([find_redis_server(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", pki["server"], "--tls-key-file", pki["server.key"],
                             "--tls-ca-cert-file", pki["ca"], "--tls-auth-clients", "no", "--requirepass", "pw",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def scenario():
        tls_url = f"rediss://:pw@127.0.0.1:{port}/0?ssl_ca_certs={pki['ca']}"
        deadline = time.monotonic() + 10
        store = RedisStore(tls_url, timeout=1.0)
        try:
            while True:
                try:
                    await store.ping()
                    break
                except Unavailable:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            await store.set_mode(Mode.FLAT, reason="over tls", now=1.0)
            state = await store.get_control()
        finally:
            await store.close()
        plain = RedisStore(f"redis://:pw@127.0.0.1:{port}/0", timeout=1.0)
        try:
            await plain.get_control()
            refused = ""
        except Unavailable as exc:
            refused = str(exc)
        finally:
            await plain.close()
        # a whole planner on the TLS Redis
        loop = LoopConfig(replica_ids=("r1",), q_cap=10.0, warm_slots=2, planner_id="p")
        planner = await PlannerService(PlannerConfig(server=ServerConfig(name="planner", port=0), loop=loop,
                                                     redis_url=tls_url, auto=False)).start()
        try:
            async with grpc.aio.insecure_channel(planner.address) as ch:
                status = await planner_pb2_grpc.PlannerStub(ch).GetStatus(planner_pb2.GetPlannerStatusRequest(),
                                                                          timeout=5)
        finally:
            await planner.stop(0)
        return state, refused, status

    try:
        state, refused, status = asyncio.run(scenario())
    finally:
        proc.kill()
        proc.wait(5)
    assert state.mode is Mode.FLAT and state.mode_reason == "over tls"
    assert refused.startswith(f"redis unavailable at 127.0.0.1:{port}")   # plaintext to the TLS port fails
    assert status.mode == common_pb2.MODE_FLAT


# ------------------------------------------------------------------ secrets stay out of logs

def test_secrets_from_env_and_files_never_reach_the_logs(tmp_path):
    password = "pw-5c0ffee-secret"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    procs = Procs(tmp_path / "logs")
    server = RedisProcess(password=password).start()
    try:
        planner = procs.start("planner", "planner", [
            "--replicas", "r1,r2", "--auth-token-file", str(token_file), "--log-level", "DEBUG", "--auto", "1",
            "--interval", "0.2", "--lease-ttl", "1"], env={"CACHEROUTE_REDIS_URL": server.url})
        cmdline = open(f"/proc/{planner.pid}/cmdline", "rb").read().decode(errors="replace")
        with grpc.insecure_channel(planner.address) as ch:
            stub = planner_pb2_grpc.PlannerStub(ch)
            good = [("authorization", f"Bearer {TOKEN}")]
            stub.BuildPlan(planner_pb2.BuildPlanRequest(rates=[planner_pb2.KeyRate(key="k", rate=3)], activate=True),
                           metadata=good, timeout=5)
            codes = []
            for metadata in (None, [("authorization", f"Bearer {TOKEN}x")], good):
                try:
                    stub.SetMode(planner_pb2.SetModeRequest(mode=99), metadata=metadata, timeout=5)
                except grpc.RpcError as err:
                    codes.append(err.code().name)
            server.stop()                                         # errors that mention Redis
            try:
                stub.GetStatus(planner_pb2.GetPlannerStatusRequest(), timeout=5)
            except grpc.RpcError as err:
                codes.append(err.code().name)
                detail = err.details()
            deadline = time.monotonic() + 15                      # the loop and the hub log their failures
            while "redis unavailable" not in planner.log_text() and time.monotonic() < deadline:
                time.sleep(0.05)
        log = planner.log_text()
    finally:
        procs.cleanup()
        server.close()
    assert codes == ["UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT", "UNAVAILABLE"]
    assert "redis unavailable" in log and '"auth":true' in log          # a token was configured
    for secret in (TOKEN, password):
        assert secret not in log and secret not in detail and secret not in cmdline


# ------------------------------------------------------------------ deadlines on proxied streams

def test_a_client_deadline_ends_the_proxied_stream_and_frees_the_engine():
    async def scenario():
        engine = await EngineService(EngineConfig(server=ServerConfig(name="engine", port=0), replica_id="e0",
                                                  time_scale=1.0)).start()
        dispatcher = await DispatcherService(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0={engine.address}"),
            poll_interval=0.1, seed=1)).start()
        try:
            async with AsyncCacheRouteClient(dispatcher.address) as client:
                started = time.monotonic()
                try:
                    async for _ in client.generate("a long one", max_tokens=2000, timeout=0.5):
                        pass
                    code = "OK"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                elapsed = time.monotonic() - started
            deadline = time.monotonic() + 2
            while engine.runner.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return code, elapsed, engine.runner.in_flight
        finally:
            await dispatcher.stop(0)
            await engine.stop(0)

    code, elapsed, left = asyncio.run(scenario())
    assert code == "DEADLINE_EXCEEDED" and elapsed < 1.0
    assert left == 0                     # the deadline reached the engine: the request was aborted there
