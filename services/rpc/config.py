"""Configuration every service shares: CACHEROUTE_* environment variables, the server flags
and `ServerConfig`.

Environment variables (flags override them; documented defaults in parentheses):
  CACHEROUTE_HOST (127.0.0.1)            address to bind
  CACHEROUTE_METRICS_HOST (127.0.0.1)    Prometheus HTTP bind address
  CACHEROUTE_PORT, CACHEROUTE_METRICS_PORT  gRPC and Prometheus ports (defaults in each service's __main__)
  CACHEROUTE_AUTH_TOKEN / CACHEROUTE_AUTH_TOKEN_FILE  bearer token required on control, telemetry and
                                         data-plane RPCs, and sent by the services that call them (none)
  CACHEROUTE_TLS_CERT, CACHEROUTE_TLS_KEY  server certificate and key (PEM files; plaintext if unset)
  CACHEROUTE_TLS_CLIENT_CA               require client certificates signed by this CA (mTLS)
  CACHEROUTE_TLS_CA                      CA that clients use to verify servers
  CACHEROUTE_MAX_MESSAGE_BYTES (8388608) gRPC send/receive limit
  CACHEROUTE_GRACE_SECONDS (5)           shutdown grace period
  CACHEROUTE_LOG_LEVEL (INFO)
Per-service ports come from each service's own flags/env (see its __main__).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from services.flags import env, env_number, flag
from services.rpc.tls import TLSFiles

__all__ = ["ServerConfig", "add_server_flags", "env", "env_number", "read_secret", "server_config"]


def read_secret(value: str | None, path: str | None) -> str | None:
    """A secret from its value or from a file (first line). Never logged."""
    if path:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip() or None
    return value or None


@dataclass(frozen=True)
class ServerConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 0                       # 0: ephemeral
    metrics_host: str = "127.0.0.1"
    metrics_port: int = -1              # -1: no metrics endpoint, 0: ephemeral
    auth_token: str | None = field(default=None, repr=False)
    tls: TLSFiles = TLSFiles()
    max_message_bytes: int = 8 * 1024 * 1024
    grace_seconds: float = 5.0
    log_level: str = "INFO"
    reuse_port: bool = False            # share the port with sibling processes (SO_REUSEPORT)
    announce: str = "serving"           # the bound-address log line's message (workers: "worker serving")


def add_server_flags(parser: argparse.ArgumentParser, *, default_port: int, default_metrics_port: int) -> None:
    """Flags every service shares. Defaults come from CACHEROUTE_* env vars, then the given values."""
    g = parser.add_argument_group("server")
    flag(g, "--host", env="HOST", default="127.0.0.1", help="bind address")
    flag(g, "--port", env="PORT", default=default_port, type=int, help="gRPC port, 0 = ephemeral")
    flag(g, "--metrics-host", env="METRICS_HOST", default="127.0.0.1", help="Prometheus HTTP bind address")
    flag(g, "--metrics-port", env="METRICS_PORT", default=default_metrics_port, type=int,
         help="Prometheus port, -1 = off, 0 = ephemeral")
    flag(g, "--auth-token-file", env="AUTH_TOKEN_FILE", default=None,
         help="file holding the bearer token (or the token itself in CACHEROUTE_AUTH_TOKEN): required on "
              "protected RPCs, sent on this service's telemetry calls")
    flag(g, "--tls-cert", env="TLS_CERT", default=None, shown="none = plaintext", help="server certificate (PEM)")
    flag(g, "--tls-key", env="TLS_KEY", default=None, help="server key (PEM)")
    flag(g, "--tls-client-ca", env="TLS_CLIENT_CA", default=None, help="require client certs (mTLS)")
    flag(g, "--tls-ca", env="TLS_CA", default=None, help="CA for verifying the services this one calls")
    flag(g, "--max-message-bytes", env="MAX_MESSAGE_BYTES", default=8 * 1024 * 1024, type=int,
         help="gRPC send/receive limit")
    flag(g, "--grace-seconds", env="GRACE_SECONDS", default=5.0, type=float, help="shutdown grace period")
    flag(g, "--log-level", env="LOG_LEVEL", default="INFO", help="log level")


def server_config(name: str, args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        name=name, host=args.host, port=args.port, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
        auth_token=read_secret(env("AUTH_TOKEN") or None, args.auth_token_file),
        tls=TLSFiles(args.tls_cert, args.tls_key, args.tls_client_ca, args.tls_ca),
        max_message_bytes=args.max_message_bytes, grace_seconds=args.grace_seconds, log_level=args.log_level,
    )
