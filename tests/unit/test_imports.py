"""No import circle (issue 25, item 2), hidden ones included.

1. Every module of services/ and clients/ imports on its own, at module top, in a fresh
   interpreter: a circle that only bites in one import order (core/prefixes.py reaching
   policies/_common through policies/__init__ -> cacheroute.py -> a partially initialised
   prefixes) fails here whichever module starts it.
2. The project's import graph, read with ast (module-top AND function-local imports, and the
   package `__init__` every import of a submodule runs), has no cycle, so no function-local
   import is left that only dodges one.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One clean driver forks a child per module (a fresh interpreter state: no project module
# imported yet), so 140 modules cost one interpreter start, not 140. `__main__` modules run
# their command when imported; `python -m` entry points are exercised by the CLI tests.
_DRIVER = r"""
import importlib, os, sys
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print(" ".join(failed))
"""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of services/ and clients/ under `root` (a checkout; this one by default)."""
    return {module_name(p, root): p for top in ("services", "clients") for p in sorted((root / top).rglob("*.py"))}


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _base(node: ast.ImportFrom, name: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def _imported(node: ast.AST, name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Project modules (of `known`) one import statement runs: the named modules (a `from P import m`
    of a submodule names P.m) and their packages, except the importer's own packages (already running)."""
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        base = _base(node, name, path)
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        named = subs + ([base] if len(subs) < len(node.names) or base not in _ancestors(name) else [])
    out = set()
    for n in named:
        if n in known:
            out.add(n)
            out |= {a for a in _ancestors(n) if a in known and a not in _ancestors(name)}
    out.discard(name)
    return sorted(out)


def imports(name: str, root: Path = ROOT) -> list[tuple[str, bool]]:
    """(imported project module, function-local?) for every import statement in the module."""
    known = modules(root)
    path = known[name]
    found = []

    def walk(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, local) for t in _imported(child, name, path, known))
            walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    return {name: {t for t, _ in imports(name, root)} for name in modules(root)}


def function_local_imports(root: Path = ROOT) -> dict[str, int]:
    """Function-local import statements of project modules, per module (docs/architecture.md)."""
    counts = {}
    known = modules(root)
    for name, path in known.items():
        n = 0
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n += sum(1 for s in ast.walk(fn) if isinstance(s, (ast.Import, ast.ImportFrom))
                         and _imported(s, name, path, known))
        if n:
            counts[name] = n
    return counts


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    names = [n for n in modules() if not n.endswith("__main__")]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}
    done = subprocess.run([sys.executable, "-c", _DRIVER, *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [], done.stderr[-4000:]
