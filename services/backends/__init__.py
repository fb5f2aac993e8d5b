"""How a dispatcher (and the planner's health checks) talk to one engine replica.

A replica is an address plus a kind. Kinds:

  cacheroute   the simulated engine over its gRPC protocol (`host:port`; health from
               grpc.health.v1, load and cache counters from GetStats). HTTP API requests
               routed to it are translated to Generate and rendered as OpenAI responses.
  vllm         vLLM's OpenAI server (`http://host:port`), load from `vllm:` metrics
  sglang       SGLang's server, load from `sglang:` metrics
  llamacpp     llama.cpp's server (llama-server, xllamacpp), load from `llamacpp:` metrics
  openai       any server with `GET /health` and `/v1/*`; load is the dispatcher's own
               in-flight count (no metrics are read)

Configuration: `--replicas e1=vllm+http://10.0.0.5:8000,e2=...` names the kind per replica;
an address without `KIND+` gets the default kind (`--engine-kind`, env
CACHEROUTE_ENGINE_KIND, default `cacheroute`). `http://` / `https://` addresses are HTTP
kinds; `cacheroute` takes only `host:port`.

The contract (services.backends.base.Backend) is small: `check(timeout)` (health only, the
planner's repair uses it), `poll(timeout)` (health plus load and cache counters, the
dispatcher's monitor uses it), and the request itself: `complete(ApiCall) -> Reply` (an
OpenAI API request; HTTP kinds relay the engine's bytes unchanged, services.backends.relay)
and `generate(GenerateRequest, timeout)` (gRPC Generate's chunks, for every kind). Every
engine failure is one EngineError classification, mapped to HTTP and gRPC statuses once by
services.dispatcher.dispatch. Each kind's metric names live in its own module.
"""

from __future__ import annotations

from services.backends.base import HTTP_KINDS, KINDS, Backend, BackendDown, Deadlines, EngineStats, parse_endpoint
from services.backends.cacheroute import CacheRouteBackend
from services.backends.http import HttpBackend

__all__ = ["Backend", "BackendDown", "EngineStats", "HTTP_KINDS", "KINDS", "parse_endpoint", "make_backend"]


def make_backend(replica_id: str, address: str, default_kind: str = "cacheroute", *, tls=None,
                 keys=None, deadlines=None, health_every: float = 0.0) -> Backend:
    """The backend of one configured replica address (see the module docstring); `keys`
    (services.auth.EngineKeys) gives an HTTP replica its API key."""
    kind, target = parse_endpoint(address, default_kind)
    if kind == "cacheroute":
        return CacheRouteBackend(replica_id, target, tls=tls)
    return HttpBackend(replica_id, target, kind, api_key=keys.for_url(target) if keys else None,
                       deadlines=deadlines or Deadlines(), health_every=health_every)
