"""Where the engine-bound scale's knee is, from the engine model alone (virtual time, no
processes): the check behind the arithmetic at BOUND in bench/peers.py.

    .venv/bin/python bench/peers_knee.py --router homes --rates 40,60,80,100
    .venv/bin/python bench/peers_knee.py --router rr --rates 20,40

The bound scale's engines (profile, KV blocks, replicas) and its tenants workload are driven
in model time (rates are model req/s: wall req/s = model req/s / the time scale), each replica
an EngineModel stepped until the next arrival. Two idealised routers bracket the real ones:
`homes` puts each tenant on one fixed replica (LPT over the request counts, known in
advance), `rr` sends request i to replica i mod R. Printed per rate: p50/p99 TTFT of the
requests after the first third of the run, the hit rate, preemptions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from clients import textload  # noqa: E402
from services.http import oai  # noqa: E402
from services.core import routing  # noqa: E402
from services.core.engine import EngineModel, get_profile  # noqa: E402
from services.core.request import Request  # noqa: E402


def run(scale, qps: float, router: str, seed: int = 1) -> dict:
    duration, warmup = scale.timing("tenants")
    wl = textload.tenants(qps=qps, duration=duration, seed=seed, **scale.workload_knobs["tenants"])
    prof = get_profile(scale.profile)
    R = scale.replicas
    engines = [EngineModel(prof, scale.kv_blocks) for _ in range(R)]
    clocks = [0.0] * R
    counts: dict[str, int] = {}
    for q in wl.requests:
        counts[q.group] = counts.get(q.group, 0) + 1
    load, home = [0] * R, {}
    for g, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        i = min(range(R), key=load.__getitem__)
        home[g], load[i] = i, load[i] + c
    ttft: dict[int, float] = {}
    arrival: dict[int, float] = {}

    def advance(i: int, t: float) -> None:
        e = engines[i]
        while not e.idle and clocks[i] < t:
            r = e.step(clocks[i])
            if r is None:
                break
            clocks[i] += r.duration
            for rid, _ in r.first_tokens:
                ttft[rid] = clocks[i] - arrival[rid]
        clocks[i] = max(clocks[i], t) if e.idle else clocks[i]

    for q in wl.requests:
        ids = routing.tokenize(oai.chat_text(q.messages()))
        i = home[q.group] if router == "homes" else q.rid % R
        for j in range(R):
            advance(j, q.at)
        arrival[q.rid] = q.at
        engines[i].add(Request(q.rid, q.at, q.group, len(ids), q.max_tokens, routing.prompt_hashes(ids)), q.at)
    for j in range(R):
        advance(j, float("inf"))
    late = [ttft[q.rid] for q in wl.requests if q.at >= duration / 3 and q.rid in ttft]
    cached = sum(e.cached_tokens for e in engines)
    prompt = sum(e.prompt_tokens for e in engines)
    return {"qps": qps, "p50": float(np.percentile(late, 50)), "p99": float(np.percentile(late, 99)),
            "hit": cached / prompt if prompt else 0.0, "preemptions": sum(e.preemptions for e in engines)}


def main(argv: list[str] | None = None) -> int:
    import peers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--router", choices=("homes", "rr"), default="homes")
    parser.add_argument("--rates", default="40,60,80,100", help="model req/s, comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    scale = peers.BOUND
    slo = scale.slo["tenants"] / scale.time_scale
    print(f"{scale.replicas} x {scale.profile}, {scale.kv_blocks} KV blocks, router {args.router}; "
          f"SLO {slo:g} model s (x{scale.time_scale:g} = {scale.slo['tenants']:g} s wall)")
    for qps in (float(x) for x in args.rates.split(",") if x):
        r = run(scale, qps, args.router, args.seed)
        print(f"  {qps:g} model req/s ({qps / scale.time_scale:g} wall): p50 {r['p50'] * 1000:.0f} ms, "
              f"p99 {r['p99'] * 1000:.0f} ms ({'passes' if r['p99'] <= slo else 'fails'}), hit {r['hit']:.1%}, "
              f"preemptions {r['preemptions']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
