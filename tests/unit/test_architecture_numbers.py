"""scripts/architecture_numbers.py measures the tree it is given (issue 25: docs/architecture.md
quotes its output). On a fixture checkout whose numbers are known by construction it reports
exactly them; its default is the checkout it lives in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "architecture_numbers.py"


def _long_function(name: str, lines: int) -> str:
    """A function of exactly `lines` lines, def line included."""
    return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 2)) + "    return 0\n"


FIXTURE = {
    "services/__init__.py": "",
    "services/a/__init__.py": "",
    "services/a/x.py": "import services.a.y\n",                 # x <-> y: one circle, inside unit services.a
    "services/a/y.py": "from services.a import x\n",
    "services/b/__init__.py": "",
    "services/b/z.py": "from services.a import x\n" + "Z = 1\n" * 600,              # 601 lines
    "services/c.py": ("import json\n\n\ndef lazy():\n    import os\n    from services.b import z\n"
                      "    return z, os, json\n\n\n" + _long_function("long", 61) + "\n\n" + _long_function("edge", 60)),
    "clients/__init__.py": "",
    "clients/cli/__init__.py": "from services import c\n",
}


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_it_reports_the_numbers_of_the_tree_it_is_given(tmp_path):
    for name, text in FIXTURE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert run(str(tmp_path)).splitlines() == [
        "modules: 9 in services/ and clients/ (package __init__s included)",
        "top level of services/: 3 (2 packages, 1 modules): a, b, c.py",
        # a imports nothing else (1); b imports a (2); c imports b, function-locally (3); clients.cli imports c (4)
        "layers: 3 floors inside services/, 4 with clients/ on top",
        "  floor 1: services.a",
        "  floor 2: services.b",
        "  floor 3: services.c",
        "  floor 4: clients.cli",
        "import circles: 1 between modules, 0 between top-level units",
        "  services.a.x -> services.a.y",
        "function-local project imports: 1 in 1 files",          # `import os` in lazy() is not the project's
        "    1 services.c",
        "product files over 600 lines: 1",
        "   601 services/b/z.py",
        "largest product files within the limit:",
        "   132 services/c.py",                                  # 9 + 61 + 2 blank + 60
        "     1 clients/cli/__init__.py",
        "     1 services/a/x.py",
        "functions over 60 lines: 1",
        "    61 services/c.py:long",
        "largest functions within the limit:",
        "    60 services/c.py:edge",
        "     4 services/c.py:lazy",
    ]


def test_by_default_it_measures_its_own_checkout():
    out = run()
    assert out == run(str(ROOT))
    assert "import circles: 0 between modules, 0 between top-level units" in out
