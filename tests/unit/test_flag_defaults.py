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


if __name__ == "__main__":
    json.dump({m: dump(m) for m in sorted(MAINS)}, sys.stdout, indent=1, sort_keys=True)
    print()
