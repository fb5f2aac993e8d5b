"""Capacity advisor: how many replicas the live traffic needs (pure core; the CLI is
clients/cli/advise.py, the planner's `cacheroute_recommended_replicas` gauge reads it).

Algorithm (`advise`):
1. Traffic: the telemetry window's per-key rates with their mean prompt and prefix tokens
   (collector GetRates, the planner's input). A synthetic stream of `seconds` seconds is drawn
   from them: Poisson arrivals per key (seeded, so the same window gives the same answer),
   each request with the key's mean prompt tokens of which the mean prefix is shared
   (services.core.shadow.records_to_requests turns these aggregate records into simulator
   requests with block hashes, as the shadow gate does). Streams longer than `max_requests`
   are cut to the latest requests.
2. For each N in max(1, N0-k) .. N0+k: the plan the planner would build on N replicas (LPT,
   services.core.planning.build_plan, with the given q_cap and W from the profile's KV size)
   is held fixed while the simulator (services/sim/) replays the stream on N replicas of the
   engine profile; the first `warmup_share` of the run warms the caches and is not measured.
3. Report per N: predicted token hit rate and p99 TTFT; `recommended` is the smallest N whose
   p99 meets the SLO (None when none of the tried N does: more than N0+k are needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from services.core.engine import get_profile
from services.core.planning import build_plan
from services.core.policies import make_policy
from services.core.shadow import ReplayRecord, records_to_requests
from services.core.warm import warm_slots as warm_slots_for
from services.rpc import stop_tasks
from services.rpc.loops import every
from services.sim.simulator import SimConfig, Simulator


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
    seconds: float = 60.0        # simulated traffic
    max_requests: int = 4000
    output_tokens: int = 64
    warmup_share: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.spread < 0:
            raise ValueError("replicas must be >= 1 and spread >= 0")
        if not (self.slo_p99 > 0 and self.q_cap > 0 and self.seconds > 0 and self.max_requests >= 10):
            raise ValueError("slo_p99, q_cap and seconds must be > 0, max_requests >= 10")
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


def synth_records(loads: Sequence[KeyLoad], seconds: float, seed: int) -> list[ReplayRecord]:
    rng = np.random.default_rng(seed)
    out: list[ReplayRecord] = []
    for k in loads:
        if not (k.rate > 0 and math.isfinite(k.rate)):
            continue
        n = int(rng.poisson(k.rate * seconds))
        prompt = max(1, int(round(k.prompt_tokens)))
        prefix = min(prompt, max(0, int(round(k.prefix_tokens))))
        for t in np.sort(rng.uniform(0.0, seconds, n)):
            out.append(ReplayRecord(k.key, float(t), prompt, prefix))
    return out


def advise(loads: Sequence[KeyLoad], config: AdviceConfig) -> Advice:
    """The table and the recommendation (module header). ValueError without traffic."""
    records = synth_records(loads, config.seconds, config.seed)
    records.sort(key=lambda r: r.time)
    records = records[-config.max_requests:]
    if len(records) < 10:
        raise ValueError(f"too little traffic in the window to advise ({len(records)} requests in "
                         f"{config.seconds:g} s)")
    reqs = records_to_requests(records, default_output_tokens=config.output_tokens, namespace="advise")
    end = reqs[-1].arrival + 1e-9
    qps = (len(reqs) - 1) / end
    profile = get_profile(config.profile)
    hot = [k for k in loads if k.rate > 0]
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
    return Advice(tuple(points), recommended, len(reqs), qps)


def gauge_value(advice: Advice, config: AdviceConfig) -> int:
    """What `cacheroute_recommended_replicas` shows: the recommendation, or one more than the
    largest N tried when none meets the SLO (an autoscaler then scales up)."""
    return advice.recommended if advice.recommended is not None else config.replicas + config.spread + 1


class RecommendedReplicas:
    """The planner's `cacheroute_recommended_replicas` gauge: every `interval` seconds, the
    telemetry window from the store, `advise` in a worker thread (the event loop keeps serving),
    the gauge set. 0 until the first window with traffic."""

    def __init__(self, store, registry, config: AdviceConfig, *, window_seconds: float, interval: float,
                 clock=None) -> None:
        import time

        from prometheus_client import Gauge

        self.store, self.config, self.window, self.interval = store, config, window_seconds, interval
        self.clock = clock or time.time
        self.gauge = Gauge("cacheroute_recommended_replicas",
                           f"smallest replica count whose simulated p99 TTFT meets {config.slo_p99:g} s "
                           "(services/planner/advisor.py; 0: no traffic yet)", registry=registry)
        self.last: Advice | None = None
        self._task = None

    async def step(self) -> None:
        import asyncio
        import logging

        snap = await self.store.window_rates(self.clock(), self.window)
        loads = [KeyLoad(k, r, p, x) for k, r, p, x in
                 zip(snap.keys, snap.rates, snap.mean_prompt_tokens, snap.mean_prefix_tokens)]
        try:
            self.last = await asyncio.to_thread(advise, loads, self.config)
        except ValueError as exc:          # too little traffic: keep the last value
            logging.getLogger("cacheroute.planner.advisor").debug("no advice", extra={"reason": str(exc)})
            return
        self.gauge.set(gauge_value(self.last, self.config))

    def start(self) -> None:
        import asyncio


        async def guarded() -> None:
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - a failed read must not end the loop
                import logging
                logging.getLogger("cacheroute.planner.advisor").warning("advisor step failed: %s", exc)

        self._task = asyncio.create_task(every(self.interval, guarded), name="planner-advisor")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
