"""The dispatcher as an Endpoint Picker (EPP) for the Gateway API Inference Extension: Envoy's
ext_proc gRPC service (envoy.service.ext_proc.v3.ExternalProcessor, from the `xds-protos`
wheel), beside the dispatcher's own gRPC and HTTP servers (`--ext-proc-port`, default off).

An Envoy-based gateway (Envoy Gateway, Istio, kgateway, GKE) routes an HTTPRoute to an
InferencePool whose `endpointPickerRef` names this service (deploy/k8s/overlays/gateway-api/);
for each request its ext_proc filter opens one `Process` stream and sends, in order:

  request_headers   -> if the request carries `x-cacheroute-key` or has no body, pick now;
                       else answer CONTINUE and wait for the body
  request_body      -> chunks (STREAMED) or one message (BUFFERED) up to end_of_stream; then
                       the OpenAI body is parsed as the HTTP front door parses it (services.http.oai),
                       the routing key derived as there (services/dispatcher/keys.py, rules 1-3)
                       and the plan picks (Router.route: planned / cold / fallback)
  response_headers, response_body, trailers -> CONTINUE (nothing changed)

The pick is answered as the inference extension's protocol asks: a header mutation setting
`x-gateway-destination-endpoint: host:port` (plus `x-cacheroute-replica`, `-reason`,
`-plan-version` for logs), and the same endpoint in dynamic metadata under
`envoy.lb` / `x-gateway-destination-endpoint` (what Envoy's original-destination cluster reads),
with `clear_route_cache` so the route is re-evaluated on the new header. A replica's endpoint
is the host:port of its address (`KIND+http://host:port` -> host:port). Bad input (body not
JSON, no messages/prompt, bad key) -> ImmediateResponse 400 with an OpenAI-shaped error body;
no healthy replica -> 503. The arrival goes to telemetry at the pick (the planner's input, as
for Route); no TLS on this port (the gateway reaches it inside the cluster).
"""

from __future__ import annotations

import logging
import time
from typing import AsyncIterator
from urllib.parse import urlsplit

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from services.http import oai
from services.core import routing
from services.core.policy import NoHealthyReplica, Reason
from services.dispatcher.keys import KEY_HEADER, request_key
from services.dispatcher.router import Router
from services.rpc import kv

log = logging.getLogger("cacheroute.dispatcher.extproc")

DESTINATION_HEADER = "x-gateway-destination-endpoint"
METADATA_NAMESPACE = "envoy.lb"
REASONS = {Reason.PLANNED: "planned", Reason.COLD: "cold", Reason.FALLBACK: "fallback"}
MAX_BODY_BYTES = 8 * 1024 * 1024


def endpoint_of(address: str) -> str:
    """host:port of a replica address (`host:port`, `KIND+http://host:port`, `http://host:port`)."""
    rest = address.split("+", 1)[1] if "+" in address.split("://")[0] else address
    if "://" in rest:
        parts = urlsplit(rest)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"
    return rest


def _headers(msg: ep.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in msg.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _endpoint_kind(path: str) -> str:
    return oai.COMPLETIONS if path.split("?", 1)[0].rstrip("/").endswith("/completions") and \
        not path.split("?", 1)[0].rstrip("/").endswith("/chat/completions") else oai.CHAT


def _immediate(status: int, message: str, type_: str, code: str) -> ep.ProcessingResponse:
    body = oai.ApiError(status, message, type_, code).body()
    return ep.ProcessingResponse(immediate_response=ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), body=body,
        headers=ep.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"))]),
        details=message))


class EndpointPicker(ep_grpc.ExternalProcessorServicer):
    def __init__(self, router: Router, *, key_tokens: int = routing.DEFAULT_KEY_TOKENS,
                 max_output_tokens: int = 32_768) -> None:
        self.router = router
        self.key_tokens = key_tokens
        self.max_output_tokens = max_output_tokens
        self.endpoints = [endpoint_of(r.address or r.id) for r in router.replicas]

    def _pick(self, headers: dict[str, str], body: bytes | None) -> tuple[int, ep.CommonResponse] | ep.ProcessingResponse:
        header_key = headers.get(KEY_HEADER)
        text, salt = "", None
        if body:
            try:
                req = oai.parse_request(oai.parse_json(body), _endpoint_kind(headers.get(":path", "")),
                                        max_output_tokens=self.max_output_tokens)
            except oai.ApiError as exc:
                return _immediate(exc.status, str(exc), exc.type, exc.code or "invalid_request")
            text, salt = req.text, req.salt
        elif not header_key:
            return _immediate(400, f"no request body and no {KEY_HEADER} header: nothing to route by",
                              "invalid_request_error", "missing_routing_key")
        try:
            key = request_key(text, header_key, salt=salt, key_tokens=self.key_tokens)
        except ValueError as exc:
            return _immediate(400, f"routing key: {exc}", "invalid_request_error", "invalid_routing_key")
        prompt_tokens = routing.count_tokens(text) if text else 0
        shared = 0 if header_key else min(prompt_tokens, self.key_tokens)
        try:
            pick = self.router.route(key, time.time(), prompt_tokens, shared)
        except NoHealthyReplica:
            return _immediate(503, "no healthy replica", "service_unavailable", "no_healthy_replica")
        i = pick.replica
        endpoint = self.endpoints[i]
        set_headers = [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                                                  append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
                       for k, v in ((DESTINATION_HEADER, endpoint), ("x-cacheroute-replica", self.router.ids[i]),
                                    ("x-cacheroute-reason", REASONS[pick.reason]),
                                    ("x-cacheroute-plan-version", str(self.router.plan_version)))]
        return i, ep.CommonResponse(header_mutation=ep.HeaderMutation(set_headers=set_headers),
                                    clear_route_cache=True)

    @staticmethod
    def _metadata(endpoint: str) -> struct_pb2.Struct:
        md = struct_pb2.Struct()
        md.update({METADATA_NAMESPACE: {DESTINATION_HEADER: endpoint}})
        return md

    async def Process(self, request_iterator, context) -> AsyncIterator[ep.ProcessingResponse]:
        headers: dict[str, str] = {}
        body = bytearray()
        picked = -1
        try:
            async for msg in request_iterator:
                phase = msg.WhichOneof("request")
                if phase == "request_headers":
                    headers = _headers(msg.request_headers)
                    if picked < 0 and (KEY_HEADER in headers or msg.request_headers.end_of_stream):
                        out = self._pick(headers, None)
                        if isinstance(out, ep.ProcessingResponse):
                            yield out
                            return
                        picked, common = out
                        self.router.stream_opened(picked)
                        yield ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common),
                                                    dynamic_metadata=self._metadata(self.endpoints[picked]))
                    else:
                        yield ep.ProcessingResponse(request_headers=ep.HeadersResponse())
                elif phase == "request_body":
                    if picked >= 0:
                        yield ep.ProcessingResponse(request_body=ep.BodyResponse())
                        continue
                    body += msg.request_body.body
                    if len(body) > MAX_BODY_BYTES:
                        yield _immediate(413, f"request body over {MAX_BODY_BYTES} bytes", "invalid_request_error",
                                         "request_too_large")
                        return
                    if not msg.request_body.end_of_stream:
                        yield ep.ProcessingResponse(request_body=ep.BodyResponse())   # STREAMED: keep reading
                        continue
                    out = self._pick(headers, bytes(body))
                    if isinstance(out, ep.ProcessingResponse):
                        yield out
                        return
                    picked, common = out
                    self.router.stream_opened(picked)
                    yield ep.ProcessingResponse(request_body=ep.BodyResponse(response=common),
                                                dynamic_metadata=self._metadata(self.endpoints[picked]))
                elif phase == "request_trailers":
                    yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
                elif phase == "response_headers":
                    yield ep.ProcessingResponse(response_headers=ep.HeadersResponse())
                elif phase == "response_body":
                    yield ep.ProcessingResponse(response_body=ep.BodyResponse())
                elif phase == "response_trailers":
                    yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())
                else:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected ext_proc message: {phase}")
        finally:
            if picked >= 0:
                self.router.stream_closed(picked)


async def start_ext_proc(router: Router, host: str, port: int, *, key_tokens: int = routing.DEFAULT_KEY_TOKENS,
                         max_output_tokens: int = 32_768) -> tuple[grpc.aio.Server, int]:
    """Serve the endpoint picker on host:port (0: ephemeral); returns the server and its port."""
    server = grpc.aio.server()
    ep_grpc.add_ExternalProcessorServicer_to_server(
        EndpointPicker(router, key_tokens=key_tokens, max_output_tokens=max_output_tokens), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"ext_proc: cannot bind {host}:{port}")
    await server.start()
    log.info("ext_proc serving", extra=kv(address=f"{host}:{bound}"))
    return server, bound
