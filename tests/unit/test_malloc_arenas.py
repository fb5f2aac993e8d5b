"""The dispatcher's malloc-arena limit (services/dispatcher/plans.py, `limit_arenas`): set through
glibc's mallopt in a fresh process, left alone for 0, for an operator's MALLOC_ARENA_MAX, and a
negative flag refused with a one-line error."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from services.dispatcher.__main__ import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _limit(n: int, env: dict) -> str:
    code = f"from services.dispatcher.plans import limit_arenas; print(limit_arenas({n}))"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)},
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_the_limit_is_set_on_glibc_and_left_alone_for_0_or_the_operators_own():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _limit(2, env) == "True"
    assert _limit(0, env) == "False"
    assert _limit(2, {**env, "MALLOC_ARENA_MAX": "4"}) == "False"


def test_the_flag_defaults_to_2_and_refuses_a_negative_count(capsys):
    assert parse_args(["--replicas", "e1=127.0.0.1:1"]).malloc_arenas == 2
    assert parse_args(["--replicas", "e1=127.0.0.1:1", "--malloc-arenas", "0"]).malloc_arenas == 0
    with pytest.raises(SystemExit) as exited:
        parse_args(["--replicas", "e1=127.0.0.1:1", "--malloc-arenas", "-1"])
    assert exited.value.code == 2
    assert "--malloc-arenas must be >= 0" in capsys.readouterr().err
