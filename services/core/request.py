"""A request as routers, the engine model and the simulator see it.

`blocks` holds the chained hashes of the prompt's full 16-token blocks that other requests
may share (block i's hash covers blocks 0..i, so equal hashes mean equal prefixes). Prompt
tokens beyond `16 * len(blocks)` are unique to this request and never hit the cache.
Requests of one key share one `blocks` tuple object, so a large trace stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Request:
    rid: int
    arrival: float            # seconds (virtual clock in the simulator)
    key: str                  # routing key (tenant / session / prefix id)
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()

    @property
    def prefix_tokens(self) -> int:
        """Reusable prefix length in tokens (what a warm replica can skip at best)."""
        return min(len(self.blocks) * BLOCK_TOKENS, max(self.prompt_tokens - 1, 0))
