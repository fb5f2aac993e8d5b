"""Capacity advisor: how many replicas the live traffic needs (pure core; the CLI is
clients/cli/advise.py, the planner's `cacheroute_recommended_replicas` gauge reads it).

Algorithm (`advise`):
1. Traffic: the telemetry window's per-key rates with their mean prompt and prefix tokens
   (collector GetRates, the planner's input), the window's mean output tokens per request
   (the completion counters engines and dispatchers report with their cache stats; `output_tokens`
   of the config when nothing was measured) and the burstiness of the arrivals (the coefficient
   of variation of the window's inter-arrival sample; 1 = Poisson). A synthetic stream is drawn
   from them (seeded, so the same window gives the same answer): a renewal process of the total
   rate with that CV (exponential gaps at 1, gamma gaps otherwise), each arrival's key drawn by
   rate share, each request with its key's mean prompt tokens of which the mean prefix is
   shared (services.core.shadow.records_to_requests builds the simulator requests with block
   hashes, as the shadow gate does). The stream lasts `seconds`, or less when that would pass
   `max_requests` at the window's rate.
2. For each N in max(1, N0-k) .. N0+k: the plan the planner would build on N replicas (LPT,
   services.core.planning.build_plan, with the given q_cap and W from the profile's KV size)
   is held fixed while the simulator (services/sim/) replays the stream on N replicas of the
   engine profile; the first `warmup_share` of the run warms the caches and is not measured.
3. Report per N: predicted token hit rate and p99 TTFT; `recommended` is the smallest N whose
   p99 meets the SLO (None when none of the tried N does: more than N0+k are needed).

Knobs and why (AdviceConfig):
- `seconds` 120 and `max_requests` 12,000: an overloaded N shows in p99 only once its queue
  has grown past the SLO, and that takes time near the knee; 60 s / 4,000 requests ended
  before p99 crossed it and recommended too few replicas (experiments/advisor_check.py runs
  both). One call for 8 replicas (5 simulations) costs up to ~12 CPU seconds at these sizes
  (docs/experiments.md, "Capacity advisor").
- `output_tokens` 200: used only when no reporter measured an output length. It is the Azure
  LLM inference conversation trace's mean output (211 tokens over 19,366 requests,
  $CACHEROUTE_DATA/azure-llm-2023; the Mooncake traces' are 149 and 346), rounded; not the synthetic
  workloads' (242), which the check evaluates it on. Output length sets decode work and KV
  held per request, so a low guess under-sizes: 64 recommended 1-2 replicas too few.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from services.core.engine import get_profile
from services.core.metrics import gap_cv
from services.core.planning import build_plan
from services.core.policies import make_policy
from services.core.shadow import ReplayRecord, records_to_requests
from services.core.warm import warm_slots as warm_slots_for
from services.core.workloads import arrival_times
from services.sim.simulator import SimConfig, Simulator

DEFAULT_OUTPUT_TOKENS = 200      # module header: the Azure conversation trace's mean output, rounded


@dataclass(frozen=True)
class KeyLoad:
    key: str
    rate: float                  # req/s
    prompt_tokens: float         # mean
    prefix_tokens: float         # mean shared prefix


@dataclass(frozen=True)
class AdviceConfig:
    profile: str = "llama3-8b-h100"
    replicas: int = 4            # N0, the deployment's current size
    spread: int = 2              # k: try N0-k .. N0+k
    slo_p99: float = 2.0         # seconds, p99 TTFT
    q_cap: float = 20.0          # req/s per replica at the knee (the planner's --q-cap)
    seconds: float = 120.0       # simulated traffic (module header)
    max_requests: int = 12_000   # the stream is shortened to stay within this
    output_tokens: int = DEFAULT_OUTPUT_TOKENS   # per request, when the window measured none
    warmup_share: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.spread < 0:
            raise ValueError("replicas must be >= 1 and spread >= 0")
        if not (self.slo_p99 > 0 and self.q_cap > 0 and self.seconds > 0 and self.max_requests >= 10):
            raise ValueError("slo_p99, q_cap and seconds must be > 0, max_requests >= 10")
        if self.output_tokens < 1:
            raise ValueError("output_tokens must be >= 1")
        get_profile(self.profile)


@dataclass(frozen=True)
class Point:
    replicas: int
    hit_rate: float
    ttft_p99: float
    meets_slo: bool


@dataclass(frozen=True)
class Advice:
    points: tuple[Point, ...]
    recommended: int | None      # smallest N meeting the SLO; None: none of the tried
    requests: int
    qps: float
    output_tokens: int = DEFAULT_OUTPUT_TOKENS   # per request, as simulated
    output_measured: bool = False                # from the window (True) or the config's default
    cv: float = 1.0                              # inter-arrival CV simulated


def synth_records(loads: Sequence[KeyLoad], seconds: float, seed: int, *, cv: float = 1.0,
                  output_tokens: int = 0) -> list[ReplayRecord]:
    """The synthetic stream (module header, step 1), by time."""
    hot = [k for k in loads if k.rate > 0 and math.isfinite(k.rate)]
    if not hot:
        return []
    rng = np.random.default_rng(seed)
    rates = np.array([k.rate for k in hot])
    total = float(rates.sum())
    times = arrival_times(rng, total, seconds, cv)
    which = rng.choice(len(hot), size=len(times), p=rates / total)
    shapes = [(max(1, int(round(k.prompt_tokens))), k.key) for k in hot]
    out = []
    for t, i in zip(times.tolist(), which.tolist()):
        prompt, key = shapes[i]
        prefix = min(prompt, max(0, int(round(hot[i].prefix_tokens))))
        out.append(ReplayRecord(key, t, prompt, prefix, output_tokens))
    return out


def advise(loads: Sequence[KeyLoad], config: AdviceConfig, *, output_tokens: float | None = None,
           cv: float | None = None) -> Advice:
    """The table and the recommendation (module header). `output_tokens`: the window's measured
    mean output per request (None: the config's default); `cv`: the arrivals' measured gap CV
    (None: Poisson). ValueError without traffic."""
    hot = [k for k in loads if k.rate > 0 and math.isfinite(k.rate)]
    total = sum(k.rate for k in hot)
    measured = output_tokens is not None and output_tokens >= 1 and math.isfinite(output_tokens)
    out_tokens = max(1, int(round(output_tokens))) if measured else config.output_tokens
    cv = 1.0 if cv is None or not (cv > 0 and math.isfinite(cv)) else cv
    seconds = min(config.seconds, config.max_requests / total) if total > 0 else config.seconds
    records = synth_records(hot, seconds, config.seed, cv=cv, output_tokens=out_tokens)
    if len(records) < 10:
        raise ValueError(f"too little traffic in the window to advise ({len(records)} requests in "
                         f"{seconds:g} s)")
    records = records[-config.max_requests:]
    reqs = records_to_requests(records, default_output_tokens=out_tokens, namespace="advise")
    end = reqs[-1].arrival + 1e-9
    qps = (len(reqs) - 1) / end
    profile = get_profile(config.profile)
    mean_prefix = float(np.average([k.prefix_tokens for k in hot], weights=[k.rate for k in hot]))
    w = warm_slots_for(profile, mean_prefix)
    keys, rates = [k.key for k in hot], [k.rate for k in hot]
    points = []
    for n in range(max(1, config.replicas - config.spread), config.replicas + config.spread + 1):
        plan = build_plan(keys, rates, [f"r{j}" for j in range(n)], config.q_cap, w)
        policy = make_policy("cacheroute", n, seed=config.seed)
        policy.set_plan(plan)
        sim = SimConfig(profile, n, warmup=end * config.warmup_share, end=end, q_cap=config.q_cap,
                        plan_fn=lambda **_: None)
        m = Simulator(sim, policy, reqs).run().metrics
        p99 = float(m.ttft_p99)
        points.append(Point(n, float(m.hit_rate), p99, bool(math.isfinite(p99) and p99 <= config.slo_p99)))
    recommended = next((p.replicas for p in points if p.meets_slo), None)
    return Advice(tuple(points), recommended, len(reqs), qps, out_tokens, measured, cv)


def gauge_value(advice: Advice, config: AdviceConfig) -> int:
    """What `cacheroute_recommended_replicas` shows: the recommendation, or one more than the
    largest N tried when none meets the SLO (an autoscaler then scales up)."""
    return advice.recommended if advice.recommended is not None else config.replicas + config.spread + 1


def advise_job(loads: Sequence[tuple[str, float, float, float]], config: AdviceConfig,
               output_tokens: float | None, cv: float | None) -> Advice:
    """`advise` on plain tuples: the job the planner's advisor worker process runs."""
    return advise([KeyLoad(*k) for k in loads], config, output_tokens=output_tokens, cv=cv)


class RecommendedReplicas:
    """The planner's `cacheroute_recommended_replicas` gauge: every `interval` seconds (its own,
    not the control loop's: one advice costs up to ~12 CPU s for 8 replicas), the telemetry window from the
    store (rates, the measured mean output, the gap sample's CV, the placeable engine count as N0)
    and `advise` in a worker process (services.planner.gate.ReplayWorker), so neither the CPU
    time nor the GIL is the planner event loop's; the gauge set. 0 until the first window with
    traffic; a failed or timed-out advice keeps the last value."""

    def __init__(self, store, registry, config: AdviceConfig, *, window_seconds: float, interval: float,
                 clock=None, timeout: float = 120.0) -> None:
        import time

        from prometheus_client import Gauge

        from services.planner.gate import ReplayWorker

        self.store, self.config, self.window, self.interval = store, config, window_seconds, interval
        self.clock = clock or time.time
        self.timeout = timeout
        self.gauge = Gauge("cacheroute_recommended_replicas",
                           f"smallest replica count whose simulated p99 TTFT meets {config.slo_p99:g} s "
                           "(services/planner/advisor.py; 0: no traffic yet)", registry=registry)
        self.last: Advice | None = None
        self.last_replicas = 0       # N0 of the last advice
        self.last_at = 0.0           # when it was computed (unix seconds)
        self.gauge_value = 0
        self.steps = 0
        self._worker = ReplayWorker(advise_job, name="cacheroute-advisor")
        self._task = None

    async def inputs(self) -> tuple[list[tuple[str, float, float, float]], AdviceConfig, float | None, float | None]:
        """The window's loads, the config with N0 = the stored engine set's placeable engines (the
        configured count while none is stored), the measured mean output and gap CV."""
        import dataclasses

        from services.model import mean_output_tokens

        now = self.clock()
        snap = await self.store.window_rates(now, self.window)
        loads = list(zip(snap.keys, map(float, snap.rates), map(float, snap.mean_prompt_tokens),
                         map(float, snap.mean_prefix_tokens)))
        output = mean_output_tokens((await self.store.cache_stats(now, self.window)).values())
        cv = gap_cv(await self.store.interarrival_sample(now, self.window))
        engines = (await self.store.get_engine_set()).placeable_ids()
        config = dataclasses.replace(self.config, replicas=len(engines)) if engines else self.config
        return loads, config, output, cv

    async def step(self) -> None:
        import asyncio
        import logging

        loads, config, output, cv = await self.inputs()
        try:
            self.last = await asyncio.to_thread(self._worker.call, (loads, config, output, cv), self.timeout)
        except Exception as exc:  # noqa: BLE001 - too little traffic, a timeout: keep the last value
            logging.getLogger("cacheroute.planner.advisor").info("no advice", extra={"reason": str(exc)})
            return
        finally:
            self.steps += 1
        self.last_replicas, self.last_at = config.replicas, self.clock()
        self.gauge_value = gauge_value(self.last, config)
        self.gauge.set(self.gauge_value)

    def start(self) -> None:
        import asyncio

        from services.rpc.loops import every

        async def guarded() -> None:
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - a failed read must not end the loop
                import logging
                logging.getLogger("cacheroute.planner.advisor").warning("advisor step failed: %s", exc)

        self._task = asyncio.create_task(every(self.interval, guarded), name="planner-advisor")

    async def stop(self) -> None:
        import asyncio

        from services.rpc import stop_tasks

        await asyncio.to_thread(self._worker.close)   # a job in flight ends at once (EOF)
        await stop_tasks([self._task])
        self._task = None
