"""W, the warm slots per replica: how many keys' prefixes one replica keeps cached (SPEC section 5).

W = cached tokens per replica x safety / mean prefix tokens (at least 1), the SPEC's
arithmetic; the safety factor (default 0.5) keeps room for running requests' KV. A pure
formula of the engine profile, so the planner's advisor, the simulator and the CLI share it
from the core instead of from the simulator's calibration module.
"""

from __future__ import annotations

from services.core.engine import EngineProfile
from services.core.request import BLOCK_TOKENS


def warm_slots(profile: EngineProfile, mean_prefix_tokens: float, safety: float = 0.5,
               kv_blocks: int | None = None) -> int:
    """W = cached tokens per replica x safety / mean prefix tokens (at least 1)."""
    blocks = kv_blocks if kv_blocks is not None else profile.kv_blocks
    if mean_prefix_tokens <= 0:
        return max(1, int(blocks * safety))   # nothing to keep warm; any bound will do
    return max(1, int(blocks * BLOCK_TOKENS * safety // mean_prefix_tokens))
