"""Miss accounting and hit-rate time series for bench/peers.py (pure: no processes, no I/O).

Every request's prompt is tokenized and block-hashed exactly as the simulated engine does it
(services.http.oai.chat_text, services.core.routing.tokenize / prompt_hashes: 16-token blocks,
chained hashes), so the figures below are in the engine's own tokens.

Per request i, with full-block hashes B_i and L_i prompt tokens, hits capped (as the engine
caps them) at floor((L_i - 1) / 16) blocks:

  reusable_i   leading blocks of B_i that occur in some *other* request of the run: the
               tokens a cache could ever have served it if the prefix had been computed
               before (a tenant's system prompt, a session's earlier turns)
  bound_i      leading blocks of B_i that occur in an *earlier* request (schedule order): the
               infinite-cache bound, what one replica with unlimited KV would have hit
  missed_i     reusable_i - cached_i (cached from the response's usage), split by why:

    first sight        the key's first request anywhere (nothing could have been cached for
                       it, except prefixes other keys share, e.g. Mooncake's first block)
    spilled            CacheRoute only: the routing-reason header says `fallback` (the
                       dispatcher sent it away from the plan's replicas)
    first-on-replica   the key had been served before, never on this replica
    evicted            the key had been served on this replica before (its prefix was evicted
                       since, or is still being computed by a request in flight)

The key is the request's group (the tenant; the Mooncake session). Summed over the measured
requests and divided by their prompt tokens, each part is in points of hit rate, and
reusable share = hit rate + first sight + spilled + first-on-replica + evicted. The replica is
the engine that served the request (`x-engine-replica`, which every router passes through;
CacheRoute's own `x-cacheroute-replica` otherwise). Requests that failed are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from services.http import oai
from services.core import routing
from services.core.request import BLOCK_TOKENS

CATEGORIES = ("first_sight", "spilled", "first_on_replica", "evicted")


@dataclass(frozen=True, slots=True)
class PromptShape:
    """What a request's prompt offers a cache: its engine tokens and full-block hashes."""

    key: str
    tokens: int
    blocks: tuple[int, ...]

    @property
    def cap(self) -> int:
        return max(self.tokens - 1, 0) // BLOCK_TOKENS


def prompt_shape(key: str, messages: list[dict]) -> PromptShape:
    ids = routing.tokenize(oai.chat_text(messages))
    return PromptShape(key, len(ids), routing.prompt_hashes(ids))


def _lead(blocks: Sequence[int], present: set[int] | dict[int, int], cap: int, need: int = 1) -> int:
    n = 0
    for h in blocks[:cap]:
        if isinstance(present, dict):
            if present.get(h, 0) < need:
                break
        elif h not in present:
            break
        n += 1
    return n


def reusable_and_bound(shapes: Sequence[PromptShape]) -> tuple[list[int], list[int]]:
    """(reusable tokens, infinite-cache bound tokens) per request, in schedule order."""
    counts: dict[int, int] = {}
    for s in shapes:
        for h in set(s.blocks):
            counts[h] = counts.get(h, 0) + 1
    seen: set[int] = set()
    reusable, bound = [], []
    for s in shapes:
        reusable.append(_lead(s.blocks, counts, s.cap, need=2) * BLOCK_TOKENS)
        bound.append(_lead(s.blocks, seen, s.cap) * BLOCK_TOKENS)
        seen.update(s.blocks)
    return reusable, bound


@dataclass(frozen=True, slots=True)
class Served:
    """What the client saw of one request (bench/peers.py builds these from the outcomes)."""

    at: float
    ok: bool
    prompt_tokens: int
    cached_tokens: int
    replica: str
    reason: str = ""


def classify(shapes: Sequence[PromptShape], served: Sequence[Served]) -> list[tuple[str, int]]:
    """Per request: (category, missed reusable tokens); ("", 0) for a failed request. Both in
    schedule order, the same length."""
    if len(shapes) != len(served):
        raise ValueError(f"{len(shapes)} prompts but {len(served)} outcomes")
    reusable, _ = reusable_and_bound(shapes)
    history: dict[str, set[str]] = {}
    out: list[tuple[str, int]] = []
    for shape, s, r in zip(shapes, served, reusable):
        if not s.ok:
            out.append(("", 0))
            continue
        replicas = history.get(shape.key)
        missed = max(0, r - s.cached_tokens)
        if replicas is None:
            cat = "first_sight"
        elif s.reason == "fallback":
            cat = "spilled"
        elif s.replica not in replicas:
            cat = "first_on_replica"
        else:
            cat = "evicted"
        history.setdefault(shape.key, set()).add(s.replica)
        out.append((cat, missed))
    return out


def account(shapes: Sequence[PromptShape], served: Sequence[Served], warmup: float) -> dict:
    """The measured window's miss accounting (requests scheduled at or after `warmup`; the key
    history runs over the whole run): points of hit rate per category, plus the reusable share
    and the infinite-cache bound."""
    reusable, bound = reusable_and_bound(shapes)
    cats = classify(shapes, served)
    prompt = cached = re_sum = bound_sum = 0
    parts = dict.fromkeys(CATEGORIES, 0)
    counts = dict.fromkeys(CATEGORIES, 0)
    for s, (cat, missed), r, b in zip(served, cats, reusable, bound):
        if s.at < warmup or not s.ok:
            continue
        prompt += s.prompt_tokens
        cached += s.cached_tokens
        re_sum += r
        bound_sum += b
        parts[cat] += missed
        counts[cat] += missed > 0
    if not prompt:
        return {"prompt_tokens": 0}
    return {
        "prompt_tokens": prompt,
        "hit": cached / prompt,
        "reusable": re_sum / prompt,
        "bound": bound_sum / prompt,
        "missed": {c: parts[c] / prompt for c in CATEGORIES},
        "missed_requests": counts,        # requests that missed reusable tokens, per category
    }


def time_series(served: Sequence[Served], bin_s: float = 10.0, *, end: float | None = None) -> list[dict]:
    """Hit rate, requests and errors per `bin_s` seconds of schedule time (the whole run,
    warm-up included); a bin without a successful request has hit None."""
    if bin_s <= 0:
        raise ValueError("bin_s must be > 0")
    last = max((s.at for s in served), default=0.0) if end is None else end
    n = max(1, math.ceil(last / bin_s - 1e-9))
    bins = [{"t": i * bin_s, "prompt": 0, "cached": 0, "requests": 0, "errors": 0} for i in range(n)]
    for s in served:
        i = min(int(s.at // bin_s), n - 1)
        b = bins[i]
        b["requests"] += 1
        if s.ok:
            b["prompt"] += s.prompt_tokens
            b["cached"] += s.cached_tokens
        else:
            b["errors"] += 1
    return [{"t": b["t"], "hit": b["cached"] / b["prompt"] if b["prompt"] else None, "requests": b["requests"],
             "errors": b["errors"]} for b in bins]


def worst_dip(series: Sequence[dict], events: Iterable[float], *, before: int = 3, after: int = 3,
              bin_s: float = 10.0) -> float | None:
    """Largest drop (a fraction; 0 if none) of any bin's hit rate within the `after` bins from an
    event below the mean of the `before` bins preceding it; None without events or data."""
    worst = None
    for t in events:
        k = int(t // bin_s)
        ref = [b["hit"] for b in series[max(0, k - before):k] if b["hit"] is not None]
        near = [b["hit"] for b in series[k:k + after] if b["hit"] is not None]
        if not ref or not near:
            continue
        dip = max(0.0, sum(ref) / len(ref) - min(near))
        worst = dip if worst is None else max(worst, dip)
    return worst


def paired_dip(series: Sequence[dict], control: Sequence[dict], events: Iterable[float], *, after: int = 3,
               bin_s: float = 10.0, start: float = 0.0) -> dict | None:
    """The events' cost against a control run of the same request list without them: the largest
    drop (a fraction) of a bin's hit rate below the control's same bin within the `after` bins
    from an event, and the noise floor the comparison has, the largest |difference| of any bin
    from `start` to the first event (two runs of one request list differ by routing timing only),
    and the mean drop over those event bins (`mean`: one bin's noise averages out over several,
    a lasting cost does not). None without events or data."""
    times = sorted(events)
    if not times:
        return None
    diff = [(b["t"], c["hit"] - b["hit"]) for b, c in zip(series, control)
            if b["hit"] is not None and c["hit"] is not None]
    near = [d for t, d in diff if any(e <= t + bin_s and t < e + after * bin_s for e in times)]
    quiet = [abs(d) for t, d in diff if start <= t and t + bin_s <= times[0]]
    if not near:
        return None
    return {"dip": max(0.0, max(near)), "floor": max(quiet) if quiet else None, "mean": sum(near) / len(near)}
