"""Generates the Grafana dashboard deploy/observability/grafana/dashboards/cacheroute.json.

    python scripts/gen_dashboard.py            # write the JSON
    python scripts/gen_dashboard.py --check    # exit 1 if the committed JSON differs

The dashboard is data (PANELS below: title, unit, PromQL queries); this script turns it into
Grafana's JSON model (schemaVersion 39, timeseries panels on a 2-column grid, the datasource
by uid `cacheroute-prometheus`, as deploy/observability/grafana/provisioning/ names it).
The output is deterministic (sorted keys, fixed ids), so a test can regenerate it and compare.

`metric_names()` lists every metric the queries read (the identifiers PromQL selects, with
their `_total` / `_bucket` suffixes), so a test can check that a running stack exports each.
Where the metrics come from (Prometheus jobs in deploy/observability/prometheus.yml):
  cacheroute_planner_*     planner metrics port      (services/planner/service.py)
  cacheroute_dispatcher_*  dispatcher metrics port   (services/dispatcher/service.py)
  cacheroute_http_*        dispatcher metrics port   (services/dispatcher/http.py)
  vllm:*                   engine HTTP /metrics      (services/engine/http.py; a real vLLM's own)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "deploy" / "observability" / "grafana" / "dashboards" / "cacheroute.json"
DATASOURCE = {"type": "prometheus", "uid": "cacheroute-prometheus"}
W = "$__rate_interval"

# (title, unit, description, [(legend, PromQL), ...])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Per-replica prefix-cache hit rate", "percentunit",
     "cached / prompt tokens per engine replica (vLLM's prefix-cache counters)",
     [("{{replica}}", f"sum by (replica) (rate(vllm:prefix_cache_hits_total[{W}])) / "
                      f"sum by (replica) (rate(vllm:prefix_cache_queries_total[{W}]))")]),
    ("Achieved vs available hit rate", "percentunit",
     "achieved: cached / prompt tokens the engines reported over the planner's window; "
     "available: the infinite-cache hit rate of the same window's arrivals",
     [("achieved", "cacheroute_planner_achieved_hit_rate"),
      ("available", "cacheroute_planner_available_hit_rate")]),
    ("Routing reasons", "reqps",
     "requests routed by the dispatchers: planned (plan table), cold (cold-tail ring), fallback (P2C)",
     [("{{reason}}", f"sum by (reason) (rate(cacheroute_dispatcher_routed_total[{W}]))")]),
    ("Plan version", "none",
     "active plan version at the planner and as each dispatcher holds it",
     [("planner", "max(cacheroute_planner_active_version)"),
      ("{{dispatcher}}", "max by (dispatcher) (cacheroute_dispatcher_plan_version)")]),
    ("Plan churn and switch decisions", "none",
     "rate share the last candidate moves off its parent's replicas; control-loop outcomes per minute",
     [("churn", "cacheroute_planner_plan_churn"),
      ("{{outcome}} /min", "sum by (outcome) (rate(cacheroute_planner_switch_decisions_total[5m])) * 60")]),
    ("TTFT", "s",
     "time to first token at the engines (vLLM's histogram), p50 and p99",
     [("p50", f"histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[{W}])))"),
      ("p99", f"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[{W}])))")]),
    ("Ejections and unhealthy replicas", "none",
     "engine failures the HTTP front door counted (each one ejects the replica from routing until "
     "it answers again), per second; replicas the dispatchers see unhealthy",
     [("errors {{replica}}", f"sum by (replica) (rate(cacheroute_http_upstream_errors_total[{W}]))"),
      ("unhealthy {{replica}}", "count by (replica) (cacheroute_dispatcher_replica_healthy == 0)")]),
    ("Planner interval time", "s",
     "candidate build + switching decision time per control-loop interval, p50 and p99",
     [("p50", f"histogram_quantile(0.5, sum by (le) (rate(cacheroute_planner_build_seconds_bucket[5m])))"),
      ("p99", f"histogram_quantile(0.99, sum by (le) (rate(cacheroute_planner_build_seconds_bucket[5m])))")]),
]

_PROMQL_WORDS = {"sum", "by", "rate", "max", "count", "histogram_quantile", "le", "replica", "reason",
                 "outcome", "dispatcher", "__rate_interval"}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names() -> list[str]:
    """Every metric a panel's query selects, sorted."""
    names: set[str] = set()
    for _, _, _, queries in PANELS:
        for _, expr in queries:
            text = re.sub(r"\[[^\]]*\]", "", expr)          # range selectors
            text = re.sub(r"\{\{[^}]*\}\}", "", text)
            for word in _IDENT.findall(text):
                if word not in _PROMQL_WORDS:
                    names.add(word)
    return sorted(names)


def _panel(i: int, title: str, unit: str, description: str, queries: list[tuple[str, str]]) -> dict:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + j)}
                    for j, (legend, expr) in enumerate(queries)],
    }


def dashboard() -> dict:
    return {
        "uid": "cacheroute",
        "title": "CacheRoute",
        "description": "Generated by scripts/gen_dashboard.py; edit PANELS there, not this JSON.",
        "tags": ["cacheroute"],
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "utc",
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": [_panel(i, *p) for i, p in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is not what this writes")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--metrics", action="store_true", help="print the metrics the dashboard reads, one a line")
    args = ap.parse_args(argv)
    if args.metrics:
        print("\n".join(metric_names()))
        return 0
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run python scripts/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
