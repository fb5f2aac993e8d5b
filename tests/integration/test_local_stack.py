"""`cacheroute up` as a real process, the health probe, and the stack reporting a child
that dies; all on loopback with an embedded redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pytest

from services.rpc.healthcheck import main as healthcheck
from services.local.redis_server import free_port
from services.local.stack import SERVICE_NAMES


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    """Bytes read from `fd` until `marker` is among them or `timeout` seconds pass."""
    import selectors

    got, deadline = b"", time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while marker not in got and time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                more = os.read(fd, 65536)
                if not more:
                    break
                got += more
    return got


@pytest.mark.timeout(90)
def test_up_serves_reports_a_dead_child_and_stops_everything_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "up", "--json", "--num-engines", "2",
                             "--num-dispatchers", "1", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        doc = orjson.loads(proc.stdout.readline())
        services = {s["name"]: s for s in doc["services"]}
        assert set(services) == {"collector", "planner", "engine-1", "engine-2", "dispatcher-1"}
        for s in services.values():
            assert healthcheck([s["address"], SERVICE_NAMES[s["kind"]]]) == 0
            assert (tmp_path / f"{s['name']}.log").exists()
        assert healthcheck([services["planner"]["address"], "cacheroute.v1.Nope"]) == 1

        os.kill(services["engine-2"]["pid"], signal.SIGKILL)
        # `up` polls its children twice a second: read its stderr until it says so (a deadline,
        # not a fixed sleep, so a loaded machine only makes the wait longer)
        seen = _read_until(proc.stderr.fileno(), b"engine-2 exited unexpectedly", 20)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        err = seen.decode(errors="replace") + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "engine-2 exited unexpectedly" in err
    assert proc.returncode == 1                     # a child died while it ran
    assert not any(_alive(s["pid"]) for s in services.values())


def test_healthcheck_fails_for_nothing_listening():
    assert healthcheck([f"127.0.0.1:{free_port()}", "--timeout", "0.5"]) == 1
