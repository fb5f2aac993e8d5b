"""The local stack as separate processes: what `cacheroute up`, `cacheroute demo` and the
end-to-end test run.

Topology (one process each, `sys.executable -m services.<name>`, all on loopback):
  redis-server (embedded, services.local.redis_server) or an existing one (`redis_url`)
  collector                      -> Redis
  engine-1..N                    -> collector (cache stats); simulated engines, or real llama.cpp
                                    replicas (`llamacpp_model`: services.engine.llamacpp), or none
                                    when `engine_urls` names engines that already run
  planner                        -> Redis, engines (health checks for failure repair)
  dispatcher-1..M                -> engines, planner (WatchPlans), Redis (fallback), collector

HTTP. Dispatchers serve the OpenAI HTTP API and simulated engines their own (`http`, default
on, ephemeral ports, read from the "http serving" log line). With `engine_kind` other than
cacheroute the dispatchers reach the engines over HTTP (`id=KIND+URL` replicas).

Ports. Every service binds port 0 (and metrics port 0) and logs its bound address in the
"serving" line that `services.rpc.start_server` writes; the stack reads that line from
the child's log file, so no port is picked in advance and none can be taken in between.
A service counts as up once its grpc health check says SERVING. Tiers start in
dependency order (collector, then engines, then planner, then dispatchers); the members of
a tier start concurrently.

Stopping: tiers in reverse order; within a tier SIGTERM to every child (each service then
goes NOT_SERVING and stops with its grace period), a wait of `grace + stop_timeout`, then
SIGKILL for any that are left. Redis last.

Children run in their own session, so a terminal's Ctrl-C reaches only the supervisor,
which then stops them in order. Where util-linux `setpriv` exists (Linux) they are started
through `setpriv --pdeathsig TERM`: if the supervisor dies, even by SIGKILL, they are told
to stop. (Not a `preexec_fn`: forking with Python code to run in the child deadlocks
against grpc's fork handlers once the supervisor has opened a channel.) The death signal
follows the thread that started them, so call `start()` from a thread that outlives the
stack (the main one). The embedded redis-server (services.local.redis_server) shares the
supervisor's process group, so a terminal's Ctrl-C reaches it directly.

Logs: each child's stdout and stderr go to `<log_dir>/<name>.log` (JSON lines).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from services.backends import KINDS
from services.local.launch import launcher
from services.local.redis_server import RedisProcess
from services.rpc.healthcheck import is_serving

SERVICE_NAMES = {
    "planner": "cacheroute.v1.Planner",
    "collector": "cacheroute.v1.Collector",
    "engine": "cacheroute.v1.Engine",
    "dispatcher": "cacheroute.v1.Dispatcher",
}

MODULES = {"llamacpp": "services.engine.llamacpp"}   # children whose module is not services.<kind>


class StackError(RuntimeError):
    """The stack could not be started (a child exited or never became SERVING)."""


@dataclass(frozen=True)
class StackConfig:
    engines: int = 4
    dispatchers: int = 2
    dispatcher_workers: int = 1           # worker processes per dispatcher (--workers; 0 = one per core)
    profile: str = "llama3-8b-h100"
    time_scale: float = 1.0
    kv_blocks: int | None = None          # None: the profile's
    planner_interval: float = 10.0        # control-loop period, seconds
    window_seconds: float = 60.0          # telemetry window the planner reads
    bucket_seconds: float = 1.0           # telemetry bucket width (planner and collector)
    q_cap: float = 20.0                   # req/s per replica at the knee (8B: ~15-20, services/sim/calibrate.py)
    warm_slots: int = 64                  # W: 440k cached tokens x 0.5 / ~3,480-token prefixes
    planner_auto: bool = True             # run the planner's control loop
    switch_knobs: str = ""                # planner --switch-knobs NAME=VALUE,... ("" = its defaults)
    redis_url: str | None = None          # None: start an embedded redis-server
    redis_maxmemory: str = "256mb"        # embedded Redis bound, policy volatile-lru ("": none; localredis.py)
    log_dir: str | None = None            # None: a new temporary directory (kept after stop)
    log_level: str = "INFO"
    host: str = "127.0.0.1"
    metrics: bool = True                  # Prometheus endpoints on ephemeral ports
    grace_seconds: float = 1.0            # each service's shutdown grace
    start_timeout: float = 60.0           # per tier
    stop_timeout: float = 5.0             # beyond the grace, before SIGKILL
    seed: int | None = None               # dispatchers' P2C seeds (seed + i)
    http: bool = True                     # OpenAI HTTP API on dispatchers and simulated engines
    engine_kind: str = "cacheroute"       # how dispatchers reach engines (services.backends kinds)
    engine_urls: tuple[str, ...] = ()     # engines already running: start none, front these
    llamacpp_model: str | None = None     # start real llama.cpp replicas with this GGUF
    llamacpp_threads: int = 1
    llamacpp_ctx: int = 4096
    llamacpp_parallel: int = 1

    def __post_init__(self) -> None:
        if self.engines < 1 or self.dispatchers < 1:
            raise ValueError("a stack needs at least one engine and one dispatcher")
        if self.dispatcher_workers < 0:
            raise ValueError("dispatcher_workers must be >= 0 (0 = one per core)")
        for name in ("time_scale", "planner_interval", "window_seconds", "bucket_seconds", "q_cap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.warm_slots < 1:
            raise ValueError("warm_slots must be >= 1")

        if self.engine_kind not in KINDS:
            raise ValueError(f"engine_kind must be one of {', '.join(KINDS)}")
        if self.llamacpp_model and self.engine_kind != "llamacpp":
            raise ValueError("llamacpp_model needs engine_kind llamacpp")
        if self.engine_kind == "llamacpp" and not (self.llamacpp_model or self.engine_urls):
            raise ValueError("engine kind llamacpp: give the GGUF model to start replicas, or engine URLs")
        if self.engine_urls and self.engine_kind == "cacheroute" and any("://" in u for u in self.engine_urls):
            raise ValueError("engine URLs need an HTTP engine kind (vllm, sglang, llamacpp, openai)")
        if self.log_level.upper() not in ("DEBUG", "INFO"):
            raise ValueError("log_level must be DEBUG or INFO (the stack reads the 'serving' log line)")


@dataclass
class Child:
    """One service process."""

    name: str                      # "planner", "engine-2", ...
    kind: str                      # services.<kind>
    args: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    address: str = ""
    metrics_port: int | None = None
    http_url: str = ""             # its HTTP API ("http serving" line), when it has one
    expect_http: bool = False
    stopping: bool = False
    exit_reported: bool = False
    _log_offset: int = 0

    @property
    def service(self) -> str:
        return SERVICE_NAMES.get(self.kind, "")

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def read_bound_address(self) -> bool:
        """Scan new log output for the 'serving' line (and the 'http serving' line when the child
        has an HTTP API); True once the addresses are known."""
        if self.address and (self.http_url or not self.expect_http):
            return True
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                data = fh.read()
        except OSError:
            return False
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        for line in data[:end].splitlines():
            doc = parse_serving_line(line)
            if doc is not None:
                self.address = doc["address"]
                self.metrics_port = doc.get("metrics_port")
            url = parse_http_line(line)
            if url is not None:
                self.http_url = url
                if not self.service:          # an HTTP-only child (llama.cpp): its URL is its address
                    self.address = url
        return bool(self.address and (self.http_url or not self.expect_http))


def _log_record(line: bytes) -> Any:
    """The JSON record in one log line, or None. A child's native code (llama.cpp) writes to the
    same stream without a newline of its own, so its text may precede the record on the line."""
    start = line.find(b'{"')
    if start < 0:
        return None
    try:
        return orjson.loads(line[start:])
    except orjson.JSONDecodeError:
        return None


def parse_serving_line(line: bytes) -> dict[str, Any] | None:
    """The fields of services.rpc's "serving" JSON log line, or None for any other line."""
    if b'"serving"' not in line:
        return None
    doc = _log_record(line)
    if isinstance(doc, dict) and doc.get("msg") == "serving" and isinstance(doc.get("address"), str):
        return doc
    return None


def parse_http_line(line: bytes) -> str | None:
    """The URL of services.http.server's "http serving" log line, or None for any other line."""
    if b'"http serving"' not in line:
        return None
    doc = _log_record(line)
    if isinstance(doc, dict) and doc.get("msg") == "http serving" and isinstance(doc.get("url"), str):
        return doc["url"]
    return None


def http_ready(url: str, timeout: float = 1.0) -> bool:
    """True if `GET url/health` answers 2xx."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (OSError, urllib.error.URLError):
        return False


class Stack:
    """`Stack(config).start()` ... `stop()`; or `with Stack(config) as stack: ...`."""

    def __init__(self, config: StackConfig = StackConfig()) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="cacheroute-stack-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisProcess | None = None
        self.redis_url = config.redis_url or ""
        self.tiers: list[list[Child]] = []
        self._launcher = launcher()

    # ------------------------------------------------------------ addresses

    @property
    def children(self) -> list[Child]:
        return [c for tier in self.tiers for c in tier]

    def child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def of_kind(self, kind: str) -> list[Child]:
        return [c for c in self.children if c.kind == kind]

    @property
    def planner(self) -> str:
        return self.child("planner").address

    @property
    def collector(self) -> str:
        return self.child("collector").address

    @property
    def dispatchers(self) -> list[str]:
        return [c.address for c in self.of_kind("dispatcher")]

    @property
    def engines(self) -> dict[str, str]:
        """Replica id -> the address dispatchers and the planner use (`KIND+URL` for HTTP kinds)."""
        kind = self.config.engine_kind
        if self.config.engine_urls:
            return {f"engine-{i}": (url if "+" in url.split("://")[0] else f"{kind}+{url}")
                    for i, url in enumerate(self.config.engine_urls, 1)}
        out = {}
        for c in self.of_kind("engine") + self.of_kind("llamacpp"):
            out[c.name] = c.address if kind == "cacheroute" else f"{kind}+{c.http_url}"
        return out

    @property
    def http(self) -> list[str]:
        """The dispatchers' OpenAI HTTP API base URLs."""
        return [c.http_url for c in self.of_kind("dispatcher") if c.http_url]

    @property
    def engines_http(self) -> list[str]:
        """The engines' own HTTP API base URLs (simulated, llama.cpp, or the given ones)."""
        if self.config.engine_urls:
            return [url.split("+", 1)[1] if "+" in url.split("://")[0] else url for url in self.config.engine_urls]
        return [c.http_url for c in self.of_kind("engine") + self.of_kind("llamacpp") if c.http_url]

    def describe(self) -> dict[str, Any]:
        """Addresses, metrics ports, pids and log files, for `cacheroute up --json`."""
        services = [{"name": c.name, "kind": c.kind, "address": c.address, "http": c.http_url or None,
                     "metrics_port": c.metrics_port,
                     "pid": c.proc.pid if c.proc else None, "log": str(c.log_path)} for c in self.children]
        return {"redis": self.redis_url, "redis_embedded": self.redis is not None, "log_dir": str(self.log_dir),
                "planner": self.planner, "collector": self.collector, "dispatchers": self.dispatchers,
                "http": self.http, "engines_http": self.engines_http, "engine_kind": self.config.engine_kind,
                "services": services}

    # ------------------------------------------------------------ start

    def start(self) -> "Stack":
        """Start everything and wait until every service is SERVING; StackError (after
        stopping what did start) if one exits or times out."""
        try:
            if not self.redis_url:
                self.redis = RedisProcess(host=self.config.host, maxmemory=self.config.redis_maxmemory).start()
                self.redis_url = self.redis.url
            self._start_tier([self._collector()])
            if self.config.llamacpp_model:
                self._start_tier([self._llamacpp(i) for i in range(1, self.config.engines + 1)])
            elif not self.config.engine_urls:
                self._start_tier([self._engine(i) for i in range(1, self.config.engines + 1)])
            self._start_tier([self._planner()])
            self._start_tier([self._dispatcher(i) for i in range(1, self.config.dispatchers + 1)])
        except BaseException:
            self.stop()
            raise
        return self

    def _start_tier(self, tier: list[Child]) -> None:
        self.tiers.append(tier)
        for child in tier:
            self._spawn(child)
        deadline = time.monotonic() + self.config.start_timeout
        waiting = list(tier)
        while waiting:
            for child in list(waiting):
                if child.returncode is not None:
                    raise StackError(f"{child.name} exited with code {child.returncode} while starting; "
                                     f"log {child.log_path}:\n{child.log_tail()}")
                if child.read_bound_address() and (
                        is_serving(child.address, child.service, timeout=1.0) if child.service
                        else http_ready(child.http_url)):
                    waiting.remove(child)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(c.name for c in waiting)
                raise StackError(f"not SERVING after {self.config.start_timeout:g}s: {names} (logs in {self.log_dir})")
            if waiting:
                time.sleep(0.05)

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(child.log_path, "ab") as log:
            module = MODULES.get(child.kind, f"services.{child.kind}")
            child.proc = subprocess.Popen([*self._launcher, sys.executable, "-m", module, *child.args],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)

    # ------------------------------------------------------------ children's command lines

    def _common(self) -> list[str]:
        cfg = self.config
        return ["--host", cfg.host, "--port", "0", "--metrics-host", cfg.host,
                "--metrics-port", "0" if cfg.metrics else "-1", "--grace-seconds", f"{cfg.grace_seconds:g}",
                "--log-level", cfg.log_level.upper()]

    def _new_child(self, name: str, kind: str, args: list[str]) -> Child:
        path = self.log_dir / f"{name}.log"
        path.write_bytes(b"")
        return Child(name, kind, self._common() + args, path)

    def _store_args(self) -> list[str]:
        return ["--redis", self.redis_url, "--bucket-seconds", f"{self.config.bucket_seconds:g}"]

    def _collector(self) -> Child:
        return self._new_child("collector", "collector",
                               self._store_args() + ["--window", f"{self.config.window_seconds:g}"])

    def _planner(self) -> Child:
        cfg = self.config
        # id=address pairs: the planner health-checks the engines and repairs plans when one dies
        replicas = ",".join(f"{name}={address}" for name, address in self.engines.items())
        return self._new_child("planner", "planner", self._store_args() + [
            "--replicas", replicas, "--q-cap", f"{cfg.q_cap:g}", "--warm-slots", str(cfg.warm_slots),
            "--interval", f"{cfg.planner_interval:g}", "--window", f"{cfg.window_seconds:g}",
            "--planner-id", f"planner-{os.getpid()}", "--auto", "1" if cfg.planner_auto else "0",
            "--switch-knobs", cfg.switch_knobs])

    def _engine(self, i: int) -> Child:
        cfg = self.config
        args = ["--replica-id", f"engine-{i}", "--profile", cfg.profile, "--time-scale", f"{cfg.time_scale:g}"]
        if cfg.engine_kind == "cacheroute":
            # over HTTP the dispatchers report cache stats from the responses; the engine must not as well
            args += ["--collector", self.collector]
        if cfg.kv_blocks:
            args += ["--kv-blocks", str(cfg.kv_blocks)]
        if cfg.http:
            args += ["--http-port", "0"]
        child = self._new_child(f"engine-{i}", "engine", args)
        child.expect_http = cfg.http
        return child

    def _llamacpp(self, i: int) -> Child:
        cfg = self.config
        path = self.log_dir / f"engine-{i}.log"
        path.write_bytes(b"")
        args = ["--model", str(cfg.llamacpp_model), "--host", cfg.host, "--port", "0",
                "--threads", str(cfg.llamacpp_threads), "--ctx", str(cfg.llamacpp_ctx),
                "--parallel", str(cfg.llamacpp_parallel), "--log-level", cfg.log_level.upper()]
        return Child(f"engine-{i}", "llamacpp", args, path, expect_http=True)

    def _dispatcher(self, i: int) -> Child:
        cfg = self.config
        replicas = ",".join(f"{name}={address}" for name, address in self.engines.items())
        args = ["--replicas", replicas, "--planner", self.planner, "--redis", self.redis_url,
                "--collector", self.collector, "--dispatcher-id", f"dispatcher-{i}"]
        if cfg.seed is not None:
            args += ["--seed", str(cfg.seed + i)]
        args += ["--http-port", "0" if cfg.http else "-1"]
        args += ["--workers", str(cfg.dispatcher_workers)]     # explicit: the dispatcher's own default is per core
        child = self._new_child(f"dispatcher-{i}", "dispatcher", args)
        child.expect_http = cfg.http
        return child

    # ------------------------------------------------------------ watch and stop

    def poll(self) -> list[Child]:
        """Children that exited since the last call without being asked to stop."""
        died = []
        for child in self.children:
            if not child.stopping and not child.exit_reported and child.returncode is not None:
                child.exit_reported = True
                died.append(child)
        return died

    def terminate(self, name: str, *, kill: bool = False, wait: float = 10.0) -> int | None:
        """Stop one child on purpose (fault injection); its exit code."""
        child = self.child(name)
        child.stopping = True
        return self._stop_children([child], kill=kill, wait=wait)[0]

    def stop(self) -> None:
        """Stop every child (reverse tier order), then Redis. Safe to call twice."""
        wait = self.config.grace_seconds + self.config.stop_timeout
        for tier in reversed(self.tiers):
            self._stop_children(tier, wait=wait)
        if self.redis is not None:
            self.redis.close()
            self.redis = None

    @staticmethod
    def _stop_children(children: list[Child], *, kill: bool = False, wait: float = 5.0) -> list[int | None]:
        live = [c for c in children if c.proc is not None and c.proc.poll() is None]
        for c in children:
            c.stopping = True
        for c in live:
            _signal(c.proc, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + wait
        for c in live:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(c.proc, signal.SIGKILL)
                c.proc.wait(5)
        return [c.returncode for c in children]

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:  # exited meanwhile
        pass
