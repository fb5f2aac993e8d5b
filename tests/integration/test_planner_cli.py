"""`cacheroute plans ...` against a real planner (own event loop in a thread) and real Redis."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from clients.cli import main
from tests.integration.test_planner import TOKEN, config
from services.planner.service import PlannerService


@pytest.fixture
def planner(redis_url):
    started = threading.Event()
    holder: dict = {}

    def run() -> None:
        async def body():
            service = await PlannerService(config(redis_url)).start()
            holder["address"], holder["loop"], holder["stop"] = service.address, asyncio.get_running_loop(), asyncio.Event()
            started.set()
            await holder["stop"].wait()
            await service.stop(0)

        asyncio.run(body())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    yield holder["address"]
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    thread.join(10)


def cli(capsys, *argv: str) -> tuple[int, dict | str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err.strip())


def test_plans_cli_round_trip(planner, capsys, tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    from clients.client import CacheRouteClient

    with CacheRouteClient(planner=planner, token=TOKEN) as client:
        v1 = client.build_plan({"a": 25.0, "b": 3.0}).plan.version
        v2 = client.build_plan({"a": 3.0, "c": 25.0}).plan.version
    common = ["--planner", planner]
    auth = common + ["--token-file", str(token_file)]

    code, denied = cli(capsys, "plans", "activate", str(v1), "--expected", "0", *common)
    assert code == 2 and denied.startswith("cacheroute: error: UNAUTHENTICATED")
    assert cli(capsys, "plans", "activate", str(v1), "--expected", "0", *auth)[1]["active_version"] == v1
    code, stale = cli(capsys, "plans", "activate", str(v2), "--expected", "0", *auth)
    assert code == 2 and "FAILED_PRECONDITION: stale expected version: active is 1" in stale
    assert cli(capsys, "plans", "activate", str(v2), "--expected", str(v1), *auth)[1]["previous_version"] == v1
    listed = cli(capsys, "plans", "list", *common)[1]
    assert [p["version"] for p in listed["plans"]] == [v2, v1] and listed["active_version"] == v2
    shown = cli(capsys, "plans", "show", "0", "--table", *common)[1]
    assert shown["version"] == v2 and {e["key"] for e in shown["table"]} == {"a", "c"}
    diff = cli(capsys, "plans", "diff", str(v1), str(v2), *common)[1]
    assert diff["keys_added"] == 1 and diff["keys_removed"] == 1
    assert cli(capsys, "plans", "rollback", "--expected", str(v2), *auth)[1]["active_version"] == v1
    assert cli(capsys, "plans", "mode", "flat", "--reason", "drill", *auth)[1]["mode"] == "MODE_FLAT"
    assert cli(capsys, "plans", "pin", *auth)[1]["pinned_version"] == v1
    assert cli(capsys, "plans", "unpin", *auth)[1]["pinned_version"] == 0
    status = cli(capsys, "plans", "status", *common)[1]
    assert status["mode_reason"] == "drill" and status["active_version"] == v1
    code, missing = cli(capsys, "plans", "show", "99", *common)
    assert code == 2 and missing == "cacheroute: error: NOT_FOUND: plan version 99 not found"
    code, no_file = cli(capsys, "plans", "unpin", "--planner", planner, "--token-file", str(tmp_path / "nope"))
    assert code == 2 and "cannot read token file" in no_file
