"""bench/control_loop.py's dispatcher memory: the workers' RSS, not only the supervisor's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("bench_control_loop", ROOT / "bench" / "control_loop.py")
control_loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(control_loop)

# a parent holding nothing whose one child holds 200 MiB, as a supervisor and its worker do
_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ok', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE)
child.stdout.readline()
print('ready', flush=True)
time.sleep(60)
"""


def test_tree_rss_counts_the_workers_memory():
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        own = control_loop.rss_mib(proc.pid)
        total, per_child = control_loop.tree_rss(proc.pid)
        assert own < 100                           # the supervisor alone: what the bench printed before
        assert len(per_child) == 1 and per_child[0] >= 200
        assert total >= own + per_child[0] - 1e-9
    finally:
        for pid in control_loop.children(proc.pid):
            subprocess.run(["kill", str(pid)], check=False)
        proc.kill()
        proc.wait()


def test_tree_rss_of_a_process_without_children_is_its_own():
    proc = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        total, per_child = control_loop.tree_rss(proc.pid)
        assert per_child == []
        assert abs(total - control_loop.rss_mib(proc.pid)) < 1.0
    finally:
        proc.kill()
        proc.wait()
