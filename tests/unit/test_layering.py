"""The layering the tree promises (docs/architecture.md, "Layout"): the core and the domain
vocabulary are pure (no I/O libraries, no files, nothing from the layers above them) and the
product does not import the lab (experiments/, matplotlib, tqdm)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = sorted((ROOT / "services" / "core").rglob("*.py")) + [ROOT / "services" / "model.py"]
PRODUCT = [p for p in sorted((ROOT / "services").rglob("*.py")) if "sim" not in p.relative_to(ROOT).parts[1:2]]
ABOVE_CORE = ("services.sim", "services.store", "services.rpc", "services.planner", "services.collector",
              "services.dispatcher", "services.engine", "services.local", "clients",
              "grpc", "redis", "aiohttp", "socket", "subprocess", "experiments")
LAB = ("experiments", "matplotlib", "tqdm")
# services/local/ runs things on this machine (the stack, a redis-server, a Redis Cluster); a
# deployed service may use only its child launcher.
DEPLOYED = [p for p in PRODUCT if p.relative_to(ROOT).parts[1] not in ("local", "sim")]


@functools.lru_cache(maxsize=None)
def nodes(path: Path) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def imported(path: Path) -> set[str]:
    names = set()
    for node in nodes(path):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def calls_open(path: Path) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open" for n in nodes(path))


def test_the_core_and_the_model_are_pure():
    above = {str(p.relative_to(ROOT)): sorted(m for m in imported(p) if m.startswith(ABOVE_CORE)) for p in PURE}
    assert {p: m for p, m in above.items() if m} == {}
    assert [str(p.relative_to(ROOT)) for p in PURE if calls_open(p)] == []


def test_the_product_does_not_import_the_lab():
    lab = {str(p.relative_to(ROOT)): sorted(m for m in imported(p) if m.startswith(LAB)) for p in PRODUCT}
    assert {p: m for p, m in lab.items() if m} == {}


def test_deployed_services_use_only_the_launcher_from_local():
    local = {str(p.relative_to(ROOT)): sorted(m for m in imported(p) if m.startswith("services.local")
                                              and m != "services.local.launch") for p in DEPLOYED}
    assert {p: m for p, m in local.items() if m} == {}


def test_the_top_of_services_holds_only_what_every_service_shares():
    top = sorted(p.name for p in (ROOT / "services").glob("*.py"))
    assert top == ["__init__.py", "auth.py", "errors.py", "flags.py", "model.py"]
