"""One way to declare a flag with its environment default (issue 25, item 5).

`flag(group, "--q-cap", env="Q_CAP", default=20.0, type=float, help="...")` adds the argparse
flag, reads its default from CACHEROUTE_Q_CAP (flags override it; a bad number is a one-line
ValueError naming the variable) and writes the help's "(env CACHEROUTE_Q_CAP, default 20)"
itself, so the text cannot drift from the value. `shown=` replaces the default's text where
the value is not what a reader should see (None, a computed default). `switch` is the same for
an on/off flag (`store_true`, on when the variable is set to anything but "", "0" or "false").
`env_table` renders the declared flags as a docstring's environment table. Pure: argparse and
os.environ only.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

PREFIX = "CACHEROUTE_"


def env(name: str, default: str = "") -> str:
    """CACHEROUTE_<name>, or `default` when unset."""
    return os.environ.get(PREFIX + name, default)


def env_number(name: str, default: str, kind: type[int] | type[float]) -> int | float:
    """A numeric default from CACHEROUTE_<name>; a bad value is a one-line ValueError naming the variable."""
    raw = env(name, default)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{PREFIX}{name}={raw!r} is not a valid {kind.__name__}") from None


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "none" if value is None else str(value)


def _first_set(names: tuple[str, ...]) -> tuple[str, str | None]:
    """(name, value) of the first CACHEROUTE_<name> that is set (value None: none is)."""
    for name in names:
        raw = os.environ.get(PREFIX + name)
        if raw is not None:
            return name, raw
    return names[0], None


def flag(group, *names: str, env: str | tuple[str, ...], default: Any = None, type: Callable | None = None,
         help: str = "", shown: str | None = None, empty_is_default: bool = False, **kwargs) -> argparse.Action:
    """`group.add_argument(*names, ...)` with the default from CACHEROUTE_<env> (see the module header).

    env may be a fallback chain ("DISPATCHERS", "DISPATCHER"): the first variable that is set
    decides, as if it were the only one (an empty one does not pass on to the next).
    type int/float: the variable is parsed as that number (ValueError naming it when bad); a
    None default stays None while the variable is unset or empty. Other types: the variable's
    text when set (with a None default, or `empty_is_default`: when non-empty), else `default`."""
    chain = (env,) if isinstance(env, str) else tuple(env)
    name, raw = _first_set(chain)
    if type in (int, float):
        if raw is None:
            value = None if default is None else env_number(name, str(default), type)
        else:
            value = env_number(name, raw, type) if default is not None or raw else None
    elif raw is None or (raw == "" and (default is None or empty_is_default)):
        value = default
    else:
        value = raw
    variables = ", then ".join(PREFIX + n for n in chain)
    suffix = f"env {variables}, default {shown if shown is not None else _text(default)}"
    text = f"{help} ({suffix})" if help else f"({suffix})"
    action = group.add_argument(*names, default=value, type=type, help=text, **kwargs)
    action.env = PREFIX + chain[0]
    action.envs = tuple(PREFIX + n for n in chain)
    action.shown = shown if shown is not None else _text(default)
    return action


def switch(group, *names: str, env: str, help: str = "") -> argparse.Action:
    """A `store_true` flag, on by default when CACHEROUTE_<env> is set to anything but "", "0", "false"."""
    value = os.environ.get(PREFIX + env, "") not in ("", "0", "false")
    suffix = f"env {PREFIX}{env}, default off"
    action = group.add_argument(*names, action="store_true", default=value,
                                help=f"{help} ({suffix})" if help else f"({suffix})")
    action.env = PREFIX + env
    action.shown = "off"
    return action


def declared(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's flags declared with `flag`, in declaration order."""
    return [a for a in parser._actions if getattr(a, "env", None)]


def env_table(parser: argparse.ArgumentParser, width: int = 48) -> str:
    """The declared flags as `  CACHEROUTE_X (default)   help` lines, for a module docstring."""
    lines = []
    for a in declared(parser):
        head = f"  {a.env} ({a.shown})"
        lines.append(f"{head:<{width}} {a.option_strings[0]}")
    return "\n".join(lines)
