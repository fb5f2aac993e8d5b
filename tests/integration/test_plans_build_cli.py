"""`cacheroute plans build` against a real planner: from a rates file, activated, printed without
its table; bad flags and files are one-line errors."""

from __future__ import annotations

from tests.integration.test_planner import TOKEN
from tests.integration.test_planner_cli import cli, planner  # noqa: F401  (the fixture)


def test_plans_build_from_a_rates_file(planner, capsys, tmp_path):  # noqa: F811
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    rates = tmp_path / "rates.csv"
    rates.write_text("key,rate\n" + "".join(f"k{i},{1 + i % 9}\n" for i in range(500)))
    auth = ["--planner", planner, "--token-file", str(token_file)]
    code, out = cli(capsys, "plans", "build", "--rates", str(rates), "--activate", "--expected", "0",
                    "--warm-slots", "500", *auth)
    assert code == 0 and out["activated"] and out["plan"]["admitted_keys"] == 500
    assert "table" not in out["plan"] or out["plan"]["table"] == []
    assert cli(capsys, "plans", "status", *auth)[1]["active_version"] == out["plan"]["version"]
    code, err = cli(capsys, "plans", "build", "--rates", str(rates), "--activate", *auth)
    assert code == 2 and "--activate needs --expected" in err
    bad = tmp_path / "bad.csv"
    bad.write_text("key,rate\na,-1\n")
    code, err = cli(capsys, "plans", "build", "--rates", str(bad), *auth)
    assert code == 2 and "must be finite and >= 0" in err
    code, err = cli(capsys, "plans", "build", "--rates", str(rates), "--planner", planner)
    assert code == 2 and "UNAUTHENTICATED" in err
