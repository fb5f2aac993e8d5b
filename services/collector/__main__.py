"""`cacheroute serve collector` / `python -m services.collector`: the telemetry collector.

Environment variables (flags override them):
  CACHEROUTE_REDIS_URL (redis://127.0.0.1:6379/0)  the store (memory:// for in-process)
  CACHEROUTE_KEY_PREFIX (cr)                       Redis key prefix
  CACHEROUTE_BUCKET_SECONDS (10)                   telemetry bucket width (planner must agree)
  CACHEROUTE_RETENTION_SECONDS (3600)              telemetry retention; older records are rejected
  CACHEROUTE_BUCKET_KEYS (20000)                   distinct keys counted per bucket, the rest untracked; 0 = no cap
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
from services.flags import flag
from services.rpc import add_server_flags, run_service, server_config
from services.store import add_store_flags, telemetry_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve collector", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50052, default_metrics_port=9152)
    add_store_flags(p)
    flag(p, "--window", env="WINDOW_SECONDS", default=300.0, type=float, help="GetRates default window, seconds")
    flag(p, "--queue-size", env="COLLECTOR_QUEUE", default=64, type=int, help="bounded write queue, batches")
    flag(p, "--writers", env="COLLECTOR_WRITERS", default=2, type=int, help="Redis writer tasks")
    flag(p, "--coalesce", env="COLLECTOR_COALESCE", default=16, type=int, help="batches per round trip")
    flag(p, "--max-rates", env="MAX_RATES", default=10000, type=int, help="keys per GetRates answer at most")
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
