"""`cacheroute serve engine` / `python -m services.engine`: one simulated engine replica.

Environment variables (flags override them):
  CACHEROUTE_REPLICA_ID (engine-0)            id reported in chunks, stats and telemetry
  CACHEROUTE_PROFILE (llama3-8b-h100)         engine profile (services.core.engine.PROFILES)
  CACHEROUTE_TIME_SCALE (1.0)                 wall seconds slept per model second
  CACHEROUTE_KV_BLOCKS (profile's)            KV pool size in 16-token blocks
  CACHEROUTE_COLLECTOR ("")                   collector address for cache stats (off if empty)
  CACHEROUTE_REPORT_INTERVAL (1.0)            seconds between cache-stat reports
  CACHEROUTE_MAX_PROMPT_TOKENS (131072)       longer prompts are INVALID_ARGUMENT
  CACHEROUTE_MAX_OUTPUT_TOKENS (8192)         larger max_tokens is INVALID_ARGUMENT
  CACHEROUTE_MAX_REQUESTS (4096)              more in flight is RESOURCE_EXHAUSTED
  CACHEROUTE_HTTP_PORT (-1)                   OpenAI HTTP API port (services/engine/http.py), -1 off, 0 ephemeral
"""

from __future__ import annotations

import argparse
import sys

from services.core.engine import get_profile
from services.engine.service import EngineConfig, serve
from services.engine.servicer import Limits
from services.rpc import add_server_flags, env, env_number, run_service, server_config


def parse_args(argv: list[str] | None) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="cacheroute serve engine", description="A simulated engine replica.",
                                     epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(parser, default_port=50061, default_metrics_port=9161)
    g = parser.add_argument_group("engine")
    g.add_argument("--replica-id", default=env("REPLICA_ID", "engine-0"), help="(env CACHEROUTE_REPLICA_ID)")
    g.add_argument("--profile", default=env("PROFILE", "llama3-8b-h100"), help="(env CACHEROUTE_PROFILE)")
    g.add_argument("--time-scale", type=float, default=env_number("TIME_SCALE", "1.0", float),
                   help="wall seconds per model second (env CACHEROUTE_TIME_SCALE, default 1.0)")
    g.add_argument("--kv-blocks", type=int, default=env_number("KV_BLOCKS", "0", int) or None,
                   help="KV pool in 16-token blocks (env CACHEROUTE_KV_BLOCKS, default: the profile's)")
    g.add_argument("--collector", default=env("COLLECTOR", ""), help="collector address (env CACHEROUTE_COLLECTOR)")
    g.add_argument("--report-interval", type=float, default=env_number("REPORT_INTERVAL", "1.0", float),
                   help="(env CACHEROUTE_REPORT_INTERVAL)")
    g.add_argument("--max-prompt-tokens", type=int, default=env_number("MAX_PROMPT_TOKENS", "131072", int),
                   help="(env CACHEROUTE_MAX_PROMPT_TOKENS)")
    g.add_argument("--max-output-tokens", type=int, default=env_number("MAX_OUTPUT_TOKENS", "8192", int),
                   help="(env CACHEROUTE_MAX_OUTPUT_TOKENS)")
    g.add_argument("--max-requests", type=int, default=env_number("MAX_REQUESTS", "4096", int),
                   help="(env CACHEROUTE_MAX_REQUESTS)")
    g.add_argument("--http-port", type=int, default=env_number("HTTP_PORT", "-1", int),
                   help="OpenAI HTTP API port, -1 = off, 0 = ephemeral (env CACHEROUTE_HTTP_PORT, default -1)")
    args = parser.parse_args(argv)
    try:
        get_profile(args.profile)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    return EngineConfig(
        server=server_config("engine", args), replica_id=args.replica_id, profile=args.profile,
        time_scale=args.time_scale, kv_blocks=args.kv_blocks, collector=args.collector,
        report_interval=args.report_interval,
        limits=Limits(max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens),
        max_requests=args.max_requests, http_port=args.http_port)


def main(argv: list[str] | None = None) -> int:
    return run_service("engine", lambda: parse_args(argv), serve)


if __name__ == "__main__":
    sys.exit(main())
