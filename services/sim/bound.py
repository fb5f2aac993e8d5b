"""A capacity ceiling no router can pass: the engine work a workload needs, at best.

Every engine step of the model (services.core.engine, SPEC section 4) lasts
    T = t0 + max(t_w, a*N) + b * sum_prefill(n_i*c_i + n_i^2/2) + d * K_dec,
and each term is at least the sum of per-request parts: a request with prompt P, output O and
c prompt tokens hit in the cache computes u = P - c prompt tokens and O - 1 decode tokens
(the first output token ends its prefill), so it adds
    a * (u + O - 1)                       to the a*N terms (max(t_w, a*N) >= a*N),
    b * (u*c + u^2/2)                     over its prefill chunks (chunking leaves the sum as is:
                                          sum n_i*(c + earlier chunks) + n_i^2/2 = u*c + u^2/2),
    d * ((O-1)*P + (O-1)*(O-2)/2)         over its decode steps (prior context P, P+1, ...).
t0, the t_w floor and preemptions (recomputed tokens) only add. The part is smallest when c is
the most any cache could hit (services.core.traces.ideal_hits: one infinite cache that has seen
every earlier request), since it falls as c grows (the b part is b*(P^2 - c^2)/2). So the summed
work of the requests arriving in a window, divided by replicas x window, is a lower bound on the
mean engine utilization any routing policy needs; above 1 the offered rate exceeds what the
replicas can serve in steady state, whatever routes it, and every queue grows.

Used by docs/experiments.md ("Hold at the dispatcher") to say which capacity goals the flagship's
engine work leaves reachable (experiments/work_bound.py prints it per QPS).
"""

from __future__ import annotations

from typing import Sequence

from services.core.engine import EngineProfile
from services.core.request import Request
from services.core.traces import ideal_hits


def request_work(profile: EngineProfile, prompt: int, output: int, cached: int) -> float:
    """Least engine seconds one request adds to the steps that serve it (module header)."""
    if prompt < 1 or not 0 <= cached < prompt:
        raise ValueError(f"need prompt >= 1 and 0 <= cached < prompt, got prompt={prompt}, cached={cached}")
    u, dec = prompt - cached, max(1, output) - 1
    return (profile.a * (u + dec) + profile.b * (u * cached + u * u / 2)
            + profile.d * (dec * prompt + dec * (dec - 1) / 2))


def utilization_bound(profile: EngineProfile, requests: Sequence[Request], replicas: int,
                      start: float, end: float, hits: Sequence[int] | None = None) -> float:
    """Least mean utilization of `replicas` engines that serves the requests arriving in
    [start, end) (requests in arrival order; `hits` per request, default the infinite-cache
    hits, which give the ceiling for any router)."""
    if replicas < 1 or not end > start:
        raise ValueError(f"need replicas >= 1 and end > start, got {replicas}, [{start}, {end})")
    hits = ideal_hits(requests) if hits is None else hits
    work = sum(request_work(profile, q.prompt_tokens, q.output_tokens, c)
               for q, c in zip(requests, hits) if start <= q.arrival < end)
    return work / (replicas * (end - start))
