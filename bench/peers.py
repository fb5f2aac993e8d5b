"""CacheRoute side by side with the real SGLang Model Gateway (smg, sglang-router) and
vllm-router: same engines, same request list, open loop, one invocation per scale, workload
and tier (docs/peers.md).

    pip install -e '.[peers]'          # smg, sglang-router, vllm-router (prebuilt Rust binaries)
    .venv/bin/python bench/peers.py --scale bound --workload tenants --tier 4 --repeats 3
    .venv/bin/python bench/peers.py --scale sim --workload tenants
    .venv/bin/python bench/peers.py --scale llama --workload tenants
    .venv/bin/python bench/peers.py --smoke          # CI: smg, sglang, cacheroute; a tier of 2

For every router, every offered rate on the grid and every repeat, from cold: start R engine
replicas (OpenAI HTTP), start a tier of N router instances in front of them
(bench/peers_routers.py), replay the request list for that rate open loop over the
instances, round robin (clients.openloop.Rotation, as a Kubernetes Service spreads
connections), stop everything. Nothing is carried from one point to the next, so no router
inherits another's caches. Repeat r uses workload seed `--seed` + r.

Scales (chosen once, never tuned per router):

  bound   where routing decides the outcome (SPEC section 5): 4 simulated 70B replicas slowed
          by their time scale so the cluster's knee is at 20-60 req/s, KV sized so the tenants'
          working set is about twice the cluster's cache; the arithmetic is at BOUND below
  sim     8 simulated 8B replicas at their natural speed (the first rounds' regime, where the
          2-core machine saturates before the engines); kept as the second table
  llama   2 real llama.cpp replicas (SmolLM2-135M)
  smoke   CI: 2 simulated replicas, a few seconds

Workloads (clients/textload.py): (a) tenants, (b) whales, (c) mooncake, (d) drift (tenant
popularity ranks rotate every 60 s), (e) restart (the tenants traffic; each router instance
restarted in turn, 20 s apart, mid-run), (f) kill (one instance killed and not restarted; the
client spreads over the survivors from then on). (e) and (f) need a tier of 2 or more.

Figures per point (measured window: requests scheduled after the warm-up): TTFT p50/p99 from
the stream, hit rate = sum cached_tokens / sum prompt_tokens from `usage`, each replica's
share of requests (the engine's `x-engine-replica` response header, which the peers pass
through; CacheRoute's `x-cacheroute-replica`; engine-side counters otherwise), the miss
accounting (bench/peers_misses.py: reusable tokens missed on first sight, first-on-replica,
evicted, spilled, and the infinite-cache bound), errors, router CPU per request (/proc utime +
stime of every instance's process tree over the window; CacheRoute's control plane apart) and
as a share of one core, the client's own schedule lag; for (d)-(f) the hit rate in 10 s bins
over the whole run and the worst dip after an event. With `--repeats R` the headline figures
are the median over the repeats with their min-max spread, the SLO capacity per repeat too.
SLO capacity = the highest grid rate whose p99 TTFT meets the SLO with no errors
(services.core.metrics.slo_capacity, censoring marked; in (f) requests lost in flight at the
kill are counted apart). Results go to --out as JSON, a markdown table to stdout (and
--table), PNGs of p99 TTFT vs rate (--plot) and of the hit-rate series (--series-plot).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from clients import textload  # noqa: E402
from clients.openloop import Outcome, Rotation, replay  # noqa: E402
from peers_misses import Served, account, paired_dip, prompt_shape, time_series, worst_dip  # noqa: E402
from peers_procs import engine_hits, scrape, served_requests, start_engines  # noqa: E402
from peers_report import (SERIES_WORKLOADS, aggregate, capacity, fmt_ms, percentile, plot, plot_series,  # noqa: E402
                          point_failed, table)
from peers_routers import EXTRA_ROUTERS, PEER_DISTS, ROUTERS, Router, peer_version, start_router  # noqa: E402

PATH = "/v1/chat/completions"
DRAIN_S = 1.0      # (e): between taking an instance out of the rotation and stopping it (a preStop sleep)


# ------------------------------------------------------------------ the experiment's parameters

@dataclass(frozen=True)
class Scale:
    """One scale's fixed parameters (chosen once, docs/peers.md says why)."""

    name: str
    engine: str                  # "sim" (services.engine --http-port) or "llama" (xllamacpp)
    replicas: int
    warmup: float                # seconds of each point before the measured window
    duration: float              # seconds of traffic per point (warm-up included)
    grids: dict[str, tuple[float, ...]]
    slo: dict[str, float]        # p99 TTFT SLO per workload, seconds
    workload_knobs: dict[str, dict[str, Any]]
    key_tokens: int              # CacheRoute's --key-tokens: two trace blocks' worth of words
    timeout: float = 120.0       # per request
    profile: str = "llama3-8b-h100"     # simulated engines' profile (services.core.engine.PROFILES)
    time_scale: float = 1.0             # their wall seconds per model second
    kv_blocks: int | None = None        # their KV pool (16-token blocks); None: the profile's
    long: dict[str, tuple[float, float]] = field(default_factory=dict)   # workload -> (duration, warm-up)
    restart_at: float = 60.0            # (e): instance i restarted at restart_at + i * restart_gap
    restart_gap: float = 20.0
    kill_at: float = 90.0               # (f): the last instance killed then
    bin_s: float = 10.0                 # hit-rate series bins
    llama_threads: int = 1
    llama_slots: int = 4
    llama_ctx: int = 8192        # total over the slots

    def timing(self, workload: str) -> tuple[float, float]:
        """(duration, warm-up) of a point of `workload`."""
        return self.long.get(workload, (self.duration, self.warmup))


SIM = Scale(
    name="sim", engine="sim", replicas=8, warmup=20.0, duration=60.0,
    grids={"tenants": (25.0, 50.0, 100.0, 150.0, 200.0), "whales": (25.0, 50.0, 100.0, 150.0, 200.0),
           "mooncake": (2.0, 4.0, 8.0, 16.0)},
    # mooncake: about twice the idle TTFT of the trace's 99th-percentile prompt (91.6k tokens, ~7 s
    # on the 8B profile); the first runs' 5 s, set from the mean prompt, was below every router's floor
    slo={"tenants": 0.5, "whales": 0.5, "mooncake": 15.0},
    workload_knobs={
        "tenants": {"tenants": 400},
        "whales": {"tenants": 400, "whales": 2, "whale_share": 0.6},
        "mooncake": {"block_words": 512},
    },
    key_tokens=1024,
)

# The engine-bound regime, chosen once from the engine model's arithmetic (SPEC section 4,
# profile llama3-70b-fp8-h100x2: t0 1.5 ms, t_w 16 ms, a 78 us/token, b 2.9 ns/q.k pair):
#
# - Prompts: 128 tenants, system prompts log-uniform on [1,024, 4,096] words (mean
#   (4096 - 1024) / ln 4 = 2,216 tokens), user turns ~48 tokens, 8 output tokens. A cold
#   mean prompt's idle TTFT is t0 + a*2216 + b*2216^2/2 = 1.5 + 173 + 7 = 181 ms (model time);
#   the longest (4,224 tokens) 357 ms.
# - KV: 2,200 blocks x 16 = 35.2k tokens a replica, 140.8k for the 4; the tenants' working
#   set 128 x 2,216 = 284k tokens = 2.0x the cluster's cache (the brief: 1.5-3x). One replica
#   holds ~16 tenants' prompts of the 32 a replica gets with one home per tenant: homes keep
#   the hot half of each replica's tenants warm (the skew puts most requests there), spreading
#   every tenant over every replica cannot keep any of them warm for long.
# - Knee: prefill runs at 1/a = 12.8k tokens per model second a replica (a*N dominates t_w
#   from 205 tokens a step). A request costs (1 - h) * 2,216 + ~60 tokens: ~390 at the 85%
#   hit of one home per tenant (saturation ~33 req/s a replica, 130 for 4), ~1,190 at the
#   49% of round robin (~43 for 4). The p99 knee sits well below saturation (bursts of cold
#   prompts queue behind each other): bench/peers_knee.py drives these engines and this
#   workload in model time with two idealised routers: tenants on fixed homes (LPT) pass the
#   1 model-second SLO at 50 model req/s (p99 0.81 s) and fail at 60 (1.25 s); round robin
#   passes at 20 (0.76 s) and fails at 30 (1.56 s). Time scale 2.0 puts those knees at ~27
#   and ~12 req/s wall: the cluster's knee is inside 20-60 req/s, where every router needs a
#   fraction of a core, and routing alone moves it by 2x.
# - SLO: 1.0 model second on p99 TTFT (5.5x the mean cold prompt's idle TTFT, 2.8x the
#   longest's) = 2.0 s wall at time scale 2.0. Mooncake: 64 words a 512-token block (prompts
#   ~1/8 of the trace's), prompts over 8,192 words dropped (the KV pool must hold one);
#   SLO 2.0 model s = 4 s wall, 2.7x the idle TTFT of an 8,192-token prompt (0.74 s).
# - Whales: 2 whale tenants with 30% of the requests each: from 24 req/s on a whale is 7.2
#   req/s wall = 14.4 model req/s, above one replica's knee (~55 / 4 = 14): it needs copies.
# - Drift rotates the ranks by 32 (a quarter of the tenants) every 60 s: the new hot set was
#   lukewarm, the old hot tenants become the coldest. Restart / kill as the module header.
BOUND_TENANTS = {"tenants": 128}
BOUND = Scale(
    name="bound", engine="sim", replicas=4, warmup=30.0, duration=90.0,
    profile="llama3-70b-fp8-h100x2", time_scale=2.0, kv_blocks=2200,
    grids={"tenants": (8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0),
           "whales": (8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0),
           "mooncake": (4.0, 6.0, 8.0, 10.0, 12.0, 16.0),
           "drift": (16.0, 24.0), "restart": (16.0, 24.0), "kill": (16.0, 24.0)},
    slo={"tenants": 2.0, "whales": 2.0, "mooncake": 4.0, "drift": 2.0, "restart": 2.0, "kill": 2.0},
    workload_knobs={
        "tenants": BOUND_TENANTS,
        "whales": {**BOUND_TENANTS, "whales": 2, "whale_share": 0.6},
        "mooncake": {"block_words": 64, "max_words": 8192},
        "drift": {**BOUND_TENANTS, "drift_period": 60.0, "drift_shift": 32},
        "restart": BOUND_TENANTS,
        "kill": BOUND_TENANTS,
    },
    key_tokens=128,
    long={"drift": (180.0, 30.0), "restart": (180.0, 30.0), "kill": (180.0, 30.0)},
)

LLAMA = Scale(
    # the first round (a starved machine, 0.2 / 0.4 req/s over 60 s) measured 12-13 requests a point
    name="llama", engine="llama", replicas=2, warmup=25.0, duration=75.0,
    grids={"tenants": (0.5, 1.0), "whales": (0.5, 1.0), "mooncake": (0.5, 1.0)},
    slo={"tenants": 20.0, "whales": 20.0, "mooncake": 20.0},
    workload_knobs={
        "tenants": {"tenants": 4, "system_words": textload.WordRange(48, 128),
                    "user_words": textload.WordRange(4, 12, 8, 0.5), "max_tokens": 2},
        "whales": {"tenants": 4, "whales": 1, "whale_share": 0.5, "system_words": textload.WordRange(48, 128),
                   "user_words": textload.WordRange(4, 12, 8, 0.5), "max_tokens": 2},
        "mooncake": {"block_words": 32, "max_words": 256, "max_tokens": 2},
    },
    key_tokens=32, llama_slots=2, llama_ctx=2048,
)

# CI: a tier of 2 on 2 simulated engines; restart restarts instance 1 at 2 s, kill kills instance 2 at 3 s
SMOKE = Scale(
    name="smoke", engine="sim", replicas=2, warmup=1.5, duration=5.0,
    grids={"tenants": (10.0,), "restart": (10.0,), "kill": (10.0,)},
    slo={"tenants": 0.5, "restart": 0.5, "kill": 0.5},
    workload_knobs={"tenants": {"tenants": 20}, "restart": {"tenants": 20}, "kill": {"tenants": 20}},
    key_tokens=1024, timeout=30.0, restart_at=2.0, restart_gap=60.0, kill_at=3.0, bin_s=1.0,
)
SMOKE_ROUTERS = ("cacheroute", "smg-ca", "sglang-ca")

SCALES = {"bound": BOUND, "sim": SIM, "llama": LLAMA, "smoke": SMOKE}


def make_workload(scale: Scale, workload: str, qps: float, seed: int) -> textload.TextWorkload:
    knobs = dict(scale.workload_knobs[workload])
    duration, _ = scale.timing(workload)
    if workload in ("tenants", "whales", "drift", "restart", "kill"):
        name = workload if workload in ("restart", "kill") else ""
        return textload.tenants(qps=qps, duration=duration, seed=seed, name=name, **knobs)
    if workload == "mooncake":
        path = _mooncake_path()
        with open(path, "rb") as fh:
            rows = textload.read_mooncake(fh, path)
        return textload.mooncake(rows, qps=qps, duration=duration, seed=seed, **knobs)
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(textload.WORKLOADS)}")


def _mooncake_path() -> str:
    """The trace under the shared data folder named by $CACHEROUTE_DATA (no other place is guessed)."""
    name = "mooncake/conversation_trace.first_half.jsonl"
    data = os.environ.get("CACHEROUTE_DATA")
    if data and (Path(data) / name).is_file():
        return str(Path(data) / name)
    raise ValueError(f"cannot find {name}: set CACHEROUTE_DATA to the data folder that holds it"
                     + (f" (not under {data})" if data else ""))


def event_times(scale: Scale, workload: str, tier: int) -> list[tuple[float, str, int]]:
    """(offset s, "restart" / "kill" / "rotate", instance) the point schedules for `workload`
    (those inside the run only)."""
    duration, _ = scale.timing(workload)
    if workload == "restart":
        out = [(scale.restart_at + i * scale.restart_gap, "restart", i) for i in range(tier)]
    elif workload == "kill":
        out = [(scale.kill_at, "kill", tier - 1)]
    elif workload == "drift":
        period = scale.workload_knobs["drift"]["drift_period"]
        out = [(period * k, "rotate", -1) for k in range(1, int(duration // period) + 1)]
    else:
        out = []
    return [e for e in out if e[0] < duration]


# ------------------------------------------------------------------ one point

def summarize(outcomes: Sequence[Outcome], warmup: float, *, router: Router, kind: str, max_tokens: int,
              counters: tuple[list, list], cpu: tuple[float, float], control_cpu: tuple[float, float],
              window: float, replicas: list[str]) -> dict:
    measured = [o for o in outcomes if o.at >= warmup]
    ok = [o for o in measured if o.ok]
    ttfts = [o.ttft for o in ok]
    prompt = sum(o.prompt_tokens for o in ok)
    cached = sum(o.cached_tokens for o in ok)
    n = len(measured)
    if any(o.engine or o.replica for o in measured):
        counts = {r: 0.0 for r in replicas}
        for o in measured:
            if o.engine or o.replica:
                who = o.engine or o.replica
                counts[who] = counts.get(who, 0.0) + 1
        share_source = "engine header" if any(o.engine for o in measured) else "router header"
    else:
        before, after = counters
        counts = {r: served_requests(kind, b, a, max_tokens) for r, b, a in zip(replicas, before, after)}
        share_source = "engine counters"
    total = sum(counts.values()) or 1.0
    shares = {r: c / total for r, c in counts.items()}
    e_cached = e_prompt = 0.0
    for b, a in zip(*counters):
        c, p = engine_hits(kind, b, a)
        e_cached, e_prompt = e_cached + c, e_prompt + p
    errors: dict[str, int] = {}
    for o in measured:
        if not o.ok:
            key = (f"HTTP {o.status}: " if o.status and o.status != 200 else "") + (o.error or "no content")[:120]
            errors[key] = errors.get(key, 0) + 1
    mean_share = 1.0 / len(shares) if shares else 0.0
    reasons: dict[str, int] = {}
    for o in measured:
        if o.reason:
            reasons[o.reason] = reasons.get(o.reason, 0) + 1
    router_cpu = cpu[1] - cpu[0]
    return {
        "requests": n, "ok": len(ok), "errors": n - len(ok),
        "error_kinds": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
        "hit_rate": cached / prompt if prompt else 0.0,
        "engine_hit_rate": e_cached / e_prompt if e_prompt else None,
        "mean_prompt_tokens": prompt / len(ok) if ok else 0.0,
        "shares": shares, "share_source": share_source, "reasons": reasons,
        "max_share": max(shares.values()) if shares else None,
        "imbalance": max(shares.values()) / mean_share if shares and mean_share else None,
        "router_cpu_s": router_cpu,
        "router_cpu_per_1k": router_cpu / n * 1000 if n else None,
        "router_core_share": router_cpu / window if window > 0 else None,
        "control_cpu_per_1k": (control_cpu[1] - control_cpu[0]) / n * 1000 if n and router.control_pids else None,
        "window_s": window,
        "client_lag_p99": percentile([o.lag for o in measured], 99),
        "notes": list(router.notes),
    }


def served_of(outcomes: Sequence[Outcome]) -> list[Served]:
    return [Served(o.at, o.ok, o.prompt_tokens, o.cached_tokens, o.engine or o.replica, o.reason) for o in outcomes]


async def run_point(router_name: str, scale: Scale, workload: str, qps: float, seed: int, log_root: Path,
                    progress: bool = True, tier: int = 1, events_off: bool = False) -> dict:
    """One router at one rate, from cold; `events_off` replays the same request list without the
    workload's router restarts or kills (the paired control of --control)."""
    wl = make_workload(scale, workload, qps, seed)
    duration, warmup = scale.timing(workload)
    max_tokens = wl.requests[0].max_tokens if wl.requests else 1
    tier = 1 if router_name == "direct" else tier
    planned = event_times(scale, workload, tier) if router_name != "direct" else []   # no router to restart
    if events_off:
        planned = [e for e in planned if e[1] == "rotate"]
    if any(kind != "rotate" for _, kind, _ in planned) and tier < 2:
        raise ValueError(f"workload {workload} needs a tier of 2 or more router instances (--tier)")
    log_dir = Path(tempfile.mkdtemp(prefix=f"{router_name}-{workload}-{qps:g}-", dir=log_root))
    engines = await start_engines(scale, log_dir)
    router = None
    try:
        model = await engines.model_id()
        schedule = [(q.rid, q.at, q.body(model)) for q in wl.requests]     # rendered before the clock starts
        router = await start_router(router_name, scale, engines, log_dir, tier=tier)
        rotation = Rotation(router.urls)
        loop = asyncio.get_running_loop()
        snaps: dict[str, Any] = {}

        async def snapshot(tag: str) -> None:
            snaps[tag] = (await engines.counters(), (router.cpu(), router.control_cpu()), time.monotonic())

        await snapshot("start")
        warm_task = None
        if router.on_warm is not None:
            async def warm() -> None:
                await asyncio.sleep(warmup / 2)
                await router.on_warm()
            warm_task = asyncio.create_task(warm())
        pending: list[asyncio.Task] = []

        def mark() -> None:
            pending.append(loop.create_task(snapshot("warm")))

        done_events: list[dict] = []

        def restart(i: int, t: float):
            async def go() -> None:
                rotation.remove(i)       # the Service takes the endpoint out before the pod stops,
                await asyncio.sleep(DRAIN_S)   # and a preStop pause lets sends already under way land
                url = await router.restart(i)
                rotation.restore(i, url)
                done_events.append({"t": t, "kind": "restart", "instance": i, **router.events[-1]})
            return go

        def kill(i: int, t: float):
            def go() -> None:
                rotation.remove(i)
                router.kill(i)
                done_events.append({"t": t, "kind": "kill", "instance": i})
            return go

        events = [(t, restart(i, t) if kind == "restart" else kill(i, t)) for t, kind, i in planned
                  if kind in ("restart", "kill")]
        label = f"{workload} {router_name} x{tier} {qps:g} req/s"
        started = time.monotonic()
        tty = sys.stderr.isatty()
        last = [0.0]

        def show(sent: int, done: int) -> None:
            now = time.monotonic()
            if not progress or (not tty and now - last[0] < 10.0):
                return
            last[0] = now
            lead = "\r" if tty else ""
            print(f"{lead}  {label}: {sent}/{len(schedule)} sent, {done} done, {now - started:4.0f}s",
                  end="" if tty else "\n", file=sys.stderr, flush=True)

        outcomes = await replay(rotation, schedule, timeout=scale.timeout, progress=show,
                                at_offset=(warmup, mark), events=events, path=PATH)
        if progress and tty:
            print(file=sys.stderr)
        await asyncio.gather(*pending)
        if warm_task is not None:
            with contextlib.suppress(Exception):
                await warm_task
        await snapshot("end")
        for url in router.metrics_urls:
            # how the peer decided (e.g. vllm-router's prefix_routing_decisions outcomes), for the reading
            own = await scrape(url)
            picked = {k: v for k, v in own.items() if any(w in k for w in ("decision", "policy", "selection", "prefix"))
                      and not k.endswith(("_bucket", "_created")) and v}
            router.notes.extend(f"{k} {v:g}" for k, v in sorted(picked.items())[:20])
            break   # the first instance's counters are enough for the reading
        (c0, cpu0, t0), (c1, cpu1, t1) = snaps["warm"], snaps["end"]
        replicas = [f"engine-{i}" for i in range(1, scale.replicas + 1)]
        if router_name == "direct":
            replicas = replicas[:1]
            c0, c1 = c0[:1], c1[:1]
        out = summarize(outcomes, warmup, router=router, kind=engines.kind, max_tokens=max_tokens,
                        counters=(c0, c1), cpu=(cpu0[0], cpu1[0]), control_cpu=(cpu0[1], cpu1[1]),
                        window=t1 - t0, replicas=replicas)
        served = served_of(outcomes)
        shapes = [prompt_shape(q.group, q.messages()) for q in wl.requests]
        out["misses"] = account(shapes, served, warmup) if engines.kind == "sim" else {"prompt_tokens": 0}
        out["events"] = sorted(done_events + [{"t": t, "kind": k} for t, k, _ in planned if k == "rotate"],
                               key=lambda e: e["t"])
        kills = [e for e in done_events if e["kind"] == "kill"]
        lost = sum(1 for o in outcomes if o.at >= warmup and not o.ok and any(
            o.target == e["instance"] and o.at <= e["t"] for e in kills))
        out["slo_errors"] = out["errors"] - lost
        if workload in SERIES_WORKLOADS:
            out["series"] = time_series(served, scale.bin_s, end=duration)
            out["worst_dip"] = worst_dip(out["series"], [e["t"] for e in out["events"]], bin_s=scale.bin_s)
        out.update({"router": router_name, "tier": tier, "workload": workload, "qps": qps, "scale": scale.name,
                    "seed": seed, "offered": len(schedule), "logs": str(log_dir)})
        return out
    finally:
        if router is not None:
            router.stop()
        engines.stop()


# ------------------------------------------------------------------ sweep

def broken_point(router: str, qps: float, exc: Exception) -> dict:
    return {"router": router, "qps": qps, "requests": 0, "ok": 0, "errors": 1, "slo_errors": 1,
            "error_kinds": {str(exc)[:200]: 1}, "ttft_p50": math.nan, "ttft_p99": math.inf,
            "hit_rate": 0.0, "engine_hit_rate": None, "shares": {}, "router_cpu_per_1k": None,
            "control_cpu_per_1k": None, "client_lag_p99": math.nan, "imbalance": None}


async def attempt(router: str, scale: Scale, workload: str, qps: float, seed: int, log_root: Path,
                  progress: bool, tier: int, events_off: bool = False) -> dict:
    """run_point, once more after an unexpected failure (e.g. a port taken between choosing it and
    binding it); a second failure becomes a broken point so one point never loses the sweep."""
    t = time.monotonic()
    extra = {"events_off": True} if events_off else {}
    try:
        try:
            p = await run_point(router, scale, workload, qps, seed, log_root, progress, tier=tier, **extra)
        except ValueError:
            raise
        except Exception as exc:
            print(f"  {workload} {router} {qps:g} req/s failed ({str(exc).splitlines()[0][:160]}); "
                  f"running it again", file=sys.stderr)
            p = await run_point(router, scale, workload, qps, seed, log_root, progress, tier=tier, **extra)
    except ValueError:
        raise
    except Exception as exc:
        print(f"  {workload} {router} {qps:g} req/s failed: {exc}", file=sys.stderr)
        p = broken_point(router, qps, exc)
    p["wall_s"] = time.monotonic() - t
    return p


def add_control(p: dict, c: dict, scale: Scale) -> None:
    """Attach the paired control run `c` (same request list, no router events) to the point `p`."""
    p["control"] = {k: c.get(k) for k in ("hit_rate", "ttft_p99", "errors", "requests", "series")}
    if p.get("series") and c.get("series"):
        _, warmup = scale.timing(p["workload"])
        pd = paired_dip(p["series"], c["series"], [e["t"] for e in p.get("events", ()) if e["kind"] != "rotate"],
                        bin_s=scale.bin_s, start=warmup)
        if pd is not None:
            p["paired_dip"], p["paired_floor"], p["paired_mean"] = pd["dip"], pd["floor"], pd["mean"]


async def sweep(scale: Scale, workload: str, routers: Sequence[str], grid: Sequence[float], seed: int,
                log_root: Path, progress: bool = True, past_knee: int | None = None, tier: int = 1,
                repeats: int = 1, control: bool = False, null_pair: bool = False) -> dict:
    """Every router over the grid, `repeats` times a point; with `past_knee` N, a router's sweep
    stops N points after its first point that fails the SLO (the capacity is decided there;
    the skipped rates are listed); with `control`, each (e) / (f) point is run a second time on
    the same request list without its router events, and the bins' paired difference is the
    events' cost (`paired_dip`, against the two runs' noise before the first event, `paired_floor`;
    `paired_mean` over the events' bins); `null_pair` runs the point itself without its events too
    but scores it at the events' times: the same figures for two controls, the method's own noise."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    duration, warmup = scale.timing(workload)
    result: dict[str, Any] = {
        "scale": scale.name, "workload": workload, "replicas": scale.replicas, "grid": list(grid),
        "tier": tier, "repeats": repeats, "null_pair": null_pair,
        "slo": scale.slo[workload], "seed": seed, "warmup": warmup, "duration": duration,
        "scale_params": {k: (v if not isinstance(v, dict) else {kk: str(vv) for kk, vv in v.items()})
                         for k, v in asdict(scale).items() if k not in ("grids", "slo", "workload_knobs")},
        "workload_knobs": {k: str(v) for k, v in scale.workload_knobs[workload].items()},
        "versions": {d: peer_version(d) for d in PEER_DISTS},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0]},
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "points": {}, "capacity": {}, "skipped": {},
    }
    for router in routers:
        points: list[dict] = []
        for qps in sorted(grid):
            failed = [q for q in points if point_failed(q, result["slo"])]
            if past_knee is not None and failed and len(points) - points.index(failed[0]) > past_knee:
                result["skipped"].setdefault(router, []).append(qps)
                continue
            reps = []
            for r in range(repeats):
                p = await attempt(router, scale, workload, qps, seed + r, log_root, progress, tier, events_off=null_pair)
                if null_pair:          # scored at the times the events would have been
                    p["events"] = [{"t": t, "kind": k, "instance": i, "null": True}
                                   for t, k, i in event_times(scale, workload, tier) if k != "rotate"]
                if control and router != "direct" and any(k != "rotate" for _, k, _ in event_times(scale, workload, tier)):
                    add_control(p, await attempt(router, scale, workload, qps, seed + r, log_root, progress, tier,
                                                 events_off=True), scale)
                reps.append(p)
                if progress:
                    print(f"  {workload} {router} x{tier} {qps:g} req/s (repeat {r + 1}/{repeats}): "
                          f"p99 {fmt_ms(p['ttft_p99'])}, hit {p['hit_rate']:.1%}, "
                          f"errors {p['errors']}/{p['requests']}, {p['wall_s']:.0f}s", file=sys.stderr)
            points.append(aggregate(reps))
        result["points"][router] = points
        result["capacity"][router] = capacity(points, result["slo"])
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    return result


def merge(old: dict, new: dict) -> dict:
    """`old` with the points of `new` merged in (same scale, workload, SLO and tier): a router's
    point at a rate `new` ran replaces the old one, its other points stay; routers in ROUTERS order."""
    for key in ("scale", "workload", "slo"):
        if old.get(key) != new.get(key):
            raise SystemExit(f"peers: cannot merge: {key} {old.get(key)!r} != {new.get(key)!r}")
    if old.get("tier", 1) != new.get("tier", 1):
        raise SystemExit(f"peers: cannot merge: tier {old.get('tier', 1)} != {new.get('tier', 1)}")
    points = dict(old["points"])
    for router, fresh in new["points"].items():
        rates = {p["qps"] for p in fresh}
        points[router] = sorted([p for p in points.get(router, []) if p["qps"] not in rates] + fresh,
                                key=lambda p: p["qps"])
    out = dict(old)
    out["points"] = {r: points[r] for r in ROUTERS + EXTRA_ROUTERS if r in points}
    out["capacity"] = {r: capacity(p, out["slo"]) for r, p in out["points"].items()}
    skipped = {**old.get("skipped", {}), **{r: [] for r in new["points"]}, **new.get("skipped", {})}
    out["skipped"] = {r: [q for q in qs if q not in {p["qps"] for p in out["points"][r]}]
                      for r, qs in skipped.items() if qs and r in out["points"]}
    out["grid"] = sorted({p["qps"] for pts in out["points"].values() for p in pts})
    out.setdefault("runs", [{"started": old.get("started"), "routers": list(old["points"])}])
    out["runs"].append({"started": new["started"], "routers": list(new["points"]), "machine": new["machine"]})
    return out


def write_outputs(result: dict, args: argparse.Namespace) -> None:
    text = table(result)
    print(text)
    if args.out and not args.from_json:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    if args.table:
        Path(args.table).write_text(text + "\n")
    if args.plot:
        plot(result, args.plot)
    if args.series_plot:
        plot_series(result, args.series_plot)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="sim")
    parser.add_argument("--workload", choices=textload.WORKLOADS, default="tenants")
    parser.add_argument("--routers", default="",
                        help=f"comma-separated, from {', '.join(ROUTERS + EXTRA_ROUTERS)} (default: {', '.join(ROUTERS)}; "
                             f"--smoke: {', '.join(SMOKE_ROUTERS)})")
    parser.add_argument("--tier", type=int, default=0, metavar="N",
                        help="router instances per side, requests round robin over them (default 1; --smoke 2)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per point (seeds --seed, --seed + 1, ...)")
    parser.add_argument("--grid", default="", help="comma-separated req/s (default: the scale's grid)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="", help="write the JSON result here")
    parser.add_argument("--table", default="", help="write the markdown table here")
    parser.add_argument("--plot", default="", help="write the p99 TTFT vs rate PNG here")
    parser.add_argument("--series-plot", default="", help="write the hit-rate time series PNG here ((d)-(f))")
    parser.add_argument("--logs", default="", help="keep per-point logs here (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"CI smoke: 2 simulated engines, {', '.join(SMOKE_ROUTERS)} as tiers of 2, 5 s at 10 req/s")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="override the scale's seconds per point (for trying things; docs use the defaults)")
    parser.add_argument("--warmup", type=float, default=-1.0, help="override the scale's warm-up seconds")
    parser.add_argument("--from-json", default="", metavar="PATH",
                        help="run nothing: print the table of a stored result (and --table/--plot it)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other routers' points already in --out (re-running some routers)")
    parser.add_argument("--past-knee", type=int, default=1, metavar="N",
                        help="stop a router's sweep N points after its first SLO failure (-1: run every point)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--control", action="store_true",
                        help="(e), (f): also run each point without its restarts / kill on the same request list, "
                             "and report the paired dip")
    parser.add_argument("--null-pair", action="store_true",
                        help="with --control: run the point itself without its events too, scored at their times "
                             "(two controls: the paired dip's own noise, a null test)")
    args = parser.parse_args(argv)
    if args.from_json:
        write_outputs(json.loads(Path(args.from_json).read_text()), args)
        return 0
    scale = SMOKE if args.smoke else SCALES[args.scale]
    workload = args.workload if not args.smoke or args.workload in SMOKE.grids else "tenants"
    if args.duration > 0 or args.warmup >= 0:
        d, w = scale.timing(workload)
        d = args.duration if args.duration > 0 else d
        w = args.warmup if args.warmup >= 0 else w
        scale = replace(scale, duration=d, warmup=w, long={**scale.long, workload: (d, w)})
    routers = [r for r in args.routers.split(",") if r] or list(SMOKE_ROUTERS if args.smoke else ROUTERS)
    for r in routers:
        if r not in ROUTERS + EXTRA_ROUTERS:
            parser.error(f"unknown router {r!r}; choose from {', '.join(ROUTERS + EXTRA_ROUTERS)}")
    tier = args.tier or (2 if args.smoke else 1)
    if tier < 1:
        parser.error("--tier must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if workload in ("restart", "kill") and tier < 2:
        parser.error(f"workload {workload} needs --tier 2 or more")
    if args.null_pair and not args.control:
        parser.error("--null-pair needs --control")
    if workload not in scale.grids:
        parser.error(f"scale {scale.name} has no {workload} grid (it has {', '.join(scale.grids)})")
    grid = [float(x) for x in args.grid.split(",") if x] if args.grid else list(scale.grids[workload])
    log_root = Path(args.logs or tempfile.mkdtemp(prefix="peers-"))
    log_root.mkdir(parents=True, exist_ok=True)
    duration, warmup = scale.timing(workload)
    if not args.quiet:
        print(f"peers: {scale.name} scale, {workload}, routers {', '.join(routers)} (tier {tier}), grid {grid}, "
              f"{args.repeats} repeat(s), {duration:g}s per point ({warmup:g}s warm-up); logs in {log_root}",
              file=sys.stderr)
    result = asyncio.run(sweep(scale, workload, routers, grid, args.seed, log_root, progress=not args.quiet,
                               past_knee=None if args.past_knee < 0 else args.past_knee, tier=tier,
                               repeats=args.repeats, control=args.control, null_pair=args.null_pair))
    if args.merge and args.out and Path(args.out).is_file():
        result = merge(json.loads(Path(args.out).read_text()), result)
    write_outputs(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
