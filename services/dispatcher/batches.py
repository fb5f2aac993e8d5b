"""RouteBatch in slices, so one large batch does not hold the dispatcher's event loop (issue 20).

The loop that routes a batch also serves every other caller: gRPC Route and Generate, the
HTTP API, and the health polls that keep replicas in rotation. A 10,000-request batch
(the default `--max-batch`) takes ~45 ms to key, route and encode here, more under load,
and concurrent batches add up, so before this a few huge batches stalled the loop until
health polls timed out. The rule: keys are computed, then routed and encoded, `SLICE`
requests at a time, and the loop is yielded between slices; one slice (~2 ms) is the
longest stall a batch can cause. The batch as a whole takes as long as before.

What changes for the caller: every key is still validated before anything is routed
(INVALID_ARGUMENT names the bad one, nothing routed). Each slice is encoded with the plan
version it was routed under, so a plan installed mid-batch shows in the decisions'
`plan_version`. A capped batch's telemetry (services/dispatcher/budget.py) grants each slice
its share of the granted arrivals, in proportion to its size: a stratified sample, still
uniform over the batch. Knob: `SLICE` (500: ~2 ms of routing per slice on a quiet machine).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Sequence

SLICE = 500


async def batch_keys(requests: Sequence, key_of: Callable, slice_size: int = SLICE) -> list[tuple[str, int]]:
    """`key_of(request)` for every request, yielding the loop between slices; ValueError as key_of."""
    keys: list[tuple[str, int]] = []
    for start in range(0, len(requests), slice_size):
        if start:
            await asyncio.sleep(0)
        keys += [key_of(r) for r in requests[start:start + slice_size]]
    return keys


async def route_batch(router, encoder, requests: Sequence, keys: Sequence[tuple[str, int]], now: float,
                      granted: int, slice_size: int = SLICE) -> bytes:
    """RouteBatchResponse wire bytes for `requests` (with their `keys`), routed slice by slice;
    `granted` of the arrivals are reported to telemetry. NoHealthyReplica as Router.route_many."""
    total, parts = len(keys), []
    for start in range(0, total, slice_size):
        if start:
            await asyncio.sleep(0)
        end = min(start + slice_size, total)
        share = granted * end // total - granted * start // total
        version = router.plan_version
        picks = router.route_many(((key, r.prompt_tokens, prefix) for r, (key, prefix)
                                   in zip(requests[start:end], keys[start:end])), now,
                                  report=(share, end - start) if share < end - start else None)
        parts.append(encoder.encode(picks, [key for key, _ in keys[start:end]], version))
    return b"".join(parts)
