"""Engine replica model: a simulated vLLM V1 engine with a block prefix cache (SPEC section 4).

One model drives both the live gRPC engine replica (which sleeps for each step's duration)
and the discrete-event simulator (virtual clock). It is pure: callers pass `now` in.

KV cache: `services.core.kvpool.PrefixPool`, a block pool with vLLM V1 `KVCacheManager` /
  `BlockPool` semantics (ref-counted 16-token blocks, an LRU free queue, chained hashes;
  that module's header says how).

Prefix hit
  When a request is scheduled from the waiting queue: the longest run of leading blocks whose
  hashes are cached, capped at floor((L - 1) / 16) blocks so at least one token is computed
  (L counts the generated tokens too after a preemption). Hit blocks are touched: ref++ and,
  if unreferenced, taken out of the free queue. The request's reported cached tokens are
  those of its *first* scheduling only, as vLLM records `num_cached_tokens` once: a request
  preempted in the middle of its prefill finds its own chunks still cached when it is
  re-admitted, and those re-hits save recomputation but are not prefix reuse (counting them
  let served hit rates exceed what an infinite cache could hit).

Scheduler (vLLM V1 `Scheduler.schedule`, chunked prefill always on)
  Token budget `max_batched_tokens` (8192) and at most `max_running` (256) running requests.
  Running requests first, in admission order: an unfinished prefill gets a chunk of up to the
  remaining budget, a decoding request 1 token. If its blocks cannot be allocated, the newest
  running request is preempted (recompute: its blocks are freed, its progress reset, and it
  goes back to the front of the waiting queue) until the allocation fits or the request itself
  was preempted. Then, only if nothing was preempted this step, waiting requests FCFS while
  budget, the running limit and free blocks allow. Each request computes `L + g - computed`
  tokens before its next token can be sampled (g = tokens generated so far); when a step
  completes that, one token is emitted. The first emitted token ends the TTFT.

Step time
  T = t0 + max(t_w, a*N) + b * sum_prefill(n_i*c_i + n_i^2/2) + d * K_dec
  N scheduled tokens; n_i, c_i a prefill chunk's size and prior context; K_dec the summed prior
  context of decoding requests. Coefficients per profile (PROFILES, from the SPEC table).

Decode fast-forward (for the simulator)
  When no request waits and every running request is decoding, the next steps are fully
  determined until a request finishes or the free blocks run out: `decode_horizon` says how
  many, `decode_duration(k)` how long k of them take (closed form: K_dec grows by n per
  step), and `advance_decode(k)` applies them in one go.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from services.core.kvpool import PrefixPool, ceil_blocks
from services.core.request import BLOCK_TOKENS, Request


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One model + hardware combination. Times in seconds."""

    name: str
    kv_blocks: int
    t0: float          # fixed per-step overhead
    t_w: float         # minimum forward time (weights read once per step)
    a: float           # per scheduled token
    b: float           # per prefill query-key pair
    d: float           # per context token of a decoding request
    max_batched_tokens: int = 8192
    max_running: int = 256

    @property
    def cached_tokens_capacity(self) -> int:
        return self.kv_blocks * BLOCK_TOKENS

    def prefill_time(self, tokens: int, cached: int = 0) -> float:
        """Duration of one step that prefills `tokens` new tokens after `cached` ones, alone."""
        return self.t0 + max(self.t_w, self.a * tokens) + self.b * (tokens * cached + tokens * tokens / 2)


PROFILES: Mapping[str, EngineProfile] = MappingProxyType({
    p.name: p for p in (
        EngineProfile("llama3-8b-h100", kv_blocks=27_500, t0=1.0e-3, t_w=6.2e-3, a=24e-6, b=1.2e-9, d=50e-9),
        EngineProfile("llama3-70b-fp8-h100x2", kv_blocks=14_100, t0=1.5e-3, t_w=16e-3, a=78e-6, b=2.9e-9,
                      d=63e-9),
        # derived from the two above by scaling (docs/experiments.md, "A 32B profile"): fp8 weights,
        # bf16 KV, one H100; the negative regime's model size
        EngineProfile("qwen2.5-32b-fp8-h100", kv_blocks=9_500, t0=1.3e-3, t_w=12.7e-3, a=72e-6, b=2.95e-9,
                      d=100e-9),
    )
})


def get_profile(name: str) -> EngineProfile:
    """The named profile; ValueError listing the valid names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}") from None


@dataclass(slots=True)
class StepResult:
    """What one step (or, from `advance_decode`, `steps` decode steps) produced."""

    duration: float
    first_tokens: list[tuple[int, int]] = field(default_factory=list)  # (rid, cached prompt tokens)
    decoded: list[int] = field(default_factory=list)    # rids that emitted a token (incl. the first)
    finished: list[int] = field(default_factory=list)   # rids done (their last token emitted)
    preempted: list[int] = field(default_factory=list)  # rids sent back to waiting
    steps: int = 1                                      # each rid in `decoded` emitted this many


class _Seq:
    """Mutable per-request engine state."""

    __slots__ = ("req", "rid", "arrival", "prompt", "output", "blocks", "computed", "generated",
                 "target", "prefilling", "nblocks", "hashed", "sealed", "cached")

    def __init__(self, req: Request, now: float) -> None:
        self.req = req
        self.rid = req.rid
        self.arrival = now
        self.prompt = req.prompt_tokens
        self.output = max(1, req.output_tokens)
        self.blocks = req.blocks
        self.computed = 0       # tokens whose KV is computed
        self.generated = 0      # tokens emitted
        self.target = self.prompt   # computed needed before the next token (while prefilling)
        self.prefilling = True
        self.nblocks = 0        # blocks held
        self.hashed = 0         # leading blocks held under their hash (ref-counted in the map)
        self.sealed = False     # a duplicate was met: no further blocks get registered
        self.cached = -1        # prompt tokens hit at its first scheduling (-1: not yet scheduled)


class EngineModel:
    """A simulated engine replica. Drive it with `add` and then `step` (or the decode
    fast-forward trio) back to back; each step starts when the previous one ended."""

    def __init__(self, profile: EngineProfile, kv_blocks: int | None = None) -> None:
        self.profile = profile
        self.kv_blocks = int(kv_blocks if kv_blocks is not None else profile.kv_blocks)
        if self.kv_blocks < 1:
            raise ValueError("kv_blocks must be >= 1")
        self._pool = PrefixPool(self.kv_blocks)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._seqs: dict[int, _Seq] = {}
        self._n_prefilling = 0      # running requests still prefilling
        self._backlog = 0           # prefill tokens not yet computed (waiting counted in full)
        # cumulative counters
        self.requests = 0           # first tokens emitted (finished prefills)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.preemptions = 0
        self.finished_requests = 0
        self.output_tokens = 0      # output tokens of the finished requests

    # -- queries ------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def active_blocks(self) -> int:
        """Blocks referenced by running requests."""
        return self.kv_blocks - self._pool.free

    @property
    def kv_usage(self) -> float:
        return (self.kv_blocks - self._pool.free) / self.kv_blocks

    @property
    def free_blocks(self) -> int:
        return self._pool.free

    @property
    def prefill_backlog(self) -> int:
        """Prompt tokens still to prefill: waiting requests in full (their hit is unknown until
        scheduled), running ones what is left of their prefill."""
        return self._backlog

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    @property
    def decode_only(self) -> bool:
        """No request waits and every running one is decoding: the fast-forward applies."""
        return not self._waiting and self._n_prefilling == 0 and bool(self._running)

    def cached_block_count(self) -> int:
        """Blocks holding a hash (referenced or in the free queue)."""
        return self._pool.cached()

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` whose hashes are cached (no touching, no cap)."""
        return self._pool.match(blocks) if blocks else 0

    def has(self, rid: int) -> bool:
        return rid in self._seqs

    def rids(self) -> list[int]:
        """Requests on this engine, waiting or running."""
        return list(self._seqs)

    # -- admission ----------------------------------------------------------------------------

    def add(self, request: Request, now: float) -> None:
        """Queue a request (FCFS). `now` is its arrival at this replica."""
        if request.rid in self._seqs:
            raise ValueError(f"request {request.rid} is already queued on this engine")
        if request.prompt_tokens < 1:
            raise ValueError(f"request {request.rid} has an empty prompt")
        if ceil_blocks(request.prompt_tokens + max(1, request.output_tokens)) > self.kv_blocks:
            raise ValueError(f"request {request.rid} needs more KV blocks than the pool holds")
        seq = _Seq(request, now)
        self._seqs[request.rid] = seq
        self._waiting.append(seq)
        self._backlog += seq.prompt

    def abort(self, rid: int) -> bool:
        """Drop a request (client gone); its blocks are freed. False if unknown."""
        seq = self._seqs.pop(rid, None)
        if seq is None:
            return False
        if seq in self._waiting:
            self._waiting.remove(seq)
        else:
            self._running.remove(seq)
            if seq.prefilling:
                self._n_prefilling -= 1
            self._release(seq)
        if seq.prefilling:
            self._backlog -= seq.target - seq.computed
        return True

    # -- the KV pool --------------------------------------------------------------------------

    def _release(self, seq: _Seq) -> None:
        self._pool.release(seq.blocks, seq.hashed, seq.nblocks - seq.hashed)
        seq.nblocks = seq.hashed = 0
        seq.sealed = False

    def _register(self, seq: _Seq, upto_tokens: int) -> None:
        """Hash the shareable blocks that are full once `upto_tokens` are computed."""
        last = min(len(seq.blocks), upto_tokens // BLOCK_TOKENS)
        if seq.sealed or seq.hashed >= last:
            return
        added = self._pool.register(seq.blocks, seq.hashed, last)
        if not added:
            seq.sealed = True
        seq.hashed += added

    def _preempt(self, seq: _Seq) -> None:
        if seq.prefilling:
            self._n_prefilling -= 1
            self._backlog -= seq.target - seq.computed
        self._release(seq)
        seq.computed = 0
        seq.target = seq.prompt + seq.generated
        seq.prefilling = True
        self._backlog += seq.target
        self._waiting.appendleft(seq)
        self.preemptions += 1

    # -- one step -----------------------------------------------------------------------------

    def step(self, now: float) -> StepResult | None:
        """Schedule and run one step starting at `now`; None when there is nothing to do.
        The returned results take effect at `now + duration`."""
        if not self._running and not self._waiting:
            return None
        prof = self.profile
        budget = prof.max_batched_tokens
        running = self._running
        result = StepResult(0.0)
        scheduled: list[tuple[_Seq, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(seq.target - seq.computed, budget) if seq.prefilling else 1
            need = ceil_blocks(seq.computed + n) - seq.nblocks
            while need > self._pool.free:
                victim = running.pop()
                self._preempt(victim)
                result.preempted.append(victim.rid)
                preempted = True
                if victim is seq:
                    break
            else:
                if need:
                    self._pool.take(need)
                    seq.nblocks += need
                if seq.prefilling:
                    self._register(seq, seq.computed + n)
                scheduled.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            budget = self._admit_waiting(budget, scheduled)
        if not scheduled:
            if not preempted:   # cannot happen: add() rejects requests larger than the pool
                raise RuntimeError("no request can be scheduled")
            result.duration = prof.t0   # the only running request preempted itself
            return result
        result.duration = self._run(scheduled, result)
        return result

    def _admit_waiting(self, budget: int, scheduled: list[tuple[_Seq, int]]) -> int:
        waiting = self._waiting
        running = self._running
        pool = self._pool
        max_running = self.profile.max_running
        while waiting and budget > 0 and len(running) < max_running:
            seq = waiting[0]
            cap = min(len(seq.blocks), (seq.prompt + seq.generated - 1) // BLOCK_TOKENS)
            if cap > 0:
                hit, evictable, path = pool.lookup(seq.blocks, cap)
            else:
                hit = evictable = 0
            hit_tokens = hit * BLOCK_TOKENS
            n = min(seq.target - hit_tokens, budget)
            need = ceil_blocks(hit_tokens + n) - hit
            if need + evictable > pool.free:
                break
            waiting.popleft()
            if hit:
                pool.touch(path)
            seq.hashed = seq.nblocks = hit
            if need:
                pool.take(need)
                seq.nblocks += need
            seq.computed = hit_tokens
            self._backlog -= hit_tokens
            if seq.cached < 0:
                seq.cached = hit_tokens   # once, at first scheduling (vLLM's num_cached_tokens)
            self._register(seq, hit_tokens + n)
            running.append(seq)
            self._n_prefilling += 1
            scheduled.append((seq, n))
            budget -= n
        return budget

    def _run(self, scheduled: list[tuple[_Seq, int]], result: StepResult) -> float:
        """Apply the computation of one step; return its duration."""
        prof = self.profile
        tokens = 0
        pairs = 0.0
        k_dec = 0
        done: list[_Seq] = []
        decoded = result.decoded
        for seq, n in scheduled:
            c = seq.computed
            tokens += n
            if seq.prefilling:
                pairs += n * c + n * n / 2
                self._backlog -= n
                seq.computed = c + n
                if seq.computed < seq.target:
                    continue
                seq.prefilling = False
                self._n_prefilling -= 1
                if seq.generated == 0:
                    result.first_tokens.append((seq.rid, seq.cached))
                    self.requests += 1
                    self.prompt_tokens += seq.prompt
                    self.cached_tokens += seq.cached
            else:
                k_dec += c
                seq.computed = c + 1
            seq.generated += 1
            decoded.append(seq.rid)
            if seq.generated >= seq.output:
                done.append(seq)
        if done:
            self._finish(done, result)
        return prof.t0 + max(prof.t_w, prof.a * tokens) + prof.b * pairs + prof.d * k_dec

    def _finish(self, done: list[_Seq], result: StepResult) -> None:
        for seq in done:
            self._release(seq)
            del self._seqs[seq.rid]
            result.finished.append(seq.rid)
        self.finished_requests += len(done)
        self.output_tokens += sum(seq.output for seq in done)
        gone = set(map(id, done))
        self._running = [s for s in self._running if id(s) not in gone]

    # -- decode fast-forward ------------------------------------------------------------------

    def decode_horizon(self, max_steps: int | None = None) -> int:
        """How many decode-only steps the running batch can run back to back: up to and
        including the step in which the first request finishes, and only as many as the free
        blocks cover (0: the next step needs a preemption or a prefill, use `step`). Waiting
        requests are ignored: call it when `decode_only`, or after arrivals during a run."""
        if self._n_prefilling or not self._running:
            return 0
        running = self._running
        k = min(s.output - s.generated for s in running)
        if max_steps is not None:
            k = min(k, max_steps)
        if self._decode_blocks(k) <= self._pool.free:
            return k
        lo, hi = 0, k    # demand(lo) fits, demand(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._decode_blocks(mid) <= self._pool.free:
                lo = mid
            else:
                hi = mid
        return lo

    def _decode_blocks(self, k: int) -> int:
        """New blocks the running requests need for k more decode steps."""
        return sum(ceil_blocks(s.computed + k) for s in self._running) - sum(s.nblocks for s in self._running)

    def decode_step_params(self) -> tuple[float, float]:
        """(duration of the next decode step, growth per step) for the current batch."""
        prof = self.profile
        n = len(self._running)
        k_dec = sum(s.computed for s in self._running)
        return prof.t0 + max(prof.t_w, prof.a * n) + prof.d * k_dec, prof.d * n

    def decode_duration(self, k: int) -> float:
        """Duration of the next k decode-only steps (K_dec grows by n per step)."""
        first, growth = self.decode_step_params()
        return k * first + growth * k * (k - 1) / 2

    def advance_decode(self, k: int) -> StepResult:
        """Apply k decode-only steps at once (k <= decode_horizon())."""
        # requests that arrived during the run wait in `_waiting`; they join afterwards
        if k < 1 or self._n_prefilling or not self._running:
            raise ValueError("advance_decode needs k >= 1 and only decoding requests running")
        duration = self.decode_duration(k)
        need = self._decode_blocks(k)
        if need > self._pool.free:
            raise ValueError(f"{k} decode steps need {need} blocks, {self._pool.free} free")
        if need:
            self._pool.take(need)
        result = StepResult(duration, steps=k)
        done: list[_Seq] = []
        decoded = result.decoded
        for seq in self._running:
            seq.computed += k
            seq.nblocks = ceil_blocks(seq.computed)
            seq.generated += k
            decoded.append(seq.rid)
            if seq.generated >= seq.output:
                if seq.generated > seq.output:
                    raise ValueError(f"{k} decode steps run past request {seq.rid}'s last token")
                done.append(seq)
        if done:
            self._finish(done, result)
        return result


def steps_until(first: float, growth: float, dt: float, k_max: int) -> int:
    """Smallest j in 1..k_max with j*first + growth*j*(j-1)/2 >= dt (k_max if none): the
    step boundary at or after `dt` into a run of decode steps."""
    if dt <= first:
        return 1
    if growth <= 0:
        j = math.ceil(dt / first)
    else:
        # growth/2 j^2 + (first - growth/2) j - dt = 0
        p = first - growth / 2
        j = math.ceil((-p + math.sqrt(p * p + 2 * growth * dt)) / growth)
    j = max(1, min(j, k_max))
    # float guard: step to the exact boundary
    while j > 1 and (j - 1) * first + growth * (j - 1) * (j - 2) / 2 >= dt:
        j -= 1
    while j < k_max and j * first + growth * j * (j - 1) / 2 < dt:
        j += 1
    return j
