"""The numbers docs/architecture.md ("Imports, as they stand", "Size exceptions") quotes, measured
on a checkout's working tree with tests/unit/test_imports.py's ast import graph and
test_sizes.py's limits (the analysis is this checkout's; the tree measured is ROOT's).

    python scripts/architecture_numbers.py [ROOT]      # ROOT: default, the checkout this file lives in

- modules: every module of services/ and clients/ (package __init__s included);
- top level of services/: its packages and modules (__init__.py not counted);
- layers: floors of the graph of top-level units (services/<unit> and clients/<unit>), a unit's
  floor being one above the highest unit it imports (a unit that imports none is floor 1);
  printed for services/ alone and with clients/ on top (not when the units form a circle);
- circles: strongly connected components of the module graph and of the unit graph;
- function-local project imports: import statements inside a function that import a project
  module (test_imports.function_local_imports), and how many files hold them;
- product files over the 600-line limit and functions over 60 lines, then the largest within them.
No I/O but reading the tree; nothing is imported from the measured tree itself.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT / "tests" / "unit"))

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


def imports_report(root: Path) -> list[str]:
    """The module count, the front hall, layers, circles and function-local imports, as lines."""
    modules = graph.import_graph(root)
    units = unit_graph(modules)
    top = sorted(p.name for p in (root / "services").iterdir()
                 if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py"))
    packages = [n for n in top if not n.endswith(".py")]
    module_cycles, unit_cycles = graph.cycles(modules), graph.cycles(units)
    lines = [f"modules: {len(modules)} in services/ and clients/ (package __init__s included)",
             f"top level of services/: {len(top)} ({len(packages)} packages, {len(top) - len(packages)} modules): "
             + ", ".join(top)]
    if not unit_cycles:
        f = floors(units)
        inside = [n for u, n in f.items() if u.startswith("services.")]
        lines.append(f"layers: {max(inside, default=0)} floors inside services/, {max(f.values(), default=0)}"
                     " with clients/ on top")
        lines += [f"  floor {n}: " + " ".join(sorted(u for u, m in f.items() if m == n))
                  for n in range(1, max(f.values(), default=0) + 1)]
    lines.append(f"import circles: {len(module_cycles)} between modules, {len(unit_cycles)} between top-level units")
    lines += [f"  {' -> '.join(c)}" for c in module_cycles + unit_cycles]
    local = graph.function_local_imports(root)
    lines.append(f"function-local project imports: {sum(local.values())} in {len(local)} files")
    lines += [f"  {n:3d} {name}" for name, n in sorted(local.items(), key=lambda kv: (-kv[1], kv[0]))]
    return lines


def sizes_report(root: Path, largest: int = 3) -> list[str]:
    """Files and functions over the limits (every one), then the largest within them, as lines."""
    files = sorted(((n, name) for name, n in sizes.file_lines(root).items()), key=lambda x: (-x[0], x[1]))
    funcs = sorted(((n, name) for name, n in sizes.function_lines(root)), key=lambda x: (-x[0], x[1]))
    lines = []
    for what, rows, limit in (("product files", files, sizes.FILE_LINES), ("functions", funcs, sizes.FUNCTION_LINES)):
        over = [r for r in rows if r[0] > limit]
        lines.append(f"{what} over {limit} lines: {len(over)}")
        lines += [f"  {n:4d} {name}" for n, name in over]
        lines.append(f"largest {what} within the limit:")
        lines += [f"  {n:4d} {name}" for n, name in [r for r in rows if r[0] <= limit][:largest]]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", type=Path, default=CHECKOUT,
                    help="the checkout to measure (default: the one this script lives in)")
    root = ap.parse_args(argv).root.resolve()
    if not (root / "services").is_dir():
        ap.error(f"{root} has no services/ folder")
    print("\n".join(imports_report(root) + sizes_report(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
