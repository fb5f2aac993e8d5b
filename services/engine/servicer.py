"""cacheroute.v1.Engine: a simulated vLLM V1 replica streaming tokens in real time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.core import routing
from services.engine.runner import EngineRunner, TokenEvent


@dataclass(frozen=True, slots=True)
class Limits:
    max_prompt_tokens: int = 131_072
    max_output_tokens: int = 8_192


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: int
    blocks: tuple[int, ...]     # full 16-token blocks that may hit the prefix cache
    seed: int                   # for the stand-in output tokens


def parse_prompt(request: engine_pb2.GenerateRequest, limits: Limits) -> Prompt:
    """The prompt as the engine model sees it; ValueError (INVALID_ARGUMENT) on a bad request."""
    if not 1 <= request.max_tokens <= limits.max_output_tokens:
        raise ValueError(f"max_tokens must be in 1..{limits.max_output_tokens}, got {request.max_tokens}")
    source = request.WhichOneof("prompt_source")
    if source == "prompt":
        if len(request.prompt) > limits.max_prompt_tokens * 64:   # cheap bound before tokenizing
            raise ValueError(f"prompt longer than {limits.max_prompt_tokens} tokens")
        ids = routing.tokenize(request.prompt)
        tokens, blocks = len(ids), routing.prompt_hashes(ids)
    elif source == "blocks":
        tokens = request.blocks.prompt_tokens
        blocks = routing.cacheable_blocks(request.blocks.block_hashes, tokens) if tokens else ()
    else:
        raise ValueError("no prompt: set prompt or blocks")
    if tokens < 1:
        raise ValueError("empty prompt")
    if tokens > limits.max_prompt_tokens:
        raise ValueError(f"prompt of {tokens} tokens exceeds the limit of {limits.max_prompt_tokens}")
    return Prompt(tokens, blocks, blocks[-1] if blocks else tokens)


def chunk_for(event: TokenEvent, prompt: Prompt, replica_id: str) -> engine_pb2.GenerateChunk:
    token = routing.output_token(prompt.seed, event.index)
    chunk = engine_pb2.GenerateChunk(index=event.index, token_ids=[token], text=f" t{token}")
    if event.ttft is not None:
        chunk.first = True
        chunk.ttft_seconds = event.ttft
        chunk.cached_tokens = event.cached or 0
        chunk.prompt_tokens = prompt.tokens
        chunk.replica_id = replica_id
    if event.finished:
        chunk.finished = True
        chunk.finish_reason = "length"
    return chunk


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, runner: EngineRunner, replica_id: str, profile: str, limits: Limits) -> None:
        self.runner = runner
        self.replica_id = replica_id
        self.profile = profile
        self.limits = limits

    async def Generate(self, request, context) -> AsyncIterator[engine_pb2.GenerateChunk]:
        prompt = parse_prompt(request, self.limits)
        ticket = self.runner.submit(prompt.tokens, prompt.blocks, request.max_tokens, request.key)
        try:
            while True:
                event = await ticket.events.get()
                yield chunk_for(event, prompt, self.replica_id)
                if event.finished:
                    return
        finally:
            self.runner.release(ticket)   # aborts the request in the model if the caller left early

    async def GetStats(self, request, context) -> engine_pb2.EngineStats:
        model = self.runner.model
        return engine_pb2.EngineStats(
            replica_id=self.replica_id, profile=self.profile, waiting=model.waiting + self.runner.pending,
            running=model.running, kv_usage=model.kv_usage, requests=model.requests,
            prompt_tokens=model.prompt_tokens, cached_tokens=model.cached_tokens, preemptions=model.preemptions,
            kv_blocks=model.kv_blocks, time_scale=self.runner.time_scale, prefill_tokens=model.prefill_backlog)
