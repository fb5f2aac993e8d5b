"""The numbers docs/architecture.md ("Imports, as they stand", "Size exceptions") quotes, measured
on the working tree with tests/unit/test_imports.py's ast import graph and test_sizes.py's limits.

    python scripts/architecture_numbers.py

- top level of services/: its packages and modules (__init__.py not counted);
- layers: floors of the graph of top-level units (services/<unit> and clients/<unit>), a unit's
  floor being one above the highest unit it imports (a unit that imports none is floor 1);
  printed for services/ alone and with clients/ on top;
- circles: strongly connected components of the module graph and of the unit graph;
- function-local project imports: import statements inside a function that import a project
  module (test_imports.function_local_imports), and how many files hold them;
- the largest product files (lines) and functions (lines, def to last line).
No I/O but reading the tree; nothing is imported from the project itself.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import test_imports as graph  # noqa: E402
import test_sizes as sizes  # noqa: E402


def unit(module: str) -> str | None:
    """services.dispatcher.http -> services.dispatcher; clients.cli.up -> clients.cli."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else None


def unit_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for name, targets in modules.items():
        u = unit(name)
        if u is None:
            continue
        units.setdefault(u, set())
        units[u] |= {t for t in map(unit, targets) if t and t != u}
    return units


def floors(units: dict[str, set[str]]) -> dict[str, int]:
    @functools.lru_cache(maxsize=None)
    def floor(u: str) -> int:
        return 1 + max((floor(t) for t in units.get(u, ())), default=0)
    return {u: floor(u) for u in units}


def main() -> int:
    modules = graph.import_graph()
    units = unit_graph(modules)
    top = sorted(p.name for p in (ROOT / "services").iterdir()
                 if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py"))
    packages = [n for n in top if not n.endswith(".py")]
    module_cycles, unit_cycles = graph.cycles(modules), graph.cycles(units)
    print(f"top level of services/: {len(top)} ({len(packages)} packages, {len(top) - len(packages)} modules): "
          + ", ".join(top))
    if not unit_cycles:
        f = floors(units)
        services = {u: n for u, n in f.items() if u.startswith("services.")}
        print(f"layers: {max(services.values())} floors inside services/, {max(f.values())} with clients/ on top")
        for n in range(1, max(f.values()) + 1):
            print(f"  floor {n}: " + " ".join(sorted(u for u, m in f.items() if m == n)))
    print(f"import circles: {len(module_cycles)} between modules, {len(unit_cycles)} between top-level units"
          + "".join(f"\n  {' -> '.join(c)}" for c in module_cycles + unit_cycles))
    local = graph.function_local_imports()
    print(f"function-local project imports: {sum(local.values())} in {len(local)} files")
    for name, n in sorted(local.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3d} {name}")
    files = sorted(((len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(ROOT)))
                    for p in sizes.PRODUCT), reverse=True)
    print(f"largest product files (limit {sizes.FILE_LINES}):")
    for n, name in files[:5]:
        print(f"  {n:4d} {name}")
    funcs = []
    for p in sizes.PRODUCT:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(ROOT)}:{node.name}"))
    print(f"largest functions (limit {sizes.FUNCTION_LINES}):")
    for n, name in sorted(funcs, reverse=True)[:8]:
        print(f"  {n:4d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
