"""CacheRoute clients: the typed gRPC client library and the `cacheroute` CLI."""

from clients.client import (
    AsyncCacheRouteClient, CacheRouteClient, NoAddress, RetryPolicy, generate_request, route_request,
)

__all__ = ["AsyncCacheRouteClient", "CacheRouteClient", "NoAddress", "RetryPolicy", "generate_request", "route_request"]
