"""Traffic through the dispatchers' OpenAI HTTP API with the official `openai` SDK
(`cacheroute demo --http`): the same Request objects as the gRPC load generator, sent as
streamed `/v1/completions` calls.

Prompt text. A Request carries chained block hashes, not text, so each one is rendered as
words that reproduce its sharing structure: 16 words per shared block, derived from the
block's hash (`b<hash>.<j>`), then one unique word per remaining prompt token
(`u<rid>.<j>`). Equal blocks become equal words, so the simulated engines (one token per
word, services.core.routing) see the same prefixes as over gRPC, and the dispatcher derives
the routing key from the first words as it would from any client's prompt.

Figures. TTFT here is the client's wall time from sending to the first streamed token (it
includes both HTTP hops); cached and prompt tokens come from the final usage chunk
(`stream_options.include_usage`), the replica and the routing reason from the dispatcher's
`x-cacheroute-*` response headers.
"""

from __future__ import annotations

import time

from clients.loadgen import Outcome
from services.core.request import BLOCK_TOKENS, Request


def prompt_text(r: Request) -> str:
    blocks = r.blocks[: r.prompt_tokens // BLOCK_TOKENS]
    words = [f"b{h:x}.{j}" for h in blocks for j in range(BLOCK_TOKENS)]
    words += [f"u{r.rid}.{j}" for j in range(max(1, r.prompt_tokens - len(words)))]
    return " ".join(words)


def http_clients(base_urls, *, token: str | None = None, timeout: float = 60.0) -> list:
    """One AsyncOpenAI client per dispatcher HTTP base URL."""
    import openai

    return [openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=token or "none", max_retries=0,
                               timeout=timeout) for url in base_urls]


async def http_send_one(client, r: Request, *, max_tokens: int, late: float, timeout: float) -> Outcome:
    """One streamed completion through the HTTP API, consumed to the end."""
    import openai

    started = time.monotonic()
    first = None
    usage = None
    try:
        async with client.completions.with_streaming_response.create(
                model="cacheroute", prompt=prompt_text(r), max_tokens=max(1, min(max_tokens, r.output_tokens)),
                stream=True, stream_options={"include_usage": True}, timeout=timeout) as response:
            headers = response.headers
            async for chunk in await response.parse():
                if first is None and chunk.choices:
                    first = time.monotonic() - started
                if chunk.usage is not None:
                    usage = chunk.usage
    except openai.APIStatusError as err:
        return Outcome(r.rid, r.key, r.arrival, late, error=f"HTTP {err.status_code}")
    except openai.APIError as err:
        return Outcome(r.rid, r.key, r.arrival, late, error=type(err).__name__)
    if first is None:
        return Outcome(r.rid, r.key, r.arrival, late, error="EMPTY_STREAM")
    details = usage.prompt_tokens_details if usage is not None else None
    return Outcome(r.rid, r.key, r.arrival, late, replica=headers.get("x-cacheroute-replica", ""),
                   reason=headers.get("x-cacheroute-reason", "unspecified"),
                   plan_version=int(headers.get("x-cacheroute-plan-version", "0") or 0), ttft=first,
                   cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
                   prompt_tokens=usage.prompt_tokens if usage is not None else 0,
                   latency=time.monotonic() - started)
