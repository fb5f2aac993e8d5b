"""The compose stack end to end: up, healthy, demo traffic over gRPC and the OpenAI HTTP API,
a plan rolled back and forward with the control RPCs, down -v leaving nothing behind.

    python scripts/compose_check.py [--file docker-compose.yml] [--project cacheroute-check]

The images must exist (scripts/local-images.sh builds them without Docker Hub; its --env
output names them: CACHEROUTE_IMAGE, CACHEROUTE_REDIS_IMAGE). Every published port is moved to
a free loopback port (CACHEROUTE_PUBLISH_*), so the check runs beside anything already
listening on 50051, 8080, ... Steps, each timed:

  1. `docker-compose up -d --no-build`, then wait until every container reports healthy
     (a container that exits or turns unhealthy fails the check at once, with its log) and
     `cacheroute status` reaches planner, collector and dispatchers on their published ports.
  2. `cacheroute demo --dispatchers ... --planner ... --json` over gRPC: every request of
     both phases answered (0 errors), a plan built and activated during the planned phase
     (the demo's BuildPlan note) and requests routed by it.
  3. the same demo with `--http`: the dispatchers' OpenAI HTTP API through the `openai` SDK,
     0 errors and a plan activated (its fresh keys may all be cold: the planner's 300 s window
     still ranks step 2's keys higher).
  4. `cacheroute plans rollback --expected V` and `plans activate V --expected V'`: the active
     version moves back and forward, and every dispatcher reports each version in turn.
  5. `docker-compose down -v`, then no container, network or volume of the project remains.

Step 5 runs whatever happened before (unless --keep). Exit status 0 when every step passed,
1 otherwise; one line per step, the failing step's reason last.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# the CACHEROUTE_PUBLISH_* variables of docker-compose.yml: every published port
PUBLISHED = ("PLANNER", "PLANNER_METRICS", "COLLECTOR", "COLLECTOR_METRICS",
             "DISPATCHER_1", "DISPATCHER_1_METRICS", "DISPATCHER_1_HTTP",
             "DISPATCHER_2", "DISPATCHER_2_METRICS", "DISPATCHER_2_HTTP",
             "ENGINE_1", "ENGINE_2", "ENGINE_3", "ENGINE_4")


class CheckFailed(Exception):
    pass


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run(cmd: list[str], *, env: dict[str, str], timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{' '.join(cmd[:4])} ... did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise CheckFailed(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {' | '.join(tail)}")
    return proc


class ComposeCheck:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.compose = ["docker-compose", "-p", args.project, "-f", str(ROOT / args.file)]
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "protos"), self.env.get("PYTHONPATH")]))
        self.env.setdefault("CACHEROUTE_PUBLISH_HOST", "127.0.0.1")
        if args.free_ports:
            for var, port in zip(PUBLISHED, free_ports(len(PUBLISHED))):
                self.env[f"CACHEROUTE_PUBLISH_{var}"] = str(port)
        host = self.env["CACHEROUTE_PUBLISH_HOST"]
        defaults = {"PLANNER": 50051, "COLLECTOR": 50052, "DISPATCHER_1": 50053, "DISPATCHER_2": 50054,
                    "DISPATCHER_1_HTTP": 8080, "DISPATCHER_2_HTTP": 8081}
        port = {k: self.env.get(f"CACHEROUTE_PUBLISH_{k}", str(v)) for k, v in defaults.items()}
        self.planner = f"{host}:{port['PLANNER']}"
        self.collector = f"{host}:{port['COLLECTOR']}"
        self.dispatchers = f"{host}:{port['DISPATCHER_1']},{host}:{port['DISPATCHER_2']}"
        self.http = f"http://{host}:{port['DISPATCHER_1_HTTP']},http://{host}:{port['DISPATCHER_2_HTTP']}"
        self.cli = [sys.executable, "-m", "clients.cli"]
        self.timings: list[tuple[str, float]] = []

    # --- steps ---------------------------------------------------------------------------
    def up(self) -> None:
        run([*self.compose, "up", "-d", "--no-build"], env=self.env, timeout=180)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.args.healthy_timeout
        while True:
            states = self.container_states()
            if not states:
                raise CheckFailed("docker-compose started no containers")
            bad = [name for name, (status, health) in states.items() if status in ("exited", "dead") or health == "unhealthy"]
            if bad:
                raise CheckFailed(f"{', '.join(bad)} exited or unhealthy:\n{self.logs(bad)}")
            waiting = [name for name, (_, health) in states.items() if health != "healthy"]
            if not waiting:
                print(f"compose-check:   {len(states)} containers healthy", flush=True)
                # and every service answers on its published port, seen from the host
                run([*self.cli, "status", "--planner", self.planner, "--collector", self.collector,
                     "--dispatchers", self.dispatchers, "--timeout", "3"], env=self.env, timeout=60)
                return
            if time.monotonic() > deadline:
                raise CheckFailed(f"not healthy within {self.args.healthy_timeout:g} s: {', '.join(waiting)}\n{self.logs(waiting)}")
            time.sleep(1.0)

    def demo(self, http: bool) -> None:
        cmd = [*self.cli, "demo", "--dispatchers", self.dispatchers, "--planner", self.planner, "--json", "--no-progress",
               "--warmup", str(self.args.warmup), "--duration", str(self.args.duration), "--qps", str(self.args.qps)]
        if http:
            cmd += ["--http", "--http-urls", self.http]
        proc = run(cmd, env=self.env, timeout=4 * (self.args.warmup + self.args.duration) + 60, check=False)
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            raise CheckFailed(f"demo printed no JSON (exit {proc.returncode}): {proc.stderr.strip()[-400:]}") from None
        verdict = demo_verdict(result, require_planned_routes=not http)
        via = "HTTP (openai SDK)" if http else "gRPC"
        for mode, m in result["modes"].items():
            print(f"compose-check:   {via} {mode}: {m['requests']} requests, {m['errors']} errors, "
                  f"hit rate {m['hit_rate']:.1%}, routed {m['by_reason']}", flush=True)
        for note in result.get("notes", []):
            print(f"compose-check:   {note}", flush=True)
        if verdict:
            raise CheckFailed(f"demo over {via}: {verdict}")

    def roll(self) -> None:
        status = self.plans("status")
        active = int(status["active_version"])
        if active <= 0:
            raise CheckFailed("no active plan to roll back from")
        back = self.plans("rollback", "--expected", str(active), "--reason", "compose-check: roll back")
        previous = int(back["active_version"])
        if previous == active:
            raise CheckFailed(f"rollback left v{active} active")
        self.wait_dispatchers(previous)
        forward = self.plans("activate", str(active), "--expected", str(previous), "--reason", "compose-check: roll forward")
        if int(forward["active_version"]) != active:
            raise CheckFailed(f"activate v{active} gave v{forward['active_version']}")
        self.wait_dispatchers(active)
        print(f"compose-check:   plan v{active} -> v{previous} (rollback) -> v{active} (activate); dispatchers followed",
              flush=True)

    def down(self) -> None:
        run([*self.compose, "down", "-v", "--remove-orphans", "-t", "10"], env=self.env, timeout=180)
        label = f"label=com.docker.compose.project={self.args.project}"
        left = {}
        for kind, cmd in (("containers", ["docker", "ps", "-aq", "--filter", label]),
                          ("networks", ["docker", "network", "ls", "-q", "--filter", label]),
                          ("volumes", ["docker", "volume", "ls", "-q", "--filter", label])):
            ids = run(cmd, env=self.env, timeout=30).stdout.split()
            if ids:
                left[kind] = ids
        if left:
            raise CheckFailed(f"docker-compose down -v left {left}")
        print("compose-check:   no container, network or volume of the project left", flush=True)

    # --- helpers -------------------------------------------------------------------------
    def container_states(self) -> dict[str, tuple[str, str]]:
        ids = run([*self.compose, "ps", "-q"], env=self.env, timeout=60).stdout.split()
        if not ids:
            return {}
        fmt = "{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}"
        out = run(["docker", "inspect", "--format", fmt, *ids], env=self.env, timeout=60).stdout
        states = {}
        for line in out.splitlines():
            name, status, health = line.split()
            states[name.lstrip("/")] = (status, health)
        return states

    def logs(self, names: list[str]) -> str:
        parts = []
        for name in names:
            proc = run(["docker", "logs", "--tail", "15", name], env=self.env, timeout=30, check=False)
            parts.append(f"--- {name}\n{(proc.stdout + proc.stderr).strip()}")
        return "\n".join(parts)

    def plans(self, *argv: str) -> dict[str, Any]:
        out = run([*self.cli, "plans", *argv, "--planner", self.planner], env=self.env, timeout=30).stdout
        return json.loads(out)

    def wait_dispatchers(self, version: int, timeout: float = 15.0) -> None:
        """Until every dispatcher reports `version` on 5 reads in a row (a read reaches one of
        its worker processes). GetStatus in-process: a CLI per poll costs a second each."""
        for path in (str(ROOT), str(ROOT / "protos")):
            if path not in sys.path:
                sys.path.insert(0, path)
        import grpc

        from clients.client import CacheRouteClient

        clients = [CacheRouteClient(a, timeout=2.0) for a in self.dispatchers.split(",")]
        deadline = time.monotonic() + timeout
        streak, seen = 0, []
        try:
            while streak < 5:
                try:
                    seen = [c.dispatcher_status().plan_version for c in clients]
                except grpc.RpcError as exc:
                    seen = [f"{exc.code().name}"]  # type: ignore[attr-defined]
                streak = streak + 1 if all(v == version for v in seen) else 0
                if streak < 5:
                    if time.monotonic() > deadline:
                        raise CheckFailed(f"dispatchers report plan versions {seen}, not v{version}, after {timeout:g} s")
                    time.sleep(0.1)
        finally:
            for c in clients:
                c.close()

    # --- driver --------------------------------------------------------------------------
    def step(self, name: str, fn, *a) -> None:
        t0 = time.monotonic()
        print(f"compose-check: {name} ...", flush=True)
        try:
            fn(*a)
        finally:
            self.timings.append((name, time.monotonic() - t0))
        print(f"compose-check: {name}: ok ({self.timings[-1][1]:.0f} s)", flush=True)

    def main(self) -> int:
        failure = None
        try:
            self.step("up", self.up)
            self.step("wait healthy", self.wait_healthy)
            self.step("demo over gRPC", self.demo, False)
            self.step("demo over the OpenAI HTTP API", self.demo, True)
            self.step("roll a plan version", self.roll)
        except CheckFailed as exc:
            failure = exc
        finally:
            if not self.args.keep:
                try:
                    self.step("down -v", self.down)
                except CheckFailed as exc:
                    failure = failure or exc
        print("compose-check: timings: " + ", ".join(f"{n} {s:.0f} s" for n, s in self.timings), flush=True)
        if failure is not None:
            print(f"compose-check: FAILED: {failure}", flush=True)
            return 1
        print("compose-check: passed", flush=True)
        return 0


def demo_verdict(result: dict[str, Any], *, require_planned_routes: bool) -> str:
    """'' when a demo run (its --json document) passed, else why not."""
    modes = result.get("modes", {})
    if set(modes) != {"planned", "flat"}:
        return f"modes {sorted(modes)}, expected planned and flat"
    for mode, m in modes.items():
        if m["requests"] == 0:
            return f"{mode}: no requests"
        if m["errors"]:
            return f"{mode}: {m['errors']} errors {m.get('error_codes', {})}"
    if not any(note.startswith("plan v") for note in result.get("notes", [])):
        return f"no plan was built and activated (notes: {result.get('notes')})"
    planned = modes["planned"]
    if not planned["plan_versions"] or max(planned["plan_versions"]) <= 0:
        return "the planned phase saw no plan version"
    if require_planned_routes and not planned["by_reason"].get("planned"):
        return f"no request routed by the plan ({planned['by_reason']})"
    if modes["flat"]["by_reason"].get("planned"):
        return "the flat phase routed by the plan"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default="docker-compose.yml", help="compose file (default docker-compose.yml)")
    parser.add_argument("--project", default="cacheroute-check", help="compose project name (default cacheroute-check)")
    parser.add_argument("--healthy-timeout", type=float, default=180.0, help="seconds to wait for healthy (default 180)")
    parser.add_argument("--warmup", type=float, default=8.0, help="demo warm-up seconds per mode (default 8)")
    parser.add_argument("--duration", type=float, default=8.0, help="demo measured seconds per mode (default 8)")
    parser.add_argument("--qps", type=float, default=20.0, help="demo req/s (default 20)")
    parser.add_argument("--no-free-ports", dest="free_ports", action="store_false",
                        help="keep the CACHEROUTE_PUBLISH_* ports of the environment / the compose defaults")
    parser.add_argument("--keep", action="store_true", help="leave the stack running (no down -v)")
    return ComposeCheck(parser.parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
