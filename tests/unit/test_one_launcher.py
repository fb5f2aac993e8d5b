"""One answer to "die with the parent" (issue 25 item 4): every product module that starts a
child process does it through services.local.launch (`setpriv --pdeathsig TERM`), none
through a `preexec_fn`, which runs Python in the forked child and can deadlock or abort
(grpc's "epoll_wait error: Bad file descriptor") once the parent has threads."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _preexec_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.keyword) and node.arg == "preexec_fn"]


def test_no_product_module_spawns_with_a_preexec_fn():
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "services").rglob("*.py"))
             if (lines := _preexec_calls(p))}
    assert found == {}


def test_dispatcher_workers_start_through_the_launcher():
    source = (ROOT / "services" / "dispatcher" / "workers.py").read_text(encoding="utf-8")
    assert "from services.local.launch import launcher" in source and "*launcher()" in source


def test_the_death_signal_is_written_once():
    found = [str(p.relative_to(ROOT)) for top in ("services", "clients", "bench", "tests", "scripts")
             for p in sorted((ROOT / top).rglob("*.py")) if '"--pdeath' 'sig"' in p.read_text(encoding="utf-8")]
    assert found == ["services/local/launch.py"]
