"""The shadow gate's replays in the simulator (the rule, the records and the knobs:
services/core/shadow.py): `shadow_replay` replays recorded traffic under a candidate plan and
under Flat-LB and returns the gate's report; `replay_side` is one side of that comparison."""

from __future__ import annotations

from typing import Sequence

from services.core.metrics import slo_capacity
from services.core.plan import Plan, ShadowReport
from services.core.policies import make_policy
from services.core.request import Request
from services.core.shadow import Replay, ReplayRecord, ShadowConfig, latest, records_to_requests, scaled, verdict
from services.sim.simulator import SimConfig, Simulator


def shadow_replay(records: Sequence[ReplayRecord], plan: Plan, config: ShadowConfig) -> ShadowReport:
    """Replay `records` under `plan` and under Flat-LB; the gate's verdict (module header)."""
    if plan.replicas != config.replicas:
        raise ValueError(f"plan has {plan.replicas} replicas, config {config.replicas}")
    recs = latest(records, config.max_requests)
    reqs = records_to_requests(recs, default_output_tokens=config.default_output_tokens)
    if len(reqs) < 10:
        return ShadowReport(ran=False, passed=False, reason=f"too few records to replay ({len(reqs)})",
                            requests=len(reqs))
    span = reqs[-1].arrival
    if span <= 0:
        return ShadowReport(ran=False, passed=False, reason="records span no time", requests=len(reqs))
    qps = (len(reqs) - 1) / span
    candidate = replay_side(reqs, qps, config, plan)
    flat = replay_side(reqs, qps, config, None)
    passed, reason = verdict(candidate, flat, config)
    return ShadowReport(
        ran=True, passed=passed, reason=reason, requests=len(reqs), qps=qps,
        candidate_hit_rate=candidate.hit_rate, flat_hit_rate=flat.hit_rate,
        candidate_ttft_p99=candidate.ttft_p99, flat_ttft_p99=flat.ttft_p99,
        candidate_capacity=candidate.capacity, flat_capacity=flat.capacity,
        margin=config.margin, active_keys=len({q.key for q in reqs}),
    )


def replay_side(requests: Sequence[Request], qps: float, config: ShadowConfig, plan: Plan | None) -> Replay:
    """Matched-load run plus ascending scaled runs, stopping at the first SLO miss."""
    points: list[tuple[float, float]] = []
    matched = None
    for scale in sorted(config.load_scales):
        res = _run(scaled(requests, scale), config, plan)
        p99 = res.metrics.ttft_p99
        points.append((qps * scale, p99))
        if scale == 1.0:
            matched = res
        if p99 > config.slo_p99 and scale >= 1.0:
            break
    if matched is None:   # every scale below 1 missed the SLO: still measure matched load
        matched = _run(list(requests), config, plan)
    cap = slo_capacity(points, config.slo_p99)
    return Replay(matched.metrics.hit_rate, matched.metrics.ttft_p99, cap.capacity, cap.censored, tuple(points))


def _run(requests: list[Request], config: ShadowConfig, plan: Plan | None):
    end = requests[-1].arrival + 1e-9
    sim = SimConfig(config.profile, config.replicas, kv_blocks=config.kv_blocks, warmup=end * config.warmup_share, end=end,
                    drain_limit=config.drain_limit, q_cap=plan.q_cap if plan is not None else None,
                    plan_fn=_keep_plan)
    if plan is None:
        policy = make_policy("flat", config.replicas, seed=config.seed)
    else:
        policy = make_policy("cacheroute", config.replicas, seed=config.seed, cold=config.cold,
                             balance_factor=config.balance_factor, cold_home=config.cold_home)
        policy.set_plan(plan)
    return Simulator(sim, policy, requests).run()


def _keep_plan(**_: object) -> None:
    """plan_fn that never re-plans: the candidate stays fixed for the whole replay."""
    return None
