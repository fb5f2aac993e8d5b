"""The routers bench/peers.py puts in front of the engines, as tiers of N instances.

A tier is what a production routing layer looks like: N router instances behind one Service,
the client spreading requests round robin over them (clients.openloop.Rotation). Per router:

  cacheroute      the stack (redis, collector, planner) and N dispatchers sharing its one plan
                  (services.local.stack, `dispatchers=N`), HTTP to the engines
  cacheroute-w2   the same, each dispatcher with 2 worker processes (CACHEROUTE_WORKERS=2)
  cacheroute-bus  the same with the record bus between its dispatchers forced on (CACHEROUTE_RECORD_BUS=1;
                  services/dispatcher/recordbus.py; the default since 2026-12-06, docs/experiments.md "The
                  record bus live, a second seed"); `cacheroute-nobus` forces it off (=0). The 2026-12-03
                  A/B runs named the bus-on tier `cacheroute` and the bus-off one `cacheroute-nobus`
                  (bench/results/peers/bound-*-t4-bus.json); the 2026-12-06 seed-2 runs (-bus-s2.json),
                  when the default was still off, `cacheroute` (off) and `cacheroute-bus` (on)
  smg-ca          N x `python -m smg launch --policy cache_aware` (Shepherd Model Gateway 1.13,
                  its defaults; `-m smg` because sglang-router also installs a `smg` script),
                  each with its own tree (no coordination)
  smg-mesh        the same joined with `--enable-mesh` (its HA mesh: every instance lists the
                  others as `--mesh-peer-urls`, so they share state)
  sglang-ca       N x `python -m sglang_router.launch_router --policy cache_aware`
  sglang-rr       the same with `--policy round_robin`
  vllm-ca         N x `vllm-router --policy cache_aware`
  vllm-rr         the same with `--policy round_robin` (not in the default set; bench/http_proxy.py's
                  bare proxy: vllm-router's cache_aware posts /v1/chat/completions/render and /tokenize
                  to the engine for every request, even with one engine; round_robin posts neither)
  direct          no router: every request to engine 1 (one engine's queue; the tier is ignored)

Every peer instance gets its own ports, `--host 127.0.0.1` and `--request-timeout-secs` equal
to the client's timeout; nothing else is changed. An instance is ready once `GET /v1/models`
answers through it. `Router.restart(i)` stops instance i (SIGTERM) and starts it again with
the same command line (a CacheRoute dispatcher comes back on new ephemeral ports, as a
restarted pod gets a new address); `Router.kill(i)` SIGKILLs it for good. Router CPU is the
utime + stime of every instance's process tree, live ones from /proc plus what stopped
instances had used when they stopped (`retired_cpu`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from peers_procs import Engines, Proc, cpu_seconds, free_port, spawn, wait_ready

ROUTERS = ("cacheroute", "smg-ca", "smg-mesh", "sglang-ca", "sglang-rr", "vllm-ca", "direct")
EXTRA_ROUTERS = ("cacheroute-w2", "cacheroute-bus", "cacheroute-nobus", "vllm-rr")   # variants, not in the default set (header)
PEER_DISTS = ("smg", "sglang-router", "vllm-router", "xllamacpp")

# CacheRoute's settings, the same for every workload and scale: the stack's defaults (q_cap 20
# req/s, W 64 warm slots, a 10 s control loop over a 60 s window of 1 s buckets), engines
# reached over HTTP as vLLM-kind backends (the simulated engine speaks vLLM's metric names).
POLL_INTERVAL, POLL_TIMEOUT = 0.5, 2.0


@dataclass
class Router:
    name: str
    urls: list[str]                                       # one base URL per instance
    procs: list[Proc | None] = field(default_factory=list)   # peer instances (index = instance)
    cmds: list[list[str]] = field(default_factory=list)      # their command lines, for restarts
    control: list[Proc] = field(default_factory=list)     # CacheRoute's control plane (CPU apart)
    on_warm: Callable[[], Any] | None = None              # coroutine factory run at half warm-up
    notes: list[str] = field(default_factory=list)
    stack: Any = None
    metrics_urls: list[str] = field(default_factory=list)  # the peers' own Prometheus endpoints
    log_dir: Path | None = None
    retired_cpu: float = 0.0
    events: list[dict] = field(default_factory=list)     # restarts and kills, with their times

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def tier(self) -> int:
        return len(self.urls)

    def _dispatchers(self) -> list:
        return self.stack.of_kind("dispatcher") if self.stack is not None else []

    @property
    def router_pids(self) -> list[int]:
        if self.stack is not None:
            return [c.proc.pid for c in self._dispatchers() if c.proc is not None and c.proc.poll() is None]
        return [p.pid for p in self.procs if p is not None and p.popen.poll() is None]

    @property
    def control_pids(self) -> list[int]:
        return [p.pid for p in self.control]

    def cpu(self) -> float:
        return cpu_seconds(self.router_pids) + self.retired_cpu

    def control_cpu(self) -> float:
        return cpu_seconds(self.control_pids)

    def _instance_pid(self, i: int) -> int | None:
        if self.stack is not None:
            c = self._dispatchers()[i]
            return c.proc.pid if c.proc is not None else None
        p = self.procs[i]
        return p.pid if p is not None else None

    def _retire(self, i: int) -> None:
        pid = self._instance_pid(i)
        if pid is not None:
            self.retired_cpu += cpu_seconds([pid])

    async def restart(self, i: int, timeout: float = 90.0) -> str:
        """Stop instance i and start it again; its (possibly new) URL once it is ready."""
        t0 = time.monotonic()
        self._retire(i)
        if self.stack is not None:
            url = await asyncio.to_thread(self._restart_dispatcher, i, timeout)
        else:
            await asyncio.to_thread(self.procs[i].stop)
            self.procs[i] = spawn(f"{self.name}-{i + 1}", self.cmds[i], self.log_dir)
            await wait_ready(self.urls[i], self.procs[i], timeout, "/v1/models", want=serves_a_model)
            url = self.urls[i]
        self.urls[i] = url
        self.events.append({"kind": "restart", "instance": i, "down_s": round(time.monotonic() - t0, 2)})
        return url

    def _restart_dispatcher(self, i: int, timeout: float) -> str:
        from services.local.stack import http_ready

        child = self._dispatchers()[i]
        self.stack.terminate(child.name)
        child.stopping = child.exit_reported = False
        child.address, child.http_url = "", ""
        child._log_offset = child.log_path.stat().st_size if child.log_path.exists() else 0
        self.stack._spawn(child)
        deadline = time.monotonic() + timeout
        while not (child.read_bound_address() and http_ready(child.http_url)):
            if child.returncode is not None:
                raise RuntimeError(f"{child.name} exited with {child.returncode} on restart:\n{child.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} not ready {timeout:g}s after its restart")
            time.sleep(0.05)
        return child.http_url

    def kill(self, i: int) -> None:
        """SIGKILL instance i; it is not restarted."""
        self._retire(i)
        if self.stack is not None:
            self.stack.terminate(self._dispatchers()[i].name, kill=True)
        elif self.procs[i] is not None:
            self.procs[i].kill()
        self.events.append({"kind": "kill", "instance": i})

    def stop(self) -> None:
        for p in self.procs + self.control:
            if p is not None:
                p.stop()
        if self.stack is not None:
            self.stack.stop()


def serves_a_model(status: int, body: bytes) -> bool:
    """/v1/models answered with at least one model: the router has registered a worker (smg
    answers an empty list, and 404s requests, until its background registration is done)."""
    import json

    if status != 200:
        return False
    try:
        return bool(json.loads(body).get("data"))
    except (ValueError, AttributeError):
        return False


def peer_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def peer_command(name: str, workers: list[str], port: int, mport: int, timeout: float,
                 mesh: tuple[int, list[int]] | None = None) -> list[str]:
    """One peer instance's command line (its defaults; ports, host and the request timeout set)."""
    exe_dir = Path(sys.executable).parent
    common = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
              "--prometheus-port", str(mport), "--request-timeout-secs", str(int(timeout))]
    if name in ("smg-ca", "smg-mesh"):
        # `python -m smg`, not the `smg` script: sglang-router 0.3.2 installs an `smg` console script
        # of its own (sglang_router.cli), and whichever package was installed last owns bin/smg
        cmd = [sys.executable, "-m", "smg", "launch", "--worker-urls", *workers, "--policy", "cache_aware", *common,
               "--log-level", "warn"]
        if name == "smg-mesh":
            own, others = mesh
            cmd += ["--enable-mesh", "--mesh-host", "127.0.0.1", "--mesh-advertise-host", "127.0.0.1",
                    "--mesh-port", str(own)]
            if others:
                cmd += ["--mesh-peer-urls", *[f"127.0.0.1:{p}" for p in others]]
        return cmd
    if name in ("sglang-ca", "sglang-rr"):
        policy = "cache_aware" if name == "sglang-ca" else "round_robin"
        return [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers, "--policy", policy,
                *common, "--log-level", "warn"]
    if name in ("vllm-ca", "vllm-rr"):
        policy = "cache_aware" if name == "vllm-ca" else "round_robin"
        return [str(exe_dir / "vllm-router"), "--worker-urls", *workers, "--policy", policy, *common,
                "--log-level", "warning"]
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS + EXTRA_ROUTERS)}")


async def start_router(name: str, scale: Any, engines: Engines, log_dir: Path, tier: int = 1) -> Router:
    if tier < 1:
        raise ValueError("a tier needs at least one router instance")
    workers = engines.urls
    if name == "direct":
        return Router(name, [workers[0]])
    if name in ("cacheroute", "cacheroute-w2", "cacheroute-bus", "cacheroute-nobus"):
        bus = {"cacheroute-bus": True, "cacheroute-nobus": False}.get(name)
        return await start_cacheroute(scale, engines, log_dir, tier=tier, workers=2 if name == "cacheroute-w2" else 1,
                                      record_bus=bus)
    ports = [free_port() for _ in range(tier)]
    mports = [free_port() for _ in range(tier)]
    mesh_ports = [free_port() for _ in range(tier)]
    cmds = [peer_command(name, workers, ports[i], mports[i], scale.timeout,
                         mesh=(mesh_ports[i], mesh_ports[:i] + mesh_ports[i + 1:]))
            for i in range(tier)]
    router = Router(name, [f"http://127.0.0.1:{p}" for p in ports], cmds=cmds,
                    metrics_urls=[f"http://127.0.0.1:{p}" for p in mports], log_dir=log_dir)
    try:
        for i, cmd in enumerate(cmds):
            router.procs.append(spawn(f"{name}-{i + 1}", cmd, log_dir))
        # ready once it answers /v1/models from a worker (its own /health may precede registration)
        await asyncio.gather(*(wait_ready(u, p, 90.0, "/v1/models", want=serves_a_model)
                               for u, p in zip(router.urls, router.procs)))
    except BaseException:
        router.stop()
        raise
    return router


async def start_cacheroute(scale: Any, engines: Engines, log_dir: Path, *, tier: int = 1, workers: int = 1,
                           record_bus: bool | None = None) -> Router:
    from services.local.stack import Stack, StackConfig

    kind = "llamacpp" if engines.kind == "llama" else "vllm"
    os.environ["CACHEROUTE_KEY_TOKENS"] = str(scale.key_tokens)   # read by the dispatcher (--key-tokens)
    # The dispatcher polls each engine's /health and /metrics; its defaults (every 0.25 s, 0.2 s
    # timeout) suit loopback engines on an idle machine. On the shared 2-core machine every replica
    # timed out within 25 s at 50 req/s and was taken out of rotation (503s), so the poll gets the
    # multi-second budget the peers' own health checks have: every 0.5 s, 2 s timeout.
    os.environ["CACHEROUTE_POLL_INTERVAL"] = str(POLL_INTERVAL)
    os.environ["CACHEROUTE_POLL_TIMEOUT"] = str(POLL_TIMEOUT)
    os.environ["CACHEROUTE_HEALTH_TIMEOUT"] = str(POLL_TIMEOUT)    # the planner's checks (failure repair)
    os.environ["CACHEROUTE_WORKERS"] = str(workers)     # dispatcher worker processes sharing its ports
    # the dispatchers' default (None) unless the variant forces the bus on or off (set every time:
    # one process starts many)
    if record_bus is None:
        os.environ.pop("CACHEROUTE_RECORD_BUS", None)
    else:
        os.environ["CACHEROUTE_RECORD_BUS"] = "1" if record_bus else "0"
    config = StackConfig(engines=len(engines.urls), dispatchers=tier, engine_kind=kind,
                         engine_urls=tuple(engines.urls), log_dir=str(log_dir / "cacheroute"), metrics=False,
                         seed=0)
    stack = await asyncio.to_thread(lambda: Stack(config).start())
    control = [Proc(c.name, c.proc, c.log_path) for c in stack.children if c.kind in ("planner", "collector")]
    if stack.redis is not None and stack.redis.proc is not None:
        control.append(Proc("redis", stack.redis.proc, log_dir / "redis.log"))
    name = "cacheroute" if workers == 1 else f"cacheroute-w{workers}"
    router = Router(name, list(stack.http), control=control, stack=stack, log_dir=log_dir)

    async def observe() -> None:
        """At half the warm-up: the plan the planner's own loop has live; only if it has none yet
        (a point shorter than the loop's 10 s interval, as the smoke run) a BuildPlan from the
        telemetry so far, which is then a first plan at home (no plan it could replace)."""
        from clients.client import AsyncCacheRouteClient

        async with AsyncCacheRouteClient(stack.dispatchers, planner=stack.planner, timeout=10.0) as client:
            status = await client.planner_status()
            if status.active_version:
                plan = await client.get_plan(status.active_version, summary_only=True)
                router.notes.append(f"plan v{plan.version} live at half warm-up: {plan.admitted_keys} keys, "
                                    f"builder {plan.builder}")
                return
            try:
                plan = (await client.build_plan(activate=True, expected_active_version=0)).plan
            except Exception as exc:   # noqa: BLE001 - e.g. the loop activated one meanwhile (CAS)
                router.notes.append(f"no plan built at half warm-up: {str(exc).splitlines()[0][:160]}")
                return
            router.notes.append(f"plan v{plan.version} built at half warm-up (the loop had none): "
                                f"{plan.admitted_keys} keys, builder {plan.builder}")

    router.on_warm = observe
    return router
