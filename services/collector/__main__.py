"""`cacheroute serve collector` / `python -m services.collector`: the telemetry collector.

Environment variables (flags override them):
  CACHEROUTE_REDIS_URL (redis://127.0.0.1:6379/0)  the store (memory:// for in-process)
  CACHEROUTE_KEY_PREFIX (cr)                       Redis key prefix
  CACHEROUTE_BUCKET_SECONDS (10)                   telemetry bucket width (planner must agree)
  CACHEROUTE_RETENTION_SECONDS (3600)              telemetry retention; older records are rejected
  CACHEROUTE_WINDOW_SECONDS (300)                  GetRates window when the request says 0
  CACHEROUTE_COLLECTOR_QUEUE (64)                  batches queued between streams and Redis writers
  CACHEROUTE_COLLECTOR_WRITERS (2)                 concurrent Redis writers
  CACHEROUTE_COLLECTOR_COALESCE (16)               queued batches merged into one round trip
  CACHEROUTE_MAX_RATES (10000)                     keys one GetRates answer carries at most (hottest first)
With a bearer token configured (CACHEROUTE_AUTH_TOKEN / --auth-token-file) every collector RPC
requires it: the telemetry writes, ReportArrivals and ReportCacheStats, and the GetRates read.
Dispatchers and engines configured with the same token send it.
"""

from __future__ import annotations

import argparse
import sys

from services.collector.service import CollectorConfig, serve
from services.rpc import add_server_flags, env_number, run_service, server_config
from services.store import add_store_flags, telemetry_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve collector", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50052, default_metrics_port=9152)
    add_store_flags(p)
    p.add_argument("--window", type=float, default=env_number("WINDOW_SECONDS", "300", float),
                   help="GetRates default window, seconds (env CACHEROUTE_WINDOW_SECONDS, default 300)")
    p.add_argument("--queue-size", type=int, default=env_number("COLLECTOR_QUEUE", "64", int),
                   help="bounded write queue, batches (env CACHEROUTE_COLLECTOR_QUEUE, default 64)")
    p.add_argument("--writers", type=int, default=env_number("COLLECTOR_WRITERS", "2", int),
                   help="Redis writer tasks (env CACHEROUTE_COLLECTOR_WRITERS, default 2)")
    p.add_argument("--coalesce", type=int, default=env_number("COLLECTOR_COALESCE", "16", int),
                   help="batches per round trip (env CACHEROUTE_COLLECTOR_COALESCE, default 16)")
    p.add_argument("--max-rates", type=int, default=env_number("MAX_RATES", "10000", int),
                   help="keys per GetRates answer at most (env CACHEROUTE_MAX_RATES, default 10000)")
    return p


def config_from_args(args: argparse.Namespace) -> CollectorConfig:
    return CollectorConfig(server=server_config("collector", args), redis_url=args.redis, key_prefix=args.key_prefix,
                           telemetry=telemetry_from_args(args), window_seconds=args.window,
                           queue_size=args.queue_size, writers=args.writers, coalesce=args.coalesce,
                           max_rates=args.max_rates)


def main(argv: list[str] | None = None) -> int:
    return run_service("collector", lambda: config_from_args(build_parser().parse_args(argv)), serve)


if __name__ == "__main__":
    sys.exit(main())
