"""Fixtures for the fault-injection suite: real service processes on loopback, killed on
purpose, and always cleaned up (pass, fail or timeout)."""

from __future__ import annotations

import pytest

from tests.faults.procs import Procs


@pytest.fixture
def procs(tmp_path):
    registry = Procs(tmp_path / "logs")
    try:
        yield registry
    finally:
        registry.cleanup()
