"""The simulated engine's OpenAI HTTP API (`--http-port`), beside its gRPC service.

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streaming SSE or not),
`GET /v1/models`, `GET /health`, `GET /metrics`, and vLLM's `POST /tokenize` (the token ids of
`messages` or `prompt`, which vllm-router's cache_aware policy asks every worker for). Requests run on the same EngineRunner as
gRPC Generate, so both share one KV cache and one queue.

- Prompt: the request's canonical text (services.http.oai: chat messages as `role: content`
  lines, or the completion prompt), tokenized like the gRPC `prompt` source
  (services.core.routing), so prefix caching works on shared system prompts.
- Output: the simulated token stream (` t<id>` per token), `max_tokens` (or
  `max_completion_tokens`) tokens, default 16; finish_reason `length`.
- Usage: every non-streaming response, and the final chunk when
  `stream_options.include_usage` is set, carries `prompt_tokens`, `completion_tokens` and
  `prompt_tokens_details.cached_tokens` (always, also when 0).
- `/metrics` uses vLLM V1's names (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`, `vllm:cache_config_info` (labels block_size, num_gpu_blocks: the
  pool size), `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
  `vllm:prompt_tokens_total`, `vllm:request_success_total`, `vllm:num_preemptions_total`,
  `vllm:time_to_first_token_seconds` in model seconds with vLLM's buckets),
  labelled `model_name`, so a dispatcher with `--engine-kind vllm` and third-party routers
  read it like a vLLM server.
- Errors are OpenAI-shaped: 400 bad input (also a prompt or max_tokens over the engine's
  limits), 404 unknown path, 413 body over the limit, 429 too many requests in flight,
  503 while stopping.
"""

from __future__ import annotations

import itertools
import time
import uuid

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from services.http import oai
from services.core import routing
from services.engine.runner import TTFT_BUCKETS, EngineRunner
from services.engine.servicer import Limits
from services.errors import ResourceExhausted

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 8 * 1024 * 1024


class VllmMetrics:
    """The runner's model counters under vLLM's metric names, read at scrape time."""

    def __init__(self, runner: EngineRunner, model_name: str) -> None:
        self.runner = runner
        self.labels = [model_name]

    def collect(self):
        model, labels = self.runner.model, self.labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        yield gauge("vllm:num_requests_running", "requests in the running batch", model.running)
        yield gauge("vllm:num_requests_waiting", "requests waiting", model.waiting + self.runner.pending)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 0..1", model.kv_usage)
        info = GaugeMetricFamily("vllm:cache_config_info", "information of the KV cache config",
                                 labels=["model_name", "block_size", "num_gpu_blocks"])
        info.add_metric([*labels, "16", str(model.kv_blocks)], 1.0)   # vLLM's info gauge, its label names
        yield info
        yield counter("vllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache", model.prompt_tokens)
        yield counter("vllm:prefix_cache_hits", "prompt tokens found in the prefix cache", model.cached_tokens)
        yield counter("vllm:prompt_tokens", "prompt tokens", model.prompt_tokens)
        yield counter("vllm:request_success", "requests that finished their prefill", model.requests)
        yield counter("vllm:num_preemptions", "preemptions", model.preemptions)
        ttft = HistogramMetricFamily("vllm:time_to_first_token_seconds", "time to first token (model seconds)",
                                     labels=["model_name"])
        counts, total = list(self.runner.ttft_counts), self.runner.ttft_sum
        cumulative = list(itertools.accumulate(counts))
        ttft.add_metric(labels, [(f"{b:g}", c) for b, c in zip(TTFT_BUCKETS, cumulative)] + [("+Inf", cumulative[-1])],
                        total)
        yield ttft


def _error(exc: oai.ApiError) -> web.Response:
    return web.Response(status=exc.status, body=exc.body(), content_type="application/json")


class EngineHttpApi:
    def __init__(self, runner: EngineRunner, replica_id: str, model_name: str, limits: Limits) -> None:
        self.runner = runner
        self.replica_id = replica_id
        self.model_name = model_name
        self.limits = limits
        self.serving = True
        self._ids = itertools.count(1)
        self._boot = uuid.uuid4().hex[:8]
        self.registry = CollectorRegistry()
        self.registry.register(VllmMetrics(runner, model_name))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._errors])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except oai.ApiError as exc:
            return _error(exc)
        except web.HTTPRequestEntityTooLarge:
            return _error(oai.ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large"))
        except web.HTTPNotFound:
            return _error(oai.ApiError(404, f"unknown path {request.path}", "not_found_error", "unknown_url"))
        except web.HTTPMethodNotAllowed:
            return _error(oai.ApiError(405, f"{request.method} not allowed on {request.path}", code="method_not_allowed"))

    async def health(self, request: web.Request) -> web.Response:
        if not self.serving:
            return _error(oai.ApiError(503, "engine is stopping", "service_unavailable", "stopping"))
        return web.json_response({"status": "ok", "replica_id": self.replica_id})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's `POST /tokenize` (`messages` or `prompt`): the token ids this engine caches by.
        vllm-router's cache_aware matches prefixes on these; without them it cannot (bench/peers.py)."""
        doc = oai.parse_json(await request.read())
        try:
            if isinstance(doc.get("messages"), list):
                text = oai.chat_text(doc["messages"])
            elif "prompt" in doc:
                text = oai.prompt_text(doc["prompt"])
            else:
                raise ValueError("tokenize needs `messages` or `prompt`")
        except (ValueError, AttributeError) as exc:
            raise oai.bad_request(str(exc).splitlines()[0] if str(exc) else "bad tokenize request") from None
        ids = routing.tokenize(text)
        return web.json_response({"count": len(ids), "max_model_len": self.limits.max_prompt_tokens, "tokens": ids})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "cacheroute-sim"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, oai.CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, oai.COMPLETIONS)

    async def _complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        if not self.serving:
            raise oai.ApiError(503, "engine is stopping", "service_unavailable", "stopping")
        doc = oai.parse_json(await request.read())
        req = oai.parse_request(doc, endpoint, max_output_tokens=self.limits.max_output_tokens)
        if len(req.text) > self.limits.max_prompt_tokens * 64:
            raise oai.bad_request(f"prompt longer than {self.limits.max_prompt_tokens} tokens", "prompt")
        ids = routing.tokenize(req.text)
        if len(ids) > self.limits.max_prompt_tokens:
            raise oai.bad_request(f"prompt of {len(ids)} tokens exceeds the limit of {self.limits.max_prompt_tokens}")
        blocks = routing.prompt_hashes(ids)
        max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS
        try:
            ticket = self.runner.submit(len(ids), blocks, max_tokens)
        except ResourceExhausted as exc:
            raise oai.ApiError(429, str(exc), "rate_limit_error", "too_many_requests") from None
        except ValueError as exc:
            raise oai.bad_request(str(exc)) from None
        seed = blocks[-1] if blocks else len(ids)
        render = oai.Renderer(endpoint, req.model or self.model_name, f"{self._boot}{next(self._ids)}", int(time.time()))
        headers = {"x-engine-replica": self.replica_id}
        try:
            if req.stream:
                return await self._stream(request, ticket, render, seed, len(ids), req.include_usage, headers)
            texts, cached, finished = [], 0, False
            while not finished:
                event = await ticket.events.get()
                texts.append(f" t{routing.output_token(seed, event.index)}")
                if event.cached is not None:
                    cached = event.cached
                finished = event.finished
            body = render.full("".join(texts), "length", oai.usage(len(ids), len(texts), cached))
            return web.Response(body=body, content_type="application/json", headers=headers)
        finally:
            self.runner.release(ticket)   # aborts the request in the model if the client left early

    async def _stream(self, request, ticket, render: oai.Renderer, seed: int, prompt_tokens: int,
                      include_usage: bool, headers: dict) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache", **headers})
        await resp.prepare(request)
        cached, emitted = 0, 0
        while True:
            event = await ticket.events.get()
            if event.cached is not None:
                cached = event.cached
            emitted += 1
            finish = "length" if event.finished else None
            await resp.write(render.chunk(f" t{routing.output_token(seed, event.index)}", finish))
            if event.finished:
                break
        if include_usage:
            await resp.write(render.usage_chunk(oai.usage(prompt_tokens, emitted, cached)))
        await resp.write(oai.DONE)
        await resp.write_eof()
        return resp


async def start_engine_http(runner: EngineRunner, replica_id: str, model_name: str, limits: Limits,
                            host: str, port: int):
    """Serve the engine's HTTP API on host:port (0: ephemeral); returns (api, RunningHttp)."""
    from services.http.server import start_http

    api = EngineHttpApi(runner, replica_id, model_name, limits)
    return api, await start_http(api.app(), host, port)
