"""`python -m services.rpc.healthcheck HOST:PORT [SERVICE]`: a grpc health probe.

Exit status 0 when the server reports SERVING for SERVICE (default "": the whole server),
1 otherwise (NOT_SERVING, unknown service, unreachable, deadline exceeded). Meant for
docker-compose `healthcheck:` entries and for `services.local.stack`, which waits on
`wait_serving`. Plaintext channels only (the compose file runs without TLS).
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def check(address: str, service: str = "", timeout: float = 2.0) -> str:
    """The server's health status name for `service` ("SERVING", "NOT_SERVING", ...).
    Raises grpc.RpcError when the server cannot be asked (unreachable, unknown service)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def is_serving(address: str, service: str = "", timeout: float = 2.0) -> bool:
    try:
        return check(address, service, timeout) == "SERVING"
    except grpc.RpcError:
        return False


def wait_serving(address: str, service: str = "", timeout: float = 30.0, interval: float = 0.1) -> bool:
    """Poll until `address` reports SERVING; False if it has not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if is_serving(address, service, timeout=min(1.0, remaining)):
            return True
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.rpc.healthcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", help="HOST:PORT of a CacheRoute service")
    parser.add_argument("service", nargs="?", default="", help='full service name, e.g. cacheroute.v1.Planner ("": server)')
    parser.add_argument("--timeout", type=float, default=2.0, help="deadline of the check, seconds (default 2)")
    args = parser.parse_args(argv)
    try:
        status = check(args.address, args.service, args.timeout)
    except grpc.RpcError as err:
        print(f"{args.address}: {err.code().name}: {err.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    if status != "SERVING":
        print(f"{args.address}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
