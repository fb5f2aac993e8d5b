"""What every service shares around gRPC, one concern per module:

  config.py       CACHEROUTE_* env vars, the server flags, `ServerConfig`
  tls.py          `TLSFiles`: server and channel credentials
  channels.py     client channels (options, reconnect backoff, bearer metadata)
  server.py       `start_server`, `RunningServer` (graceful stop), `run_service` (a main's body)
  interceptor.py  auth on protected methods, error -> status mapping, malformed requests
  metrics.py      `RpcMetrics`, a per-server Prometheus registry
  loops.py        background loops: `Backoff`, `every`, `stop_tasks`
  logs.py         JSON logs: `setup_logging`, `kv`

`from services.rpc import X` works for each name below.
"""

from services.rpc.channels import FAST_RECONNECT, aio_channel, bearer_metadata, channel_options
from services.rpc.config import ServerConfig, add_server_flags, env, env_number, read_secret, server_config
from services.rpc.interceptor import ServiceInterceptor
from services.rpc.logs import JsonFormatter, kv, setup_logging
from services.rpc.loops import Backoff, every, stop_tasks
from services.rpc.metrics import RpcMetrics
from services.rpc.server import RunningServer, Service, run_service, start_server
from services.rpc.tls import TLSFiles

__all__ = [
    "FAST_RECONNECT", "Backoff", "JsonFormatter", "RpcMetrics", "RunningServer", "ServerConfig", "Service",
    "ServiceInterceptor", "TLSFiles", "add_server_flags", "aio_channel", "bearer_metadata", "channel_options",
    "env", "env_number", "every", "kv", "read_secret", "run_service", "server_config", "setup_logging",
    "start_server", "stop_tasks",
]
