"""Per-server Prometheus metrics of the RPCs."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram


class RpcMetrics:
    """A per-server Prometheus registry (no global state: several servers may share a process)."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.service = service
        self._calls = Counter("cacheroute_rpc_total", "RPCs by method and status", ["method", "code"], registry=self.registry)
        self._latency = Histogram("cacheroute_rpc_seconds", "unary RPC latency", ["method"], registry=self.registry,
                                  buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))

    def count(self, method: str, code: grpc.StatusCode) -> None:
        self._calls.labels(method, code.name).inc()

    def observe(self, method: str, seconds: float) -> None:
        self._calls.labels(method, "OK").inc()
        self._latency.labels(method).observe(seconds)
