"""Every main's parsed defaults and the CACHEROUTE_* variables it reads stay as they were
(issue 25, item 5: the flags moved to one helper, services/flags.py, with no change of behaviour).

The snapshot (tests/unit/data/flag_defaults.json) was taken before the move. Regenerate it only
for an intended change: `python tests/unit/test_flag_defaults.py > tests/unit/data/flag_defaults.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

_PARSERS: dict[str, argparse.ArgumentParser] = {}
SNAPSHOT = Path(__file__).parent / "data" / "flag_defaults.json"
# the least argv each main accepts with an empty environment
MAINS = {
    "services.planner.__main__": ["--replicas", "r0"],
    "services.dispatcher.__main__": ["--replicas", "r0=127.0.0.1:1"],
    "services.collector.__main__": [],
    "services.engine.__main__": [],
}


class _Recording(dict):
    """os.environ stand-in that records every name looked up."""

    def __init__(self, base):
        super().__init__(base)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def dump(module: str) -> dict:
    """{"defaults": {dest: repr(value)}, "env": [CACHEROUTE_* names read]} of one main."""
    import importlib

    mod = importlib.import_module(module)
    seen: list[argparse.Namespace] = []
    parsers: list[argparse.ArgumentParser] = []
    real_parse = argparse.ArgumentParser.parse_args
    real_environ = os.environ
    clean = _Recording({k: v for k, v in real_environ.items() if not k.startswith("CACHEROUTE_")})

    def parse(self, args=None, namespace=None):
        ns = real_parse(self, args, namespace)
        seen.append(ns)
        parsers.append(self)
        return ns

    argparse.ArgumentParser.parse_args = parse
    os.environ = clean
    try:
        if hasattr(mod, "parse_args"):           # the whole of flags -> config (reads CACHEROUTE_AUTH_TOKEN too)
            mod.parse_args(MAINS[module])
        else:
            mod.build_parser().parse_args(MAINS[module])
    finally:
        argparse.ArgumentParser.parse_args = real_parse
        os.environ = real_environ
    _PARSERS[module] = parsers[0]
    pid = str(os.getpid())                        # the planner id's default is hostname-pid
    return {"defaults": {k: repr(v).replace(pid, "<pid>") for k, v in sorted(vars(seen[0]).items())},
            "env": sorted(n for n in clean.read if n.startswith("CACHEROUTE_"))}


@pytest.mark.parametrize("module", sorted(MAINS))
def test_defaults_and_env_names_are_unchanged(module):
    assert dump(module) == json.loads(SNAPSHOT.read_text())[module]



# every main declares its flags with services.flags.flag (and the server flags, services/rpc/config.py)
DECLARED = tuple(sorted(MAINS))


@pytest.mark.parametrize("module", DECLARED)
def test_every_declared_flag_is_in_the_docstring_env_table(module):
    """Flags declared with services.flags.flag name their variable in the main's docstring
    (the server and store flags in services/rpc/config.py's and the main's own)."""
    import importlib

    from services.flags import declared

    dump(module)
    docs = importlib.import_module(module).__doc__ + importlib.import_module("services.rpc.config").__doc__
    names = [a.env for a in declared(_PARSERS[module])]
    assert names, "no flag declared with services.flags.flag"
    assert [n for n in names if n not in docs] == []


@pytest.mark.parametrize("module", DECLARED)
def test_no_flag_help_is_written_by_hand(module):
    """Every flag of a main (but argparse's own --help and hidden ones) is declared with
    services.flags, which writes "(env CACHEROUTE_X, default Y)" itself."""
    from services.flags import declared

    dump(module)
    parser = _PARSERS[module]
    hand = [a.option_strings[0] for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help" and a not in declared(parser)]
    assert hand == []
    assert all(a.help.count("(env CACHEROUTE_") == 1 for a in declared(parser))


def _cli_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every `cacheroute` command's parser (subcommands included) and llamacpp's, built in a
    recorded environment: (name, parser), plus the CACHEROUTE_* names read while building them."""
    from clients.cli import build_parser
    from services.engine import llamacpp

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        out.append((name, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub, sp in a.choices.items():
                    walk(sp, f"{name} {sub}")

    real_parse = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        walk(self, "llamacpp")
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        llamacpp.parse_args([])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args = real_parse
    walk(build_parser(), "cacheroute")
    return out


def test_cli_and_llamacpp_flags_that_read_the_environment_are_declared():
    """No CLI or llama.cpp flag writes "(env CACHEROUTE_...)" by hand or reads a CACHEROUTE_*
    default silently: every variable read while the parsers are built is a declared flag's."""
    from services.flags import declared

    real_environ = os.environ
    clean = _Recording({k: v for k, v in real_environ.items() if not k.startswith("CACHEROUTE_")})
    os.environ = clean
    try:
        parsers = _cli_parsers()
    finally:
        os.environ = real_environ
    names = {n for _, p in parsers for a in declared(p) for n in a.envs}
    assert {n for n in clean.read if n.startswith("CACHEROUTE_")} - names == set()
    hand = [f"{name} {a.option_strings[0]}" for name, p in parsers for a in p._actions
            if a.option_strings and a.help and "CACHEROUTE_" in a.help and a not in declared(p)]
    assert hand == []
    assert all(a.help.count("(env CACHEROUTE_") == 1 for _, p in parsers for a in declared(p))


@pytest.mark.parametrize("environ, expected", [
    ({}, "127.0.0.1:50053"),
    ({"CACHEROUTE_DISPATCHER": "b:1"}, "b:1"),
    ({"CACHEROUTE_DISPATCHERS": "a:1,a:2", "CACHEROUTE_DISPATCHER": "b:1"}, "a:1,a:2"),
    ({"CACHEROUTE_DISPATCHERS": "", "CACHEROUTE_DISPATCHER": "b:1"}, "127.0.0.1:50053"),   # empty: the default
    ({"CACHEROUTE_DISPATCHER": ""}, "127.0.0.1:50053"),
])
def test_dispatchers_read_dispatchers_then_dispatcher_then_the_default(monkeypatch, environ, expected):
    from clients.cli import add_address_flags

    for k in ("CACHEROUTE_DISPATCHERS", "CACHEROUTE_DISPATCHER"):
        monkeypatch.delenv(k, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    p = argparse.ArgumentParser()
    add_address_flags(p, dispatchers=True)
    assert p.parse_args([]).dispatchers == expected
    assert p.parse_args(["--dispatcher", "c:1"]).dispatchers == "c:1"
    none = argparse.ArgumentParser()
    add_address_flags(none, dispatchers=True, dispatchers_default=None)
    assert none.parse_args([]).dispatchers == (None if expected == "127.0.0.1:50053" else expected)


def test_a_numeric_chain_names_the_variable_that_was_bad(monkeypatch):
    from services.flags import flag

    monkeypatch.delenv("CACHEROUTE_T_A", raising=False)
    monkeypatch.setenv("CACHEROUTE_T_B", "3")
    p = argparse.ArgumentParser()
    action = flag(p, "--t", env=("T_A", "T_B"), default=1.0, type=float, help="t")
    assert p.parse_args([]).t == 3.0
    assert action.help == "t (env CACHEROUTE_T_A, then CACHEROUTE_T_B, default 1)"
    monkeypatch.setenv("CACHEROUTE_T_A", "x")
    with pytest.raises(ValueError, match="CACHEROUTE_T_A='x'"):
        flag(argparse.ArgumentParser(), "--t", env=("T_A", "T_B"), default=1.0, type=float)


# (main's flag adder, dest, variables in fallback order, their values, the default): the flags whose
# default falls back to another service's variable (the gate replays the engines' figures; --cold-tail
# keeps the old CACHEROUTE_COLD). Declared with the helper's chain, so the help names the order too.
CHAINS = [
    ("services.planner.__main__:add_gate_flags", "gate_profile", ("GATE_PROFILE", "PROFILE"),
     ("llama3-70b-fp8-h100x2", "qwen2.5-32b-fp8-h100"), "llama3-8b-h100"),
    ("services.planner.__main__:add_gate_flags", "gate_kv_blocks", ("GATE_KV_BLOCKS", "KV_BLOCKS"), (111, 222), None),
    ("services.planner.__main__:add_gate_flags", "gate_time_scale", ("GATE_TIME_SCALE", "TIME_SCALE"), (0.25, 0.5), 1.0),
    ("services.dispatcher.__main__:add_dispatcher_flags", "cold", ("COLD_TAIL", "COLD"), ("p2c", "chwbl"), "chwbl"),
]


@pytest.mark.parametrize("adder, dest, names, values, default", CHAINS, ids=[c[1] for c in CHAINS])
def test_a_fallback_flag_reads_its_own_variable_then_the_engines_then_its_default(
        monkeypatch, adder, dest, names, values, default):
    import importlib

    module, func = adder.split(":")
    add = getattr(importlib.import_module(module), func)
    first, second = (f"CACHEROUTE_{n}" for n in names)

    def parsed(environ: dict[str, object]) -> tuple[object, argparse.Action]:
        for k in [k for k in os.environ if k.startswith("CACHEROUTE_")]:
            monkeypatch.delenv(k)
        for k, v in environ.items():
            monkeypatch.setenv(k, str(v))
        p = argparse.ArgumentParser()
        add(p)
        action = next(a for a in p._actions if a.dest == dest)
        return p.parse_args(["--replicas", "r0"] if "--replicas" in p._option_string_actions else []).__dict__[dest], action

    value, action = parsed({})
    assert value == default
    assert f"(env {first}, then {second}, default " in action.help      # the helper wrote it, in this order
    assert parsed({second: values[1]})[0] == values[1]
    assert parsed({first: values[0], second: values[1]})[0] == values[0]
    assert parsed({first: values[0]})[0] == values[0]
    if isinstance(default, float) or default is None:       # numbers: a bad value names its variable
        with pytest.raises(ValueError, match=f"{second}='x'"):
            parsed({second: "x"})
    else:                                                   # text: an empty variable means the default
        assert parsed({first: "", second: values[1]})[0] == default
        assert parsed({second: ""})[0] == default


if __name__ == "__main__":
    json.dump({m: dump(m) for m in sorted(MAINS)}, sys.stdout, indent=1, sort_keys=True)
    print()
