"""`cacheroute status`: health, plan and per-replica load of a running stack.

It takes the shared address flags (`clients.cli.add_address_flags`: --planner, --dispatchers,
--collector) and prints a table for people (services, then each dispatcher's replicas), or the
same report as JSON with `--json`. An unreachable or failing service is a row / field in the
report and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, planner_pb2, planner_pb2_grpc
from clients.cli import add_address_flags
from clients.cli.route import enum_name, print_json


def add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="health, plan and per-replica load of a running stack",
                       description="Print every service's health, the leader, the active plan version and mode, "
                                   "and each dispatcher's view of replica load and hit rate: a table, or JSON "
                                   "with --json. An address '' skips that service. Exit 1 if any service is "
                                   "unreachable or not serving.")
    add_address_flags(p, planner=True, dispatchers=True, collector=True)
    p.add_argument("--timeout", type=float, default=1.0, help="deadline per call, seconds (default 1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run_status)


def _probe(address: str, timeout: float, read: Callable[[grpc.Channel], dict[str, Any]] | None) -> dict[str, Any]:
    """Health of one service and, if it serves, what `read` returns."""
    doc: dict[str, Any] = {"address": address}
    with grpc.insecure_channel(address) as channel:
        try:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            doc["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status).lower()
            if read is not None and health.status == health_pb2.HealthCheckResponse.SERVING:
                doc.update(read(channel))
        except grpc.RpcError as err:
            doc.setdefault("health", "unreachable")
            doc["error"] = f"{err.code().name}: {err.details()}"  # type: ignore[attr-defined]
    return doc


def planner_doc(channel: grpc.Channel, timeout: float) -> dict[str, Any]:
    s = planner_pb2_grpc.PlannerStub(channel).GetStatus(planner_pb2.GetPlannerStatusRequest(), timeout=timeout)
    return {"planner_id": s.planner_id, "leader": s.leader, "active_version": s.active_version,
            "mode": enum_name(common_pb2.Mode, s.mode), "mode_reason": s.mode_reason, "pinned_version": s.pinned_version,
            "latest_version": s.latest_version, "last_loop_outcome": s.last_loop_outcome,
            **{name: round(getattr(s, name), 4) for name in ("available_hit_rate", "achieved_hit_rate")
               if s.HasField(name)}}


def dispatcher_doc(channel: grpc.Channel, timeout: float) -> dict[str, Any]:
    s = dispatcher_pb2_grpc.DispatcherStub(channel).GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=timeout)
    return {"dispatcher_id": s.dispatcher_id, "plan_version": s.plan_version, "mode": enum_name(common_pb2.Mode, s.mode),
            "plan_source": s.plan_source, "routed": s.routed, "planned": s.planned, "cold": s.cold,
            "fallback": s.fallback, "telemetry_dropped": s.telemetry_dropped,
            "replicas": [{"replica_id": r.replica_id, "address": r.address, "healthy": r.healthy,
                          "in_flight": r.in_flight, "waiting": r.waiting, "running": r.running,
                          "kv_usage": round(r.kv_usage, 4), "hit_rate": round(r.hit_rate, 4), "routed": r.routed}
                         for r in s.replicas]}


def run_status(args: argparse.Namespace) -> int:
    t = args.timeout
    report: dict[str, Any] = {}
    if args.planner:
        report["planner"] = _probe(args.planner, t, lambda ch: planner_doc(ch, t))
    if args.collector:
        report["collector"] = _probe(args.collector, t, None)
    addresses = [a.strip() for a in args.dispatchers.split(",") if a.strip()]
    report["dispatchers"] = [_probe(a, t, lambda ch: dispatcher_doc(ch, t)) for a in addresses]
    if args.json:
        print_json(report)
    else:
        sys.stdout.write(status_table(report))
    services = [report.get("planner"), report.get("collector"), *report["dispatchers"]]
    return 0 if all(s["health"] == "serving" and "error" not in s for s in services if s) else 1


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


def _service_detail(kind: str, doc: dict[str, Any]) -> str:
    if "error" in doc:
        return " ".join(doc["error"].split())
    if kind == "planner" and "planner_id" in doc:
        pinned = f", pinned v{doc['pinned_version']}" if doc["pinned_version"] else ""
        role = "leader" if doc["leader"] else "standby"
        return (f"{doc['planner_id']} ({role}), active v{doc['active_version']}, mode {doc['mode']}{pinned}, "
                f"latest v{doc['latest_version']}; last loop: {doc['last_loop_outcome'] or '-'}")
    if kind == "dispatcher" and "dispatcher_id" in doc:
        return (f"{doc['dispatcher_id']}, plan v{doc['plan_version']} ({doc['plan_source'] or '-'}), mode {doc['mode']}, "
                f"routed {doc['routed']} (planned {doc['planned']}, cold {doc['cold']}, fallback {doc['fallback']})")
    return ""


def status_table(report: dict[str, Any]) -> str:
    """The status report for people: one row per service, then each dispatcher's replicas."""
    services = [("planner", report["planner"])] if "planner" in report else []
    services += [("collector", report["collector"])] if "collector" in report else []
    services += [("dispatcher", d) for d in report["dispatchers"]]
    lines = _table(["SERVICE", "ADDRESS", "HEALTH", "DETAIL"],
                   [[kind, doc["address"], doc["health"], _service_detail(kind, doc)] for kind, doc in services])
    for d in report["dispatchers"]:
        if not d.get("replicas"):
            continue
        lines += ["", f"replicas seen by {d['dispatcher_id']} ({d['address']})"]
        lines += _table(["REPLICA", "ADDRESS", "HEALTHY", "IN-FLIGHT", "WAITING", "RUNNING", "KV", "HIT", "ROUTED"],
                        [[r["replica_id"], r["address"], "yes" if r["healthy"] else "no", str(r["in_flight"]),
                          str(r["waiting"]), str(r["running"]), f"{r['kv_usage']:.0%}", f"{r['hit_rate']:.1%}",
                          str(r["routed"])] for r in d["replicas"]])
    return "\n".join(lines) + "\n"


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_status]


def register(sub: argparse._SubParsersAction) -> None:
    for add in COMMANDS:
        add(sub)
