"""Steady Route traffic from a background thread, recording every call's outcome."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc

from clients import CacheRouteClient, RetryPolicy


@dataclass(frozen=True, slots=True)
class Call:
    at: float                 # time.monotonic() when the call started
    seconds: float
    code: str                 # "OK" or the status code name
    replica: str = ""
    version: int = 0
    reason: int = 0


@dataclass
class RouteTraffic:
    """Route calls for `keys` in a loop through one client until `stop()`."""

    dispatchers: list[str]
    keys: tuple[str, ...] = ("hot", "warm", "cold-1", "cold-2")
    pause: float = 0.004
    retry: RetryPolicy = RetryPolicy(rounds=1)
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "RouteTraffic":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with CacheRouteClient(self.dispatchers, timeout=2.0, retry=self.retry, seed=1) as client:
            i = 0
            while not self._stop.is_set():
                key = self.keys[i % len(self.keys)]
                i += 1
                start = time.monotonic()
                try:
                    d = client.route(key)
                    self.calls.append(Call(start, time.monotonic() - start, "OK", d.replica_id, d.plan_version,
                                           d.reason))
                except grpc.RpcError as err:
                    self.calls.append(Call(start, time.monotonic() - start, err.code().name))
                time.sleep(self.pause)

    def stop(self) -> list[Call]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        return self.calls

    def failed(self) -> list[Call]:
        return [c for c in self.calls if c.code != "OK"]

    def since(self, t: float) -> list[Call]:
        return [c for c in self.calls if c.at >= t]
