"""`cacheroute up --engines/--engine-kind/--model`: the stack's engine list as dispatchers and the
planner receive it, and the configuration errors (services.local.stack, clients.cli.up)."""

from __future__ import annotations

import argparse

import pytest

from clients.cli import CliError
from clients.cli.up import add_up, stack_config
from services.local.stack import Stack, StackConfig, parse_http_line


def up_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_up(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def test_external_engines_get_ids_and_their_kind(tmp_path):
    config = stack_config(up_args("--engines", "http://10.0.0.5:8000, sglang+http://10.0.0.6:30000",
                                  "--engine-kind", "vllm", "--log-dir", str(tmp_path)))
    assert config.engines == 2 and config.engine_urls == ("http://10.0.0.5:8000", "sglang+http://10.0.0.6:30000")
    stack = Stack(config)
    assert stack.engines == {"engine-1": "vllm+http://10.0.0.5:8000", "engine-2": "sglang+http://10.0.0.6:30000"}
    assert stack.engines_http == ["http://10.0.0.5:8000", "http://10.0.0.6:30000"]


@pytest.mark.parametrize("argv,message", [
    (("--model", "x.gguf"), "--model needs --engine-kind llamacpp"),
    (("--engine-kind", "llamacpp"), "--model PATH"),
    (("--engine-kind", "llamacpp", "--model", "/nonexistent.gguf"), "no file"),
])
def test_bad_engine_flags_are_one_line_errors(argv, message):
    with pytest.raises(CliError) as info:
        stack_config(up_args(*argv))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_stack_config_checks_kinds():
    with pytest.raises(ValueError):
        StackConfig(engine_kind="tgi")
    with pytest.raises(ValueError):
        StackConfig(engine_urls=("http://x:1",))            # URLs need an HTTP kind
    with pytest.raises(ValueError):
        StackConfig(engine_kind="vllm", llamacpp_model="m.gguf")


def test_the_http_serving_line():
    assert parse_http_line(b'{"msg":"http serving","url":"http://127.0.0.1:5"}') == "http://127.0.0.1:5"
    assert parse_http_line(b'{"msg":"serving","address":"x"}') is None and parse_http_line(b"http serving") is None
