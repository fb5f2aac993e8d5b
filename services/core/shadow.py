"""Shadow-replay gate and automatic fallback rule (SPEC section 3, the paper's safe-rollout checklist).

Gate. Before a candidate plan goes live, replay recorded traffic through the simulator twice at
matched load: once routed by the candidate (cacheroute policy, the plan fixed for the whole
replay), once by Flat-LB (power of two choices), same requests, same replicas and profile.
Then replay both at a few scaled loads (the same stream time-compressed by each factor in
`load_scales`) to estimate each side's SLO capacity on that grid. The candidate passes when

    candidate p99 <= flat p99 * (1 - margin)          (better tail at matched load), or
    candidate capacity >= flat capacity * (1 + margin)  (more load under the SLO),

and its matched-load p99 is finite. A higher hit rate alone never passes: the paper's 32B
workload raised its hit rate 1.1% -> 11.8% and lost half its capacity.

Input is aggregate only, never content: one `ReplayRecord` per request (key, time, prompt
tokens, reusable prefix tokens, output tokens). `records_to_requests` turns records into
simulator requests: each key gets a chain of synthetic 16-token block hashes long enough for
its longest prefix, a request carries the first prefix_tokens // 16 of them (so requests of one
key share their prefix, as chained engine hashes do) and the rest of its prompt is a unique
suffix that never hits. The replay is bounded to the latest `max_requests` records (default
2,000) and stops raising the load at the first scale that misses the SLO, so a gate takes
seconds.

Fallback. `fallback_check(validated, observed)` -> (mode, reason) with mode "planned" or
"flat": flat when there is no passed report, when the active-key count leaves
[validated / (1 + key_tolerance), validated * (1 + key_tolerance)], or when the p99 measured
under the plan exceeds max(validated candidate p99 * (1 + p99_tolerance) + p99_slack, validated
flat p99). The second term: the replay starts cold and keeps one plan fixed, so the live p99
(re-plans, re-warms) runs above the replayed one; while it stays below what Flat-LB gave on
the same traffic the plan is still no worse than flat. A p99 measured over a window that was
not wholly planned says nothing about the plan and is ignored, so a freshly passed candidate
brings the system back to planned.

Knobs (ShadowConfig, FallbackConfig) carry documented defaults. Pure: no clocks, no I/O;
randomness from the seed in the config. The replays themselves run in the simulator:
services/sim/replay.py (`shadow_replay`, `replay_side`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from services.core.engine import EngineProfile
from services.core.plan import ShadowReport
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.request import BLOCK_TOKENS, Request
from services.core.workloads import block_hashes
from services.model import DEFAULT_COLD_TAIL, Mode

@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """One recorded request in aggregate form, for replay: the store's ArrivalRecord (services.model)
    with output tokens."""

    key: str
    time: float               # seconds, any origin
    prompt_tokens: int
    prefix_tokens: int        # tokens shared with other requests of the key (the reusable part)
    output_tokens: int = 0    # 0: unknown, ShadowConfig.default_output_tokens is used


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    profile: EngineProfile
    replicas: int
    kv_blocks: int | None = None                   # per-replica KV pool; None: the profile's
    slo_p99: float = 3.5                           # seconds; SLO for the capacity estimate
    margin: float = 0.10                           # required relative improvement
    load_scales: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)   # x recorded load
    max_requests: int = 2000                       # latest records replayed
    warmup_share: float = 0.25                     # share of the replay span excluded from metrics
    drain_limit: float = 120.0                     # simulated seconds after the last arrival
    default_output_tokens: int = 192
    cold: str = DEFAULT_COLD_TAIL                  # the candidate's cold-tail policy (as live dispatchers)
    balance_factor: float | None = BALANCE_FACTOR  # the candidate's overload guard (None: off), as live
    # the cacheroute policy's cold-home rule: off, unlike live, because the gate judges the plan's
    # placement, and the rule would route around a plan whose homes cannot hold their keys (a plan
    # pinning every key on one replica replayed at p99 1.4 s against flat's 2.5 s with it on:
    # tests/integration/test_gate_live.py) and so hide the plan it is there to refuse
    cold_home: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if not self.load_scales or any(s <= 0 for s in self.load_scales):
            raise ValueError("load_scales must be positive")
        if 1.0 not in self.load_scales:
            raise ValueError("load_scales must include 1.0 (the matched load)")
        if self.max_requests < 10:
            raise ValueError("max_requests must be >= 10")
        if not 0 <= self.margin < 1:
            raise ValueError("margin must be in [0, 1)")


# ---------------------------------------------------------------------------------------------
# records -> requests


def records_to_requests(records: Iterable[ReplayRecord], *, default_output_tokens: int = 192,
                        namespace: str = "shadow") -> list[Request]:
    """Simulator requests for the records, by time, first arrival at t = 0 (module header)."""
    recs = sorted(records, key=lambda r: r.time)
    if not recs:
        return []
    longest: dict[str, int] = {}
    for r in recs:
        _check_record(r)
        blocks = min(r.prefix_tokens, r.prompt_tokens - 1) // BLOCK_TOKENS
        longest[r.key] = max(longest.get(r.key, 0), blocks)
    chains = {key: block_hashes(namespace, key, n) for key, n in longest.items()}
    cut: dict[tuple[str, int], tuple[int, ...]] = {}
    t0 = recs[0].time
    out = []
    for rid, r in enumerate(recs):
        n = min(r.prefix_tokens, r.prompt_tokens - 1) // BLOCK_TOKENS
        chain = chains[r.key]
        blocks = chain if n == len(chain) else cut.setdefault((r.key, n), chain[:n])
        out.append(Request(rid, r.time - t0, r.key, r.prompt_tokens,
                           r.output_tokens or default_output_tokens, blocks))
    return out


def requests_to_records(requests: Iterable[Request]) -> list[ReplayRecord]:
    """The aggregate view of simulator requests (what telemetry would have recorded)."""
    return [ReplayRecord(q.key, q.arrival, q.prompt_tokens, q.prefix_tokens, q.output_tokens)
            for q in requests]


def _check_record(r: ReplayRecord) -> None:
    if not r.key:
        raise ValueError("record with an empty key")
    if not math.isfinite(r.time):
        raise ValueError(f"record of key {r.key!r} has time {r.time!r}")
    if r.prompt_tokens < 1 or r.prefix_tokens < 0 or r.output_tokens < 0:
        raise ValueError(f"record of key {r.key!r} has bad token counts "
                         f"(prompt {r.prompt_tokens}, prefix {r.prefix_tokens}, output {r.output_tokens})")


def latest(records: Sequence[ReplayRecord], max_requests: int) -> list[ReplayRecord]:
    """The `max_requests` most recent records, by time."""
    recs = sorted(records, key=lambda r: r.time)
    return recs[-max_requests:]


def scaled(requests: Sequence[Request], factor: float) -> list[Request]:
    """The same stream at `factor` x the load: arrival times divided by factor."""
    return [replace(q, arrival=q.arrival / factor) for q in requests]


# ---------------------------------------------------------------------------------------------
# the gate


@dataclass(frozen=True, slots=True)
class Replay:
    """One side of the comparison: p99 / hit rate at matched load, capacity on the scale grid."""

    hit_rate: float
    ttft_p99: float
    capacity: float
    censored: str
    points: tuple[tuple[float, float], ...]   # (qps, p99) per scale run


def verdict(candidate: Replay, flat: Replay, config: ShadowConfig) -> tuple[bool, str]:
    """Pass iff p99 or capacity improves by the margin; hit rate never counts."""
    m = config.margin
    if not math.isfinite(candidate.ttft_p99):
        return False, "candidate p99 is unbounded at matched load (requests left unserved)"
    p99_better = candidate.ttft_p99 <= flat.ttft_p99 * (1 - m)
    cap_better = candidate.capacity > 0 and candidate.capacity >= flat.capacity * (1 + m) and \
        not (candidate.censored == "right" and flat.censored == "right")
    figures = (f"p99 {candidate.ttft_p99:.3g}s vs flat {flat.ttft_p99:.3g}s, capacity "
               f"{candidate.capacity:.3g} vs {flat.capacity:.3g} qps, hit {candidate.hit_rate:.2f} vs "
               f"{flat.hit_rate:.2f}")
    if p99_better or cap_better:
        what = " and ".join(w for w, ok in (("p99", p99_better), ("capacity", cap_better)) if ok)
        return True, f"{what} better by >= {m:.0%}: {figures}"
    return False, f"neither p99 nor capacity better by {m:.0%}: {figures}"


# ---------------------------------------------------------------------------------------------
# the fallback rule


@dataclass(frozen=True, slots=True)
class Observed:
    """What the live system measured over the last window."""

    active_keys: int            # distinct keys seen
    ttft_p99: float             # seconds; nan when unknown
    mode: Mode = Mode.PLANNED   # planned only if the whole window was routed by the plan


@dataclass(frozen=True, slots=True)
class FallbackConfig:
    key_tolerance: float = 0.5        # active keys may move by this factor either way
    p99_tolerance: float = 0.5        # observed p99 may exceed the validated p99 by this share ...
    p99_slack: float = 0.25           # ... plus this many seconds (tiny p99s are noisy)


def validated_range(validated: ShadowReport, config: FallbackConfig = FallbackConfig()
                    ) -> tuple[tuple[float, float], float]:
    """((min keys, max keys), max p99 seconds) a passed report vouches for."""
    k = validated.active_keys
    keys = (k / (1 + config.key_tolerance), k * (1 + config.key_tolerance))
    band = validated.candidate_ttft_p99 * (1 + config.p99_tolerance) + config.p99_slack
    return keys, max(band, validated.flat_ttft_p99)


def fallback_check(validated: ShadowReport | None, observed: Observed,
                   config: FallbackConfig = FallbackConfig()) -> tuple[Mode, str]:
    """(Mode.PLANNED | Mode.FLAT, reason): stay planned only inside the validated range (module header)."""
    if validated is None or not validated.ran:
        return Mode.FLAT, "no shadow replay validates the plan"
    if not validated.passed:
        return Mode.FLAT, f"plan failed the shadow gate: {validated.reason}"
    (lo, hi), p99_max = validated_range(validated, config)
    if not lo <= observed.active_keys <= hi:
        return Mode.FLAT, (f"active keys {observed.active_keys} outside the validated range "
                        f"{lo:.0f}..{hi:.0f}")
    if observed.mode == Mode.PLANNED and not math.isnan(observed.ttft_p99) and observed.ttft_p99 > p99_max:
        return Mode.FLAT, f"p99 {observed.ttft_p99:.3g}s above the validated {p99_max:.3g}s"
    return Mode.PLANNED, (f"inside the validated range ({observed.active_keys} keys, "
                       f"p99 limit {p99_max:.3g}s)")
