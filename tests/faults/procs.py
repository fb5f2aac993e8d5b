"""Service processes for fault injection: spawn `python -m services.<kind>` on loopback,
wait until it is SERVING, kill -9 it on purpose, and always clean up.

Each child binds port 0 and logs its bound address in the "serving" line written by
`services.rpc.start_server` (read with `services.local.stack.parse_serving_line`), so no port is
picked in advance. A restarted child can be pinned to its old port with `--port`.
Children get PR_SET_PDEATHSIG(SIGKILL) so a killed test run cannot leak them,
and `Procs.cleanup()` SIGKILLs whatever is left at teardown, pass or fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from services.rpc.healthcheck import is_serving
from services.local.launch import launcher
from services.local.stack import SERVICE_NAMES, parse_serving_line

COMMON = ["--host", "127.0.0.1", "--metrics-host", "127.0.0.1", "--metrics-port", "0", "--grace-seconds", "0.5",
          "--log-level", "INFO"]


@dataclass
class ServiceProc:
    kind: str
    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    address: str = ""
    metrics_port: int | None = None
    _offset: int = 0                 # log bytes written by earlier incarnations

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> "ServiceProc":
        self.address = ""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        # a dispatcher: its OpenAI HTTP API ephemeral too, and one process unless the test asks for
        # workers (the dispatcher's own default is one worker per core)
        http = ["--http-port", "0", "--workers", "1"] if self.kind == "dispatcher" else []
        # `setpriv --pdeathsig` (services.local.launch), not a preexec_fn: Python code run in the forked
        # child meets grpc's fork handlers, and a child aborted with "epoll_wait error: Bad file
        # descriptor" once this process had grpc channels open
        argv = [*launcher(), sys.executable, "-m", f"services.{self.kind}", *COMMON, "--port", str(self.port),
                *http, *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        return self

    def poll_ready(self, check: Callable[[str], bool] | None = None) -> bool:
        """True once the serving line is logged and the health check passes."""
        if not self.alive:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode if self.proc else None}:\n"
                               f"{self.log_tail()}")
        if not self.address:
            for line in self.log_path.read_bytes()[self._offset:].splitlines():
                doc = parse_serving_line(line)
                if doc is not None:
                    self.address, self.metrics_port = doc["address"], doc.get("metrics_port")
            if not self.address:
                return False
            self.port = int(self.address.rsplit(":", 1)[1])
        check = check or (lambda address: is_serving(address, SERVICE_NAMES[self.kind], timeout=1.0))
        return check(self.address)

    def kill(self) -> None:
        """kill -9, then reap."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(5)

    def terminate(self, wait: float = 5.0) -> int | None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode if self.proc else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().strip().splitlines()[-lines:])

    def rss_kib(self) -> int:
        """Resident set size from /proc/<pid>/status (VmRSS), KiB."""
        with open(f"/proc/{self.pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for {self.name}")


class Procs:
    """Every service process a test starts; `cleanup()` kills them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[ServiceProc] = []

    def spawn(self, kind: str, name: str, args: list[str], *, env: dict[str, str] | None = None,
              port: int = 0) -> ServiceProc:
        child = ServiceProc(kind, name, list(args), self.log_dir / f"{name}.log", dict(env or {}), port)
        self.children.append(child)
        return child.spawn()

    def wait(self, *children: ServiceProc, timeout: float = 30.0,
             check: Callable[[str], bool] | None = None) -> None:
        """Wait until all `children` are SERVING (they start concurrently)."""
        deadline = time.monotonic() + timeout
        waiting = list(children)
        while waiting:
            waiting = [c for c in waiting if not c.poll_ready(check)]
            if waiting and time.monotonic() > deadline:
                tails = "\n".join(f"--- {c.name}\n{c.log_tail()}" for c in waiting)
                raise TimeoutError(f"not SERVING after {timeout:g}s:\n{tails}")
            if waiting:
                time.sleep(0.05)

    def start(self, kind: str, name: str, args: list[str], **kw) -> ServiceProc:
        child = self.spawn(kind, name, args, **{k: v for k, v in kw.items() if k in ("env", "port")})
        self.wait(child, **{k: v for k, v in kw.items() if k in ("timeout", "check")})
        return child

    def restart(self, child: ServiceProc, *, same_port: bool = True, timeout: float = 30.0) -> ServiceProc:
        """Start a fresh process for `child` (after it was killed), on its old port by default."""
        child.kill()
        if not same_port:
            child.port = 0
        child.spawn()
        self.wait(child, timeout=timeout)
        return child

    def cleanup(self) -> None:
        for child in self.children:
            if child.alive:
                child.proc.send_signal(signal.SIGKILL)
        for child in self.children:
            if child.proc is not None:
                try:
                    child.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
