"""Fixtures for the fault-injection suite: real service processes on loopback, killed on
purpose, and always cleaned up (pass, fail or timeout): `procs`, in tests/conftest.py (the
integration suite's worker tests use it too)."""
