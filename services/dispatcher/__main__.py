"""`cacheroute serve dispatcher` / `python -m services.dispatcher`: a stateless dispatcher.

Environment variables (flags override them):
  CACHEROUTE_REPLICAS ("")                  engine replicas, id=host:port,... (required)
  CACHEROUTE_PLANNER ("")                   planner address for WatchPlans (off if empty)
  CACHEROUTE_REDIS_URL ("")                 Redis for the fallback plan read (off if empty)
  CACHEROUTE_COLLECTOR ("")                 collector for arrival telemetry (off if empty)
  CACHEROUTE_DISPATCHER_ID (dispatcher-0)   source id in telemetry and status
  CACHEROUTE_KEY_BLOCKS (4)                 key = chained hash of the first N prefix blocks
  CACHEROUTE_KEY_TOKENS (64)                key = hash of the first N prompt tokens
  CACHEROUTE_COLD_TAIL (chwbl)              cold-tail policy: p2c (power of two choices) or chwbl
                                            (session-aware: bounded-load consistent hashing on the key,
                                            so every dispatcher with the same --replicas list sends a
                                            cold key to the same replica while loads are balanced);
                                            default chwbl (services.model.DEFAULT_COLD_TAIL, as in the
                                            simulator; CACHEROUTE_COLD is read when CACHEROUTE_COLD_TAIL is unset)
  CACHEROUTE_PREFIX_NODES (0)               1: the prefix-aware policy (cacheroute-prefix: routes cold keys
                                            by the plan's prefix nodes, balances on prefill tokens, sends
                                            each arrival's prefix chain to the collector; docs/architecture.md)
  CACHEROUTE_HOLD_LIMIT (0)                 > 0: the hold rule (services/dispatcher/dispatch.py): a request may wait
                                            this many seconds at the dispatcher while every acceptable replica's KV
                                            is full, then goes to its pick anyway; 0 (default) = never hold
                                            (docs/experiments.md, "Hold at the dispatcher": it did not pay there)
  CACHEROUTE_POLL_INTERVAL (0.25)           replica health/stats poll period, seconds
  CACHEROUTE_POLL_TIMEOUT (0.2)             deadline of each poll RPC, seconds
  CACHEROUTE_HEALTH_EVERY (1.0)             seconds between an HTTP engine's GET /health while its /metrics answers
                                            (the polls in between read /metrics only; 0 = /health at every poll)
  CACHEROUTE_TELEMETRY_INTERVAL (0.5)       arrival flush period, seconds
  CACHEROUTE_TELEMETRY_CAPACITY (100000)    buffered arrivals before new ones are dropped
  CACHEROUTE_MAX_BATCH (10000)              RouteBatch requests per call
  CACHEROUTE_RECORD_BUS (1)                 1: the record bus (services/dispatcher/recordbus.py): every --record-interval
                                            the dispatcher (each worker) publishes what it routed over --redis
                                            (pub/sub, channel cr:{records}:bus) and feeds its peers' routes into
                                            its cold-home record and key memory; the share gate then counts the
                                            live peers' open streams. Off without --redis. Default 1 (on):
                                            at a tier of 4 over two seeds it took drift's p99 from 1,513 to
                                            1,190 ms and kept (a)'s within its rule (docs/experiments.md, "The
                                            record bus live, a second seed"); 0 saves its CPU (each dispatcher
                                            decodes every peer's batch 10 times a second)
  CACHEROUTE_RECORD_INTERVAL (0.1)          seconds between two batches (well under the 0.25 s stats poll;
                                            docs/experiments.md, "The record bus between live dispatchers")
  CACHEROUTE_RECORD_BATCH_MAX (4096)        routed requests per batch (and accepted per received batch);
                                            more in one interval are dropped and counted
  CACHEROUTE_RECORD_HANDOVER (1)            1: a dispatcher starting on the bus asks its peers for their key
                                            memory and record for 3 s, and answers a starting peer (the
                                            record bus's "Hand-over"; a restart on the bus otherwise starts
                                            blind: docs/experiments.md, "Rolling restart of a tier")
  CACHEROUTE_CALLER_TELEMETRY_RATE (100)    Route/RouteBatch arrivals per second one caller (tenant, else
                                            peer host) may add to the planner's input; 0 = no bound
                                            (services/dispatcher/budget.py). Generate arrivals count once served.
  CACHEROUTE_CALLER_TELEMETRY_BURST (200)   that budget's bucket size
  CACHEROUTE_CALLER_TELEMETRY_SCOPE (shared) shared: one bucket per caller across dispatchers, in the store
                                            (--redis; the local bucket while it does not answer); local: per
                                            dispatcher. HTTP arrivals draw on the same bucket.
  CACHEROUTE_API_KEY / CACHEROUTE_API_KEY_FILE  accepted data-plane keys (key[:tenant] lines; services/auth.py).
                                            With keys or a deployment token (CACHEROUTE_AUTH_TOKEN) configured,
                                            Route, RouteBatch and Generate require one of them; GetStatus stays open.
  CACHEROUTE_SEED ("")                      P2C seed (random if empty)
  CACHEROUTE_MALLOC_ARENAS (2)              glibc malloc arenas a serving process keeps to (mallopt M_ARENA_MAX;
                                            services/dispatcher/plans.py): a first 128,824-key plan costs 112-122
                                            instead of 171-186 bytes a key; 0 = glibc's default (8 per core); a
                                            MALLOC_ARENA_MAX in the environment is left as it is
  CACHEROUTE_WORKERS (0)                    worker processes sharing the ports (SO_REUSEPORT); 0 (default) =
                                            one per core this process may run on (os.sched_getaffinity: a
                                            container's cpuset counts, not the host's cores); 1 = no supervisor,
                                            the dispatcher in this process; > 1 runs a supervisor
                                            (services/dispatcher/workers.py) whose
                                            metrics port serves every worker's metrics, labelled worker="I"
  CACHEROUTE_UVLOOP (1)                     1: the event loop is uvloop's (less CPU per request,
                                            docs/benchmarks.md); 0: asyncio's default loop
  CACHEROUTE_ENGINE_KIND (cacheroute)       kind of replicas given without KIND+ (services/backends):
                                            cacheroute (gRPC engine), vllm, sglang, llamacpp, openai;
                                            per replica: id=KIND+URL (e.g. e1=vllm+http://10.0.0.5:8000)
OpenAI HTTP API (services/dispatcher/http.py):
  CACHEROUTE_EXT_PROC_PORT (-1)             Envoy ext_proc endpoint picker port (services/dispatcher/extproc.py), -1 off
  CACHEROUTE_HTTP_PORT (8080)               port, -1 off, 0 ephemeral (host: --host); it accepts the same
                                            keys as the gRPC data plane (CACHEROUTE_API_KEY above)
  CACHEROUTE_HTTP_MAX_BODY_BYTES (8388608)  larger request bodies are 413
  CACHEROUTE_MAX_OUTPUT_TOKENS (32768)      larger max_tokens is 400
  CACHEROUTE_MAX_TENANT_REQUESTS (0)        open completions per tenant, over it 429; 0 = no cap
  CACHEROUTE_TENANT_CACHE_SALT (0)          1: a per-tenant cache_salt to vllm replicas (tenants never share prefixes)
  CACHEROUTE_FIRST_BYTE_TIMEOUT (60)        seconds to an engine's headers and a stream's first event -> 504
  CACHEROUTE_UPSTREAM_TIMEOUT (600)         seconds without a byte from the engine -> 504
  CACHEROUTE_EJECT_SECONDS (5)              a replica that answered 5xx / timed out stays out this long
  CACHEROUTE_EJECT_AFTER (3)                ... after this many such failures in a row
  CACHEROUTE_MAX_EJECTED_FRACTION (0.5)     passive ejection keeps at least the other share in rotation
  CACHEROUTE_CONNECT_TIMEOUT (3)            seconds to connect to an engine (then one retry elsewhere)
  CACHEROUTE_CLIENT_WRITE_TIMEOUT (30)      a client that takes no write of its stream this long is dropped
                                            (its engine request cancelled; a client error, not the engine's)
  CACHEROUTE_HTTP_HEADER_TIMEOUT (20)       seconds from a request's first byte to its last header byte,
                                            then 408 and close (services/http/server.py: slowloris)
  CACHEROUTE_HTTP_BODY_TIMEOUT (60)         seconds to receive a request's whole body, then 408 and close
  CACHEROUTE_HTTP_IDLE_TIMEOUT (75)         seconds a client connection may sit idle (keep-alive), then closed
Engine credentials (services/auth.py, EngineKeys; never logged):
  CACHEROUTE_ENGINE_API_KEY ("")            key sent to every HTTP engine (Authorization: Bearer KEY)
  CACHEROUTE_ENGINE_API_KEYS_FILE ("")      file of `URL KEY` lines (that engine's key) or a `KEY` line (the rest)
  CACHEROUTE_FORWARD_CLIENT_AUTH (0)        1: send the client's own Authorization to HTTP engines instead
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from services.auth import engine_keys, keyring
from services.backends import KINDS, parse_endpoint
from services.dispatcher.budget import SCOPES, BudgetConfig
from services.dispatcher.http import HttpConfig
from services.dispatcher.plans import limit_arenas
from services.dispatcher.recordbus import DEFAULT_BATCH_MAX, DEFAULT_INTERVAL
from services.dispatcher.service import DispatcherConfig, serve
from services.dispatcher.servicer import KeyRules
from services.dispatcher.workers import WorkersConfig, resolve_workers, supervise
from services.flags import flag, switch
from services.http.server import HttpTimeouts
from services.model import COLD_TAILS, DEFAULT_COLD_TAIL, parse_replicas
from services.rpc import add_server_flags, run_service, server_config, setup_logging
from services.rpc.loops import use_uvloop


def add_dispatcher_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("dispatcher")
    flag(g, "--replicas", env="REPLICAS", default="", shown='"", required', help="id=host:port,...")
    flag(g, "--planner", env="PLANNER", default="", shown='"" = off', help="planner address")
    flag(g, "--redis", env="REDIS_URL", default="", shown='"" = off', help="Redis URL for the fallback plan read")
    flag(g, "--collector", env="COLLECTOR", default="", shown='"" = off', help="collector address")
    flag(g, "--dispatcher-id", env="DISPATCHER_ID", default="dispatcher-0", help="source id in telemetry and status")
    flag(g, "--key-blocks", env="KEY_BLOCKS", default=4, type=int, help="key = chained hash of the first N blocks")
    flag(g, "--key-tokens", env="KEY_TOKENS", default=64, type=int, help="key = hash of the first N prompt tokens")
    flag(g, "--prefix-nodes", env="PREFIX_NODES", default=0, type=int, choices=(0, 1), help="1: prefix-aware routing")
    flag(g, "--cold-tail", "--cold", dest="cold", env=("COLD_TAIL", "COLD"), default=DEFAULT_COLD_TAIL,
         empty_is_default=True, choices=COLD_TAILS, help="cold-tail policy")
    flag(g, "--hold-limit", env="HOLD_LIMIT", default=0.0, type=float,
         help="seconds a request may be held while KV is full, 0 = never")
    flag(g, "--poll-interval", env="POLL_INTERVAL", default=0.25, type=float, help="replica poll period, seconds")
    flag(g, "--poll-timeout", env="POLL_TIMEOUT", default=0.2, type=float, help="deadline of each poll RPC, seconds")
    flag(g, "--health-every", env="HEALTH_EVERY", default=1.0, type=float,
         help="seconds between an HTTP engine's /health checks while its /metrics answers (0 = every poll)")
    flag(g, "--telemetry-interval", env="TELEMETRY_INTERVAL", default=0.5, type=float, help="arrival flush period, seconds")
    flag(g, "--telemetry-capacity", env="TELEMETRY_CAPACITY", default=100000, type=int, help="buffered arrivals")
    flag(g, "--max-batch", env="MAX_BATCH", default=10000, type=int, help="RouteBatch requests per call")
    flag(g, "--record-bus", env="RECORD_BUS", default=1, type=int, choices=(0, 1),
         help="1: exchange routed requests with the other dispatchers over --redis (services/dispatcher/recordbus.py)")
    flag(g, "--record-interval", env="RECORD_INTERVAL", default=DEFAULT_INTERVAL, type=float,
         help="seconds between two record-bus batches")
    flag(g, "--record-batch-max", env="RECORD_BATCH_MAX", default=DEFAULT_BATCH_MAX, type=int,
         help="routed requests per record-bus batch, the rest dropped and counted")
    flag(g, "--record-handover", env="RECORD_HANDOVER", default=1, type=int, choices=(0, 1),
         help="1: a starting dispatcher asks its record-bus peers for their key memory and record, and "
              "answers a starting peer (services/dispatcher/recordbus.py, 'Hand-over')")
    flag(g, "--seed", env="SEED", default=None, type=int, shown="random", help="P2C seed")
    flag(g, "--caller-telemetry-rate", env="CALLER_TELEMETRY_RATE", default=100.0, type=float,
         help="Route/RouteBatch arrivals/s one caller may add to the planner's input, 0 = unbounded")
    flag(g, "--caller-telemetry-burst", env="CALLER_TELEMETRY_BURST", default=200.0, type=float,
         help="that budget's bucket size")
    flag(g, "--caller-telemetry-scope", env="CALLER_TELEMETRY_SCOPE", default="shared", choices=SCOPES,
         help="shared: one budget per caller across dispatchers, in the store (--redis); local: per dispatcher")
    flag(g, "--api-key", env="API_KEY", default=None, help="accepted API key")
    flag(g, "--api-key-file", env="API_KEY_FILE", default=None, help="file of key[:tenant] lines")
    flag(g, "--engine-kind", env="ENGINE_KIND", default="cacheroute", choices=KINDS,
         help="kind of replicas given without KIND+")
    flag(g, "--workers", env="WORKERS", default=0, type=int, help="worker processes sharing the ports, 0 = one per core")
    flag(g, "--uvloop", env="UVLOOP", default=1, type=int, choices=(0, 1),
         help="1: run on uvloop (less CPU per request), 0: asyncio's default loop")
    flag(g, "--malloc-arenas", env="MALLOC_ARENAS", default=2, type=int,
         help="glibc malloc arenas per serving process, 0 = glibc's default (services/dispatcher/plans.py)")
    g.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)   # set by the supervisor
    flag(parser, "--ext-proc-port", env="EXT_PROC_PORT", default=-1, type=int,
         help="Envoy ext_proc endpoint picker (services/dispatcher/extproc.py): -1 = off, 0 = ephemeral")


def add_http_flags(parser: argparse.ArgumentParser) -> None:
    """The OpenAI HTTP API's flags and the engine credentials (services/dispatcher/http.py, services/auth.py)."""
    h = parser.add_argument_group("OpenAI HTTP API")
    flag(h, "--http-port", env="HTTP_PORT", default=8080, type=int, help="-1 = off, 0 = ephemeral")
    flag(h, "--http-max-body-bytes", env="HTTP_MAX_BODY_BYTES", default=8 * 1024 * 1024, type=int,
         help="larger request bodies are 413")
    flag(h, "--max-output-tokens", env="MAX_OUTPUT_TOKENS", default=32768, type=int, help="larger max_tokens is 400")
    flag(h, "--upstream-timeout", env="UPSTREAM_TIMEOUT", default=600.0, type=float,
         help="seconds without a byte from the engine, then 504")
    flag(h, "--max-tenant-requests", env="MAX_TENANT_REQUESTS", default=0, type=int,
         help="open completions per tenant, over it 429; 0 = no cap")
    switch(h, "--tenant-cache-salt", env="TENANT_CACHE_SALT",
           help="send vllm replicas a per-tenant cache_salt so tenants never share cached prefixes")
    flag(h, "--first-byte-timeout", env="FIRST_BYTE_TIMEOUT", default=60.0, type=float,
         help="seconds to an engine's headers and a stream's first event, else 504 and a failure")
    flag(h, "--eject-seconds", env="EJECT_SECONDS", default=5.0, type=float, help="a failing replica stays out this long")
    flag(h, "--eject-after", env="EJECT_AFTER", default=3, type=int, help="... after this many failures in a row")
    flag(h, "--max-ejected-fraction", env="MAX_EJECTED_FRACTION", default=0.5, type=float,
         help="passive ejection keeps at least the other share in rotation")
    flag(h, "--connect-timeout", env="CONNECT_TIMEOUT", default=3.0, type=float, help="seconds to connect to an engine")
    flag(h, "--client-write-timeout", env="CLIENT_WRITE_TIMEOUT", default=30.0, type=float,
         help="seconds a client may take no write of its stream before it is dropped and its engine request cancelled")
    flag(h, "--http-header-timeout", env="HTTP_HEADER_TIMEOUT", default=20.0, type=float,
         help="seconds to a request's complete headers, then 408")
    flag(h, "--http-body-timeout", env="HTTP_BODY_TIMEOUT", default=60.0, type=float,
         help="seconds to a request's whole body, then 408")
    flag(h, "--http-idle-timeout", env="HTTP_IDLE_TIMEOUT", default=75.0, type=float,
         help="seconds an idle keep-alive connection is kept")
    c = parser.add_argument_group("engine credentials")
    flag(c, "--engine-api-key", env="ENGINE_API_KEY", default=None, help="API key sent to every HTTP engine")
    flag(c, "--engine-api-keys-file", env="ENGINE_API_KEYS_FILE", default=None,
         help="file of `URL KEY` lines, or a `KEY` line for the rest")
    switch(c, "--forward-client-auth", env="FORWARD_CLIENT_AUTH", help="send the client's Authorization to HTTP engines")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cacheroute serve dispatcher", description="A stateless dispatcher.",
                                     epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(parser, default_port=50053, default_metrics_port=9153)
    add_dispatcher_flags(parser)
    add_http_flags(parser)
    return parser


def http_config(args: argparse.Namespace, timeouts: HttpTimeouts) -> HttpConfig:
    return HttpConfig(host=args.host, port=args.http_port, max_body_bytes=args.http_max_body_bytes,
                      max_output_tokens=args.max_output_tokens, upstream_timeout=args.upstream_timeout,
                      first_byte_timeout=args.first_byte_timeout, max_tenant_requests=args.max_tenant_requests,
                      tenant_cache_salt=args.tenant_cache_salt,
                      eject_seconds=args.eject_seconds, eject_after=args.eject_after,
                      max_ejected_fraction=args.max_ejected_fraction, connect_timeout=args.connect_timeout,
                      key_tokens=args.key_tokens, client_write_timeout=args.client_write_timeout,
                      forward_client_auth=args.forward_client_auth, timeouts=timeouts)


def check_args(args: argparse.Namespace) -> None:
    """The bounds argparse cannot say; a ValueError is the flag's error message."""
    if args.key_blocks < 1 or args.key_tokens < 1:
        raise ValueError("--key-blocks and --key-tokens must be >= 1")
    if not (0 < args.poll_timeout and 0 < args.poll_interval):
        raise ValueError("--poll-interval and --poll-timeout must be > 0")
    if args.health_every < 0:
        raise ValueError("--health-every must be >= 0")
    if not 0 < args.record_interval <= 60 or args.record_batch_max < 1:
        raise ValueError("--record-interval must be in (0, 60] seconds and --record-batch-max >= 1")
    if args.eject_after < 1 or not 0.0 <= args.max_ejected_fraction <= 1.0 or not args.connect_timeout > 0 \
            or not args.first_byte_timeout > 0 or args.max_tenant_requests < 0 or not args.client_write_timeout > 0:
        raise ValueError("--eject-after must be >= 1, --max-ejected-fraction in [0, 1], --connect-timeout, "
                         "--first-byte-timeout and --client-write-timeout > 0, --max-tenant-requests >= 0")


def _parsed(what: str, build):
    """`build()`, its OSError/ValueError prefixed with `what` (the flag it came from, or "")."""
    try:
        return build()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: {exc}" if what else str(exc)) from None


def config_from_args(args: argparse.Namespace) -> DispatcherConfig:
    if args.workers < 0:
        raise ValueError("--workers must be >= 0 (0 = one per core)")
    if args.malloc_arenas < 0:
        raise ValueError("--malloc-arenas must be >= 0 (0 = glibc's default)")
    replicas = _parsed("--replicas", lambda: _replicas(args))
    check_args(args)
    budget = _parsed("", lambda: BudgetConfig(rate=args.caller_telemetry_rate, burst=args.caller_telemetry_burst,
                                              scope=args.caller_telemetry_scope))
    timeouts = _parsed("", lambda: HttpTimeouts(header=args.http_header_timeout, body=args.http_body_timeout,
                                                idle=args.http_idle_timeout))
    server = server_config("dispatcher", args)
    ring = _parsed("--api-key-file", lambda: keyring(args.api_key, args.api_key_file, server.auth_token))
    keys = _parsed("--engine-api-keys-file", lambda: engine_keys(args.engine_api_key, args.engine_api_keys_file))
    http = http_config(args, timeouts)
    if args.worker_index is not None:   # one of several workers on shared ports
        server = dataclasses.replace(server, reuse_port=True, announce="worker serving")
        http = dataclasses.replace(http, reuse_port=True)
    return DispatcherConfig(
        workers=resolve_workers(args.workers), worker_index=args.worker_index,
        server=server, replicas=replicas, dispatcher_id=args.dispatcher_id,
        planner=args.planner, redis_url=args.redis, collector=args.collector,
        rules=KeyRules(blocks=args.key_blocks, tokens=args.key_tokens, max_batch=args.max_batch),
        cold=args.cold, prefix_nodes=bool(args.prefix_nodes), hold_limit=args.hold_limit, poll_interval=args.poll_interval,
        poll_timeout=args.poll_timeout, health_every=args.health_every,
        telemetry_interval=args.telemetry_interval, telemetry_capacity=args.telemetry_capacity,
        seed=args.seed if args.seed is None or args.worker_index is None else args.seed + args.worker_index,
        budget=budget, engine_kind=args.engine_kind, http=http, keyring=ring, engine_keys=keys,
        ext_proc_port=args.ext_proc_port, uvloop=bool(args.uvloop),
        record_bus=bool(args.record_bus), record_interval=args.record_interval, record_batch_max=args.record_batch_max,
        record_handover=bool(args.record_handover), malloc_arenas=args.malloc_arenas)


def _replicas(args: argparse.Namespace) -> tuple:
    replicas = parse_replicas(args.replicas or "", need_address=True)
    for replica in replicas:
        parse_endpoint(replica.address, args.engine_kind)
    return replicas


def parse_args(argv: list[str] | None) -> DispatcherConfig:
    """Flags and environment -> DispatcherConfig; a bad value exits 2 with argparse's usage line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_args(args)
    except ValueError as exc:
        print(f"dispatcher: error: {exc}", file=sys.stderr)
        return 2
    if config.workers > 1 and config.worker_index is None:
        setup_logging("dispatcher", config.server.log_level)
        s = config.server
        return supervise(WorkersConfig(workers=config.workers, host=s.host, port=s.port, http_port=config.http.port,
                                       metrics_host=s.metrics_host, metrics_port=s.metrics_port,
                                       grace_seconds=s.grace_seconds, dispatcher_id=config.dispatcher_id), args)
    limit_arenas(config.malloc_arenas)
    use_uvloop(config.uvloop)
    return run_service("dispatcher", lambda: config, serve)


if __name__ == "__main__":
    sys.exit(main())
