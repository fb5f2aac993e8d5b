"""`cacheroute plans` refuses negative or oversized numbers with one line and exit 2 (no traceback)."""

from __future__ import annotations

import pytest

from clients.cli import main

CASES = [
    (["plans", "show", "-1"], "version must be >= 0, got -1"),
    (["plans", "list", "--limit", "-5"], "--limit must be >= 0, got -5"),
    (["plans", "activate", "5", "--expected", "-1"], "--expected must be >= 0, got -1"),
    (["plans", "diff", "1", str(2**64)], "b must be at most 18446744073709551615"),
    (["plans", "rollback", "--expected", "1", "--to", "-3"], "--to must be >= 0, got -3"),
    (["plans", "list", "--limit", str(2**32)], "--limit must be at most 4294967295"),
]


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(c[0][1:3]) for c in CASES])
def test_bad_numbers_are_one_line_errors(argv, message, capsys):
    # an unreachable planner: the check happens before any call
    code = main([*argv, "--planner", "127.0.0.1:1", "--timeout", "0.2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
