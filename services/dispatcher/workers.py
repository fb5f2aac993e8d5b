"""Dispatcher worker processes: `--workers N` runs N dispatcher processes on one port.

One Python process routes on one core (the GIL), so a dispatcher that must use more cores
runs N worker processes sharing its gRPC and HTTP ports with SO_REUSEPORT (grpc's
`grpc.so_reuseport`, aiohttp's `reuse_port`): the kernel spreads new connections over the
workers. Each worker is a whole dispatcher (its own plan feed, replica monitor and telemetry
reporter); they agree on routing the way separate dispatchers do, by plan version.

This module is the supervisor, the parent of the workers. It serves nothing itself:

- ports: a port given as 0 is chosen here first (a bound SO_REUSEPORT socket holds it while
  the workers bind it too), so every worker listens on the same one;
- start: each worker gets `--worker-index i`, its own dispatcher id (`ID/wI`), a private
  metrics port on 127.0.0.1, and a pipe on which it reports one JSON line once SERVING;
  when all have, the supervisor logs the "serving" line (address, metrics port, workers,
  pids) that `cacheroute up` and the tests read;
- metrics: the supervisor's metrics port serves every worker's families merged, each sample
  labelled `worker="I"` (scraped from the workers at scrape time), plus
  `cacheroute_dispatcher_workers` and `cacheroute_dispatcher_worker_restarts_total`. One
  scrape target, correct sums across workers, no shared state between processes (chosen over
  prometheus_client's multiprocess mode, which cannot carry the dispatcher's scrape-time
  collectors: plan version, replica health and load are read from the router);
- signals: SIGTERM or SIGINT is forwarded to every worker as SIGTERM (each goes NOT_SERVING
  and drains for its grace period); workers still running after grace + 5 s are killed;
  every child is reaped. Workers die with the supervisor (services.local.launch:
  `setpriv --pdeathsig TERM`, the one answer to "die with the parent");
- crashes: a worker that exits while serving is restarted after a backoff (0.5 s doubling
  to 5 s); one that fails before its first SERVING fails the start (exit 1).

`--workers 0` (the default) means one worker per core this process may run on
(`os.sched_getaffinity`: a container's cpuset or a taskset, not the whole host); on one core
that is 1, which runs the dispatcher in this process with no supervisor at all, as an explicit
`--workers 1` does anywhere.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import orjson
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.rpc.logs import kv
from services.local.launch import launcher

log = logging.getLogger("cacheroute.dispatcher.workers")

READY_FD_ENV = "CACHEROUTE_WORKER_READY_FD"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's cpuset, taskset), not
    every core of the host that os.cpu_count() reports."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:              # no sched_getaffinity on this platform
        return os.cpu_count() or 1


def resolve_workers(n: int) -> int:
    """`--workers` as a process count: 0 (the default) is one per available core."""
    if n < 0:
        raise ValueError(f"--workers must be >= 0 (0 = one per core), got {n}")
    return n or available_cores()


@dataclass(frozen=True)
class WorkersConfig:
    workers: int
    host: str
    port: int                 # 0: chosen by the supervisor
    http_port: int            # -1: no HTTP front door; 0: chosen by the supervisor
    metrics_host: str
    metrics_port: int         # -1: no metrics endpoint
    grace_seconds: float
    dispatcher_id: str
    start_timeout: float = 60.0
    restart_backoff: tuple[float, float] = (0.5, 5.0)


def report_ready(**fields: object) -> None:
    """Called by a worker once SERVING: one JSON line to the supervisor's pipe (no-op otherwise)."""
    fd = os.environ.pop(READY_FD_ENV, "")
    if not fd:
        return
    try:
        os.write(int(fd), orjson.dumps({"pid": os.getpid(), **fields}) + b"\n")
    finally:
        os.close(int(fd))


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket on host:port; port 0 picks a free one.
    Workers bind the same port with SO_REUSEPORT while this holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    return sock


@dataclass
class Worker:
    index: int
    argv: list[str]
    proc: subprocess.Popen | None = None
    ready_fd: int = -1
    buffer: bytes = b""
    info: dict = field(default_factory=dict)
    restarts: int = 0
    restart_at: float = 0.0
    backoff: float = 0.0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, **{READY_FD_ENV: str(write_fd)})
        try:
            # services.local.launch (setpriv --pdeathsig TERM): a preexec_fn runs Python in
            # the forked child, which can deadlock or abort once grpc has threads (issue 25)
            self.proc = subprocess.Popen([*launcher(), sys.executable, "-m", "services.dispatcher", *self.argv],
                                         env=env, pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
        finally:
            os.close(write_fd)
        self.ready_fd, self.buffer, self.info = read_fd, b"", {}

    def read_ready(self) -> bool:
        """Consume what the worker wrote; True once its JSON line is complete."""
        try:
            chunk = os.read(self.ready_fd, 4096)
        except OSError:
            chunk = b""
        self.buffer += chunk
        if b"\n" in self.buffer:
            self.info = orjson.loads(self.buffer.split(b"\n", 1)[0])
            self.close_pipe()
            return True
        if not chunk:
            self.close_pipe()
        return False

    def close_pipe(self) -> None:
        if self.ready_fd >= 0:
            os.close(self.ready_fd)
            self.ready_fd = -1


class WorkerMetrics:
    """Every live worker's /metrics merged, each sample labelled with its worker index."""

    def __init__(self, supervisor: "Supervisor") -> None:
        self.supervisor = supervisor

    def collect(self):
        sup = self.supervisor
        merged: dict[str, Metric] = {}
        for w in list(sup.workers):
            port = w.info.get("metrics_port")
            if not (w.alive and port):
                continue
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0).read().decode()
            except OSError:
                continue
            for fam in text_string_to_metric_families(text):
                out = merged.get(fam.name)
                if out is None:
                    out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    out.samples.append(Sample(s.name, {"worker": str(w.index), **s.labels}, s.value, s.timestamp,
                                              s.exemplar))
        yield from merged.values()
        yield GaugeMetricFamily("cacheroute_dispatcher_workers", "dispatcher worker processes running",
                                sum(w.alive for w in sup.workers))
        yield CounterMetricFamily("cacheroute_dispatcher_worker_restarts", "workers restarted after exiting",
                                  sum(w.restarts for w in sup.workers))


class Supervisor:
    def __init__(self, config: WorkersConfig, argv: list[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.workers: list[Worker] = []
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._metrics_http = None
        self.port = config.port
        self.http_port = config.http_port

    def _child_argv(self, index: int) -> list[str]:
        cfg = self.config
        http = ["--http-port", str(self.http_port)] if cfg.http_port >= 0 else []
        return [*self.argv, "--workers", "1", "--worker-index", str(index), "--host", cfg.host,
                "--port", str(self.port), *http,
                "--metrics-host", "127.0.0.1", "--metrics-port", "0" if cfg.metrics_port >= 0 else "-1",
                "--dispatcher-id", f"{cfg.dispatcher_id}/w{index}"]

    def _on_signal(self, signum, _frame) -> None:
        self._stop.set()

    def run(self) -> int:
        cfg = self.config
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            grpc_sock = reserve_port(cfg.host, cfg.port)
            self.held.append(grpc_sock)
            self.port = grpc_sock.getsockname()[1]
            if cfg.http_port >= 0:
                http_sock = reserve_port(cfg.host, cfg.http_port)
                self.held.append(http_sock)
                self.http_port = http_sock.getsockname()[1]
        except OSError as exc:
            log.error("cannot start workers", extra=kv(error=str(exc)))
            print(f"dispatcher: error: {exc}", file=sys.stderr)
            return 2
        self.workers = [Worker(i, self._child_argv(i)) for i in range(cfg.workers)]
        try:
            if not self._start_all():
                return 1
            if cfg.metrics_port >= 0:
                registry = CollectorRegistry()
                registry.register(WorkerMetrics(self))
                self._metrics_http, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host, registry=registry)
            for sock in self.held:       # every worker listens now; the port stays in their group
                sock.close()
            self.held.clear()
            log.info("serving", extra=kv(address=f"{cfg.host}:{self.port}",
                                         metrics_port=self._metrics_http.server_port if self._metrics_http else None,
                                         http_port=self.http_port if cfg.http_port >= 0 else None,
                                         workers=cfg.workers, pids=[w.proc.pid for w in self.workers]))
            self._watch()
            return 0
        finally:
            self._shutdown()

    def _start_all(self) -> bool:
        for w in self.workers:
            w.spawn()
        deadline = time.monotonic() + self.config.start_timeout
        pending = {w.ready_fd: w for w in self.workers}
        while pending and not self._stop.is_set():
            for w in pending.values():
                if not w.alive:
                    log.error("worker exited during start", extra=kv(worker=w.index, code=w.proc.returncode))
                    return False
            if time.monotonic() > deadline:
                log.error("workers not serving in time", extra=kv(waiting=[w.index for w in pending.values()]))
                return False
            readable, _, _ = select.select(list(pending), [], [], 0.1)
            for fd in readable:
                w = pending[fd]
                if w.read_ready():
                    del pending[fd]
                elif w.ready_fd < 0:          # the pipe closed without a line: the worker is going
                    del pending[fd]
                    w.proc.wait(5)
                    log.error("worker exited during start", extra=kv(worker=w.index, code=w.proc.returncode))
                    return False
        return not pending

    def _watch(self) -> None:
        low, high = self.config.restart_backoff
        pending: dict[int, Worker] = {}
        while not self._stop.is_set():
            now = time.monotonic()
            for w in self.workers:
                if w.proc is not None and w.proc.poll() is not None and w.restart_at == 0.0:
                    w.backoff = min(high, max(low, w.backoff * 2))
                    w.restart_at = now + w.backoff
                    w.close_pipe()
                    log.error("worker exited; restarting", extra=kv(worker=w.index, code=w.proc.returncode,
                                                                     pid=w.proc.pid, after_s=w.backoff))
                if w.restart_at and now >= w.restart_at:
                    w.restart_at = 0.0
                    w.restarts += 1
                    w.spawn()
                    pending[w.ready_fd] = w
            if pending:
                readable, _, _ = select.select(list(pending), [], [], 0.1)
                for fd in readable:
                    w = pending.pop(fd)
                    if w.read_ready():
                        log.info("worker serving again", extra=kv(worker=w.index, pid=w.proc.pid))
                        w.backoff = low / 2
                    elif w.ready_fd < 0 and w.proc is not None and w.proc.poll() is None:
                        pass   # pipe closed without a line: the exit is handled above
                for fd, w in list(pending.items()):
                    if w.ready_fd < 0:
                        pending.pop(fd)
            else:
                self._stop.wait(0.1)

    def _shutdown(self) -> None:
        for sock in self.held:
            sock.close()
        self.held.clear()
        live = [w for w in self.workers if w.alive]
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.grace_seconds + 5.0
        for w in live:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker did not stop in time; killing it", extra=kv(worker=w.index, pid=w.proc.pid))
                w.proc.kill()
                w.proc.wait(5)
        for w in self.workers:
            w.close_pipe()
            if w.proc is not None:
                w.proc.poll()          # reap
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        log.info("stopped", extra=kv(port=self.port, workers=len(self.workers)))


def supervise(config: WorkersConfig, argv: list[str]) -> int:
    """Run `config.workers` dispatcher workers for `argv` (the dispatcher's own flags) until
    SIGTERM/SIGINT; the exit status."""
    return Supervisor(config, argv).run()
