"""The planner's shadow gate and automatic fallback (SPEC section 3, steps 2-4), live.

Gate. Before the control loop activates a candidate (and for BuildPlan with shadow=true), the
arrival log of the last `window_seconds` (the store's aggregate records: key, time, prompt and
prefix tokens; never content) is replayed through `services.sim.replay.shadow_replay` for the
candidate and for Flat-LB at matched load and on a few scaled loads. The candidate may go live
only if its p99 TTFT or SLO capacity is better by `margin` (hit rate alone never counts); the
report is stored on the plan version (Plan.shadow), so GetPlan / `cacheroute plans show` show it.

Observed figures for the fallback rule (`services.core.shadow.fallback_check` against the active
plan's report): active keys = distinct keys among the same latest `max_requests` records the
gate replays (so they compare like for like with ShadowReport.active_keys); p99 = the active
plan replayed on the current window at matched load. The engines report cache counters only
(prompt / cached tokens, requests), no latency, so a live TTFT p99 is not available to the
planner; the live hit rate from those counters is logged and shown in the loop outcome but never
decides anything. A repaired plan (builder "repair") is judged by the report of the plan it
repaired.

Mode rule (`guard`), one loop:
  no active plan            activate the candidate iff it passed;
  planned, inside range     activate iff it passed and the switching rule says switch;
  planned, outside range    activate a passing candidate (its report validates the new
                            traffic), else set the mode to flat, reason "auto-fallback: ...";
  flat set by the fallback  a passing candidate is activated and the mode returns to planned;
  flat set by an operator   left alone (candidates are still built, gated and stored).

The replay is CPU-heavy, so it runs in one spawned worker process (`ReplayWorker`): off the
event loop and off its GIL, so RPCs never wait for it; a replay that overruns `timeout` kills
the worker (a fresh one starts for the next job) and counts as a failed gate.

Knobs (GateConfig): enabled (off by default: the replay is only meaningful with the engines'
real profile, KV size and time scale), margin 0.10, window 120 s, profile / kv_blocks / time
scale of the engines, SLO p99 3.5 s, timeout 30 s, max_requests 2,000, load scales, the cold
tail the dispatchers use, and the fallback tolerances (services.core.shadow.FallbackConfig).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import multiprocessing
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from services.wire import codec
from services.core import shadow
from services.core.engine import get_profile
from services.core.plan import Plan, ShadowReport
from services.core.shadow import FallbackConfig, Observed, ShadowConfig, fallback_check
from services.model import DEFAULT_COLD_TAIL, ArrivalRecord, Mode
from services.rpc import kv
from services.sim import replay
from services.store import Store

log = logging.getLogger("cacheroute.planner.gate")

FALLBACK_TAG = "auto-fallback: "     # mode reasons the loop wrote itself (and may undo)
RETURN_TAG = "auto-return: "
UNBOUNDED = 1e9                       # stored for a p99 the replay could not bound (JSON has no inf)


@dataclass(frozen=True)
class GateConfig:
    enabled: bool = False
    margin: float = 0.10
    window_seconds: float = 120.0
    profile: str = "llama3-8b-h100"
    kv_blocks: int | None = None
    time_scale: float = 1.0            # engines' time scale: model seconds = wall seconds / scale
    slo_p99: float = 3.5
    timeout: float = 30.0
    max_requests: int = 2000
    load_scales: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)
    cold: str = DEFAULT_COLD_TAIL         # the dispatchers' cold tail (live and simulated runs agree)
    fallback: FallbackConfig = FallbackConfig()
    seed: int = 0

    def __post_init__(self) -> None:
        get_profile(self.profile)                          # ValueError for an unknown one
        for name in ("window_seconds", "time_scale", "slo_p99", "timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"gate {name} must be a positive number, got {value!r}")
        if not 0 <= self.margin < 1:
            raise ValueError("gate margin must be in [0, 1)")

    def shadow_config(self, replicas: int, *, scales: tuple[float, ...] | None = None):
        return ShadowConfig(get_profile(self.profile), replicas, kv_blocks=self.kv_blocks, slo_p99=self.slo_p99,
                            margin=self.margin, load_scales=scales or self.load_scales,
                            max_requests=self.max_requests, cold=self.cold, seed=self.seed)


@dataclass(frozen=True)
class GateOutcome:
    report: ShadowReport | None        # the candidate vs Flat-LB (None: nothing to replay)
    observed: Observed | None          # the active plan on the same window (None: no active plan)


# ---------------------------------------------------------------------------------------------
# the replay (runs in the worker process)


def evaluate(records: Sequence[tuple[str, float, int, int]], candidate_json: bytes | None, active_json: bytes | None,
             config: GateConfig) -> dict[str, Any]:
    """Gate the candidate and observe the active plan on `records` (key, wall time, prompt, prefix)."""
    recs = shadow.latest([shadow.ReplayRecord(k, t / config.time_scale, max(1, p), x) for k, t, p, x in records],
                         config.max_requests)
    out: dict[str, Any] = {"report": None, "observed": None}
    if candidate_json is not None:
        plan = codec.plan_from_json(candidate_json)
        out["report"] = dataclasses.asdict(_finite(replay.shadow_replay(recs, plan, config.shadow_config(plan.replicas))))
    if active_json is not None:
        active = codec.plan_from_json(active_json)
        out["observed"] = dataclasses.asdict(_observe(recs, active, config))
    return out


def _observe(recs: list, active: Plan, config: GateConfig) -> Observed:
    keys = len({r.key for r in recs})
    reqs = shadow.records_to_requests(recs, default_output_tokens=192)
    if len(reqs) < 10 or reqs[-1].arrival <= 0:
        return Observed(keys, math.nan)
    qps = (len(reqs) - 1) / reqs[-1].arrival
    side = replay.replay_side(reqs, qps, config.shadow_config(active.replicas, scales=(1.0,)), active)
    return Observed(keys, min(side.ttft_p99, UNBOUNDED))        # nan (nothing measured) stays nan


def _finite(report: ShadowReport) -> ShadowReport:
    """Plans are stored as JSON, which has no inf / nan: an unbounded p99 becomes UNBOUNDED."""
    fix = {}
    for f in dataclasses.fields(report):
        value = getattr(report, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            fix[f.name] = UNBOUNDED if f.name.endswith("p99") else 0.0
    return dataclasses.replace(report, **fix) if fix else report


def _worker_main(conn, fn=None) -> None:
    """The worker process: answer jobs (`fn(*job)`, default `evaluate`) until the planner closes
    the pipe (or dies)."""
    fn = fn or evaluate
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", fn(*job) if job is not None else None)
        except Exception as exc:  # noqa: BLE001 - reported to the planner as a failed gate
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


class ReplayTimeout(Exception):
    pass


class ReplayWorker:
    """One spawned process running `fn` (a module-level function; default the gate's `evaluate`;
    the capacity advisor's gauge runs `advise` in one); killed and replaced when a job overruns."""

    def __init__(self, fn=None, name: str = "cacheroute-replay") -> None:
        self._fn, self._name = fn, name
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()      # one job at a time (callers also serialize)
        self._closed = False

    def _ensure(self) -> None:
        if self._closed:
            raise RuntimeError("the planner is stopping")
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            parent, child = self._ctx.Pipe()
            self._proc = self._ctx.Process(target=_worker_main, args=(child, self._fn), name=self._name, daemon=True)
            self._proc.start()
            child.close()
            self._conn = parent

    def call(self, job: tuple | None, timeout: float) -> Any:
        """Blocking: run one job (None: a warm-up ping). ReplayTimeout after `timeout` seconds."""
        with self._lock:
            self._ensure()
            try:
                self._conn.send(job)
                if not self._conn.poll(timeout):
                    self._kill()
                    raise ReplayTimeout(f"replay did not finish within {timeout:g}s")
                status, value = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError) as exc:
                self._kill()
                raise RuntimeError(f"replay worker died: {exc or type(exc).__name__}") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def _kill(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(2)
            self._proc = None

    def close(self) -> None:
        self._closed = True
        proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()            # a job in flight sees EOF at once instead of holding the lock
        with self._lock:
            self._kill()


# ---------------------------------------------------------------------------------------------
# the gate as the planner uses it


def store_records(arrivals: Sequence[ArrivalRecord]) -> list[tuple[str, float, int, int]]:
    return [(a.key, a.time, a.prompt_tokens, a.prefix_tokens) for a in arrivals]


class Gate:
    """The planner's gate: store reads, one replay worker, a time bound."""

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self._worker = ReplayWorker()
        self._busy = asyncio.Lock()

    async def warm_up(self) -> None:
        """Start the worker now (spawning and importing the simulator takes about a second)."""
        await asyncio.to_thread(self._worker.call, None, max(self.config.timeout, 30.0))

    async def close(self) -> None:
        await asyncio.to_thread(self._worker.close)

    async def run(self, store: Store, now: float, candidate: Plan | None, active: Plan | None, *,
                  window_seconds: float | None = None) -> GateOutcome:
        """Replay the window for the candidate (vs Flat-LB) and the active plan; never raises for a
        replay failure or overrun (the candidate then fails the gate)."""
        window = window_seconds or self.config.window_seconds
        records = store_records(await store.recent_arrivals(now, window))
        job = (records, _json(candidate), _json(active), self.config)
        try:
            async with self._busy:
                out = await asyncio.to_thread(self._worker.call, job, self.config.timeout)
        except (ReplayTimeout, RuntimeError) as exc:
            log.warning("shadow replay failed", extra=kv(error=str(exc), records=len(records)))
            failed = ShadowReport(ran=False, passed=False, reason=f"shadow replay failed: {exc}",
                                  requests=min(len(records), self.config.max_requests), margin=self.config.margin)
            return GateOutcome(failed if candidate is not None else None, None)
        report = ShadowReport(**out["report"]) if out["report"] is not None else None
        observed = Observed(**out["observed"]) if out["observed"] is not None else None
        return GateOutcome(report, observed)


def _json(plan: Plan | None) -> bytes | None:
    return codec.plan_to_json(plan) if plan is not None else None


async def validated_report(store: Store, plan: Plan, depth: int = 8) -> ShadowReport | None:
    """The report that vouches for `plan`: its own, or for a repair the plan it repaired."""
    while plan.shadow is None and plan.builder == "repair" and plan.parent_version and depth > 0:
        try:
            plan = await store.get_plan(plan.parent_version)
        except Exception:  # noqa: BLE001 - a pruned parent: nothing vouches for the repair
            return None
        depth -= 1
    return plan.shadow


# ---------------------------------------------------------------------------------------------
# the mode rule (pure)


@dataclass(frozen=True)
class Verdict:
    activate: bool                     # activate the candidate
    mode: Mode | None                  # set the mode (None: leave it)
    reason: str


def guard(*, passed: bool, gate_reason: str, switch: bool, switch_reason: str, mode: Mode, mode_reason: str,
          has_active: bool, pinned: bool, check: tuple[str, str] | None) -> Verdict:
    """What the loop does with a gated candidate (module header, "Mode rule"). A pinned version
    is the operator's: nothing is activated and the mode is left alone."""
    gate = f"shadow gate {'passed' if passed else 'failed'}: {gate_reason}"
    if pinned:
        return Verdict(False, None, f"a version is pinned; {gate}")
    if mode == Mode.FLAT:
        if not mode_reason.startswith(FALLBACK_TAG):
            return Verdict(False, None, f"flat mode set by an operator ({mode_reason or 'no reason'}); {gate}")
        if passed:
            return Verdict(True, Mode.PLANNED, RETURN_TAG + gate)
        return Verdict(False, None, f"still in fallback; {gate}")
    if not has_active:
        return Verdict(passed, None, gate)
    if check is not None and check[0] == "flat":
        if passed:
            return Verdict(True, None, f"active plan left its validated range ({check[1]}); {gate}")
        return Verdict(False, Mode.FLAT, FALLBACK_TAG + f"{check[1]}; candidate {gate}")
    if not passed:
        return Verdict(False, None, f"keeping the active plan; {gate}")
    return Verdict(switch, None, f"{switch_reason}; {gate}")


def check_active(validated: ShadowReport | None, observed: Observed | None,
                 config: FallbackConfig) -> tuple[str, str] | None:
    """fallback_check for the active plan (None when there is nothing observed to judge)."""
    if observed is None:
        return None
    return fallback_check(validated, observed, config)
