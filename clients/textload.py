"""Text workloads for routers that match on text (bench/peers.py). Pure and seeded: the same
arguments give the same request list, byte for byte, in every process.

Third-party routers (SGLang Model Gateway, vllm-router) route on the request's characters, so
a workload has to be text whose shared parts are byte-identical and whose unique parts differ.
Text is made of words from a fixed list of common English words, one space between words:
a word is one token for the simulated engine (services.core.routing: whitespace words) and
about one token for a BPE tokenizer such as SmolLM2's (bench/peers.py measures the ratio on
llama.cpp). Every piece of text is a pure function of (workload seed, what it is, its id):
a tenant's system prompt, a request's user turn, a trace block's chunk.

Workloads (parameters are chosen once per scale in bench/peers.py and documented there):

  tenants    multi-tenant chat. `tenants` tenants with log-normal popularity (sigma 1.65 at
             Blom positions, services.core.workloads.lognormal_shares: the paper's skew), each
             a system prompt of `system_words` words (log-uniform in [low, high], seeded per
             tenant), plus a unique user turn per request (`user_words`, a clipped log-normal).
             Arrivals Poisson at `qps` over `duration`; each arrival's tenant is drawn from
             the shares.
  whales     tenants plus `whales` extra tenants that together carry `whale_share` of the
             requests (equal shares), with their own system prompts drawn the same way.
  drift      tenants whose popularity ranks rotate every `drift_period` seconds: in period p
             the tenant at rank r is tenant (r + p * drift_shift) mod tenants, so the hot set
             of one period is made of tenants that were lukewarm in the last one and the old
             hot tenants drop to the coldest ranks (the shares over ranks stay the same).
  restart, kill
             the tenants traffic; bench/peers.py restarts the router tier's instances one by
             one (restart) or kills one instance for good (kill) during the run.
  mooncake   a Mooncake FAST'25 trace turned into text: each hash id (one 512-token block,
             chained: equal ids mean equal prefixes) becomes a fixed pseudo-random chunk of
             `block_words` words, a request's prompt is its ids' chunks in order, the last one
             cut so the prompt has round(input_length * block_words / 512) words. Two requests
             therefore share exactly the prefix the trace says they share. Arrivals are the
             trace's, rescaled so the mean rate is `qps`, the first `duration` seconds of it.

A request is a `TextRequest` (arrival, group, how to build its messages); `messages()` builds
the OpenAI chat messages on demand, so a long trace stays small in memory.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
import orjson

from services.core.workloads import lognormal_shares

# Common English words (written for this module). Short, frequent words so that a BPE tokenizer
# spends about one token on each; 256 of them so that random text rarely repeats a long run.
WORDS: tuple[str, ...] = tuple("""
the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her all she there would their we him been has when who will more
no if out so said what up its about into than them can only other new some could time these
two may then do first any my now such like our over man me even most made after also did
many before must through back years where much your way well down should because each just
those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might us great old year
off come since against go came right used take three states himself few house use during
without again place american around however home small found thought went say part once
general high upon school every group does got united left number course war until always
away something fact though water less public put think almost hand enough far took head yet
government system better set told nothing night end why called didn find look asked later
point knew city next program business give toward young days let light national room open
side case line order form data model cache query answer table value plan field report
river music story paper money level power policy health market window early private
summer garden
""".split())
assert len(WORDS) == len(set(WORDS)) and len(WORDS) >= 256, len(WORDS)
WORDS = WORDS[:256]

WORKLOADS = ("tenants", "whales", "mooncake", "drift", "restart", "kill")
MOONCAKE_BLOCK_TOKENS = 512


def _seed(*parts: object) -> int:
    """A 64-bit seed from the parts (stable across processes, unlike hash())."""
    h = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little")


_WORD_ARRAY = np.array(WORDS, dtype=object)


def words(seed: int, n: int) -> str:
    """`n` pseudo-random words, space-separated, a pure function of (seed, n)."""
    if n <= 0:
        return ""
    idx = np.random.default_rng(seed).integers(0, len(WORDS), n)
    return " ".join(_WORD_ARRAY[idx])


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One request of a text workload.

    `group` is the tenant (tenants, whales) or the session, i.e. the first two trace blocks
    (mooncake): what a request shares its prefix with, for per-group reporting only.
    `system`/`user` say how to build the text: ("tenant", seed, words) / ("turn", seed, words),
    or for mooncake `user` = ("blocks", ids, words) and no system prompt.
    """

    rid: int
    at: float                         # seconds from the start of the run (open-loop schedule)
    group: str
    system: tuple | None
    user: tuple
    max_tokens: int

    def messages(self) -> list[dict[str, str]]:
        out = []
        if self.system is not None:
            out.append({"role": "system", "content": render(self.system)})
        out.append({"role": "user", "content": render(self.user)})
        return out

    def body(self, model: str, *, stream: bool = True) -> bytes:
        """The /v1/chat/completions request body (JSON bytes)."""
        doc = {"model": model, "messages": self.messages(), "max_tokens": self.max_tokens,
               "temperature": 0.0, "ignore_eos": True, "stream": stream}
        if stream:
            doc["stream_options"] = {"include_usage": True}
        return orjson.dumps(doc)

    @property
    def shared_words(self) -> int:
        """Words of the prompt another request may share (system prompt, or all but the
        request's own last trace block): an upper bound used for reporting."""
        if self.system is not None:
            return self.system[2]
        _, ids, total, block_words, _ = self.user
        return min(total, (len(ids) - 1) * block_words)


@lru_cache(maxsize=8192)
def _tenant_text(seed: int, n: int) -> str:
    return words(seed, n)


@lru_cache(maxsize=16384)
def _chunk(seed: int, n: int) -> str:
    return words(seed, n)


def render(part: tuple) -> str:
    kind = part[0]
    if kind == "tenant":
        return _tenant_text(part[1], part[2])
    if kind == "turn":
        return words(part[1], part[2])
    if kind == "blocks":
        _, ids, total, block_words, seed = part
        chunks, left = [], total
        for block_id in ids:
            if left <= 0:
                break
            take = min(block_words, left)
            text = _chunk(_seed(seed, "block", block_id), block_words)
            if take < block_words:
                text = " ".join(text.split(" ", take)[:take])
            chunks.append(text)
            left -= take
        return " ".join(chunks)
    raise ValueError(f"unknown text part {kind!r}")


@dataclass(frozen=True, slots=True)
class WordRange:
    """Clipped log-normal (median, sigma) or, with sigma None, log-uniform on [low, high]."""

    low: int
    high: int
    median: float | None = None
    sigma: float | None = None

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"bad word range [{self.low}, {self.high}]")
        if self.sigma is None:
            x = np.exp(rng.uniform(math.log(self.low), math.log(self.high), size))
        else:
            x = rng.lognormal(math.log(self.median), self.sigma, size)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class TextWorkload:
    name: str
    qps: float
    duration: float
    seed: int
    requests: tuple[TextRequest, ...]
    knobs: dict

    def describe(self) -> dict:
        reqs = self.requests
        n = len(reqs) or 1
        groups = {}
        for q in reqs:
            groups[q.group] = groups.get(q.group, 0) + 1
        top = max(groups.values(), default=0)
        return {"name": self.name, "qps": self.qps, "duration": self.duration, "seed": self.seed,
                "requests": len(reqs), "groups": len(groups), "top_group_share": top / n,
                "mean_shared_words": sum(q.shared_words for q in reqs) / n, "knobs": dict(self.knobs)}


def _arrivals(rng: np.random.Generator, qps: float, duration: float) -> np.ndarray:
    if qps <= 0 or duration <= 0:
        raise ValueError(f"qps and duration must be positive, got qps={qps}, duration={duration}")
    n = int(qps * duration + 8 * math.sqrt(qps * duration) + 16)
    times = np.cumsum(rng.exponential(1.0 / qps, n))
    while times[-1] < duration:   # pragma: no cover - 8 sigma short
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / qps, n))])
    return times[times < duration]


def tenants(*, qps: float, duration: float, seed: int = 0, tenants: int = 400, sigma: float = 1.65,
            system_words: WordRange = WordRange(1024, 4096), user_words: WordRange = WordRange(16, 128, 48, 0.5),
            whales: int = 0, whale_share: float = 0.0, max_tokens: int = 8, drift_period: float = 0.0,
            drift_shift: int = 0, name: str = "") -> TextWorkload:
    """Multi-tenant chat (and, with whales > 0, the whale variant; with drift_period > 0, the
    drift variant); see the module header."""
    if tenants < 1:
        raise ValueError("tenants must be >= 1")
    if drift_period < 0 or (drift_period > 0) != (drift_shift != 0):
        raise ValueError("drift needs drift_period > 0 and drift_shift != 0 (or both 0)")
    if whales < 0 or not 0.0 <= whale_share < 1.0 or (whales > 0) != (whale_share > 0):
        raise ValueError("whales >= 1 needs 0 < whale_share < 1 (and whales = 0 a share of 0)")
    rng = np.random.default_rng(_seed(seed, "tenants"))
    base = lognormal_shares(tenants, sigma) * (1.0 - whale_share)
    shares = np.concatenate([np.full(whales, whale_share / whales) if whales else np.zeros(0), base])
    names = [f"w{i}" for i in range(whales)] + [f"t{i:04d}" for i in range(tenants)]
    # system prompt length per tenant, seeded by the tenant alone: the same across qps points
    lengths = [int(system_words.sample(np.random.default_rng(_seed(seed, "len", name)), 1)[0]) for name in names]
    times = _arrivals(rng, qps, duration)
    picks = rng.choice(len(names), size=len(times), p=shares / shares.sum())
    if drift_period > 0:   # rank -> tenant rotates each period; whales (the first names) keep theirs
        period = np.floor(times / drift_period).astype(np.int64)
        base_pick = picks >= whales
        picks = np.where(base_pick, whales + (picks - whales + period * drift_shift) % tenants, picks)
    turns = user_words.sample(rng, len(times))
    reqs = tuple(
        TextRequest(rid=i, at=float(t), group=names[k], system=("tenant", _seed(seed, "sys", names[k]), lengths[k]),
                    user=("turn", _seed(seed, "turn", qps, i), int(turns[i])), max_tokens=max_tokens)
        for i, (t, k) in enumerate(zip(times, picks)))
    name = name or ("drift" if drift_period else "whales" if whales else "tenants")
    knobs = {"tenants": tenants, "sigma": sigma, "system_words": [system_words.low, system_words.high],
             "user_words": [user_words.low, user_words.high, user_words.median, user_words.sigma],
             "whales": whales, "whale_share": whale_share, "max_tokens": max_tokens,
             "drift_period": drift_period, "drift_shift": drift_shift}
    return TextWorkload(name, qps, duration, seed, reqs, knobs)


def read_mooncake(lines: Iterable[bytes | str], source: str = "trace") -> list[tuple[float, int, tuple[int, ...]]]:
    """(timestamp s, input_length, hash_ids) rows of a Mooncake JSONL trace; ValueError naming
    the line on a malformed one."""
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
            row = (float(doc["timestamp"]) / 1000.0, int(doc["input_length"]), tuple(int(i) for i in doc["hash_ids"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}:{n}: not a Mooncake record ({exc})") from None
        if row[1] < 1 or not row[2]:
            raise ValueError(f"{source}:{n}: input_length must be >= 1 and hash_ids non-empty")
        rows.append(row)
    if not rows:
        raise ValueError(f"{source}: no requests")
    return rows


def mooncake(rows: Sequence[tuple[float, int, tuple[int, ...]]], *, qps: float, duration: float, seed: int = 0,
             block_words: int = MOONCAKE_BLOCK_TOKENS, max_words: int | None = None,
             max_tokens: int = 8) -> TextWorkload:
    """A Mooncake trace as text (see the module header). `max_words` drops longer prompts."""
    if block_words < 1:
        raise ValueError("block_words must be >= 1")
    if qps <= 0 or duration <= 0:
        raise ValueError("qps and duration must be positive")
    t0 = rows[0][0]
    span = rows[-1][0] - t0
    native = (len(rows) - 1) / span if span > 0 else float(len(rows))
    scale = native / qps                       # trace seconds -> run seconds
    reqs = []
    for ts, length, ids in rows:
        at = (ts - t0) * scale
        if at >= duration:
            break
        total = max(1, round(length * block_words / MOONCAKE_BLOCK_TOKENS))
        if max_words is not None and total > max_words:
            continue
        group = "-".join(str(i) for i in ids[:2])
        reqs.append(TextRequest(rid=len(reqs), at=at, group=group, system=None,
                                user=("blocks", ids, total, block_words, seed), max_tokens=max_tokens))
    knobs = {"block_words": block_words, "max_words": max_words, "max_tokens": max_tokens,
             "native_qps": native}
    return TextWorkload("mooncake", qps, duration, seed, tuple(reqs), knobs)


def shared_prefix_words(a: str, b: str) -> int:
    """Words two prompts share at their start (for tests and reports)."""
    n = 0
    for x, y in zip(a.split(" "), b.split(" ")):
        if x != y:
            break
        n += 1
    return n
