"""The committed stubs must be exactly what the pinned grpcio-tools generates."""

from __future__ import annotations

import filecmp
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_regeneration(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed_dir = ROOT / "protos"
    committed = sorted(p.relative_to(committed_dir) for p in committed_dir.rglob("*_pb2*.py*"))
    assert fresh == committed, "stubs added or missing: run `make protos`"
    stale = [str(p) for p in fresh if not filecmp.cmp(tmp_path / p, committed_dir / p, shallow=False)]
    assert not stale, f"stale stubs {stale}: run `make protos`"


def test_services_are_declared():
    from cacheroute.v1 import collector_pb2, dispatcher_pb2, engine_pb2, planner_pb2

    names = {f.services_by_name[s].full_name for f in (m.DESCRIPTOR for m in (collector_pb2, dispatcher_pb2, engine_pb2, planner_pb2)) for s in f.services_by_name}
    assert names == {"cacheroute.v1.Collector", "cacheroute.v1.Dispatcher", "cacheroute.v1.Engine", "cacheroute.v1.Planner"}
    assert "cacheroute" in sys.modules
