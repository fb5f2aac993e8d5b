"""experiments.run --only: re-run rows replace theirs in place; --keep-old keeps the replaced ones."""

from experiments import run


def row(cap):
    return {"capacity": cap, "censored": "none", "points": []}


def test_merge_replaces_in_place_and_keeps_old_rows_under_the_tag():
    stored = {"flat": row(100), "cacheroute": row(250), "cacheroute-unguarded": row(240)}
    merged = run.merge_rows(stored, {"cacheroute": row(275)}, "p2c-tail")
    assert list(merged) == ["flat", "cacheroute", "cacheroute-unguarded", "cacheroute-p2c-tail"]
    assert merged["cacheroute"]["capacity"] == 275
    assert merged["cacheroute-p2c-tail"]["capacity"] == 250
    assert merged["cacheroute-unguarded"]["capacity"] == 240


def test_merge_without_tag_drops_the_old_row_and_appends_new_policies():
    merged = run.merge_rows({"flat": row(100), "cacheroute": row(250)}, {"cacheroute": row(200), "sglang": row(300)},
                            None)
    assert list(merged) == ["flat", "cacheroute", "sglang"]
    assert merged["cacheroute"]["capacity"] == 200


def test_only_replaces_the_policies_argument_of_the_stored_command():
    argv = run.command("burst", out="/tmp/x", policies="cacheroute")
    assert argv[argv.index("--policies") + 1] == "cacheroute"
    assert argv[argv.index("--out") + 1].endswith("x")
    assert run.command("burst")[run.command("burst").index("--policies") + 1] == "flat,cacheroute"


def test_merge_points_extends_the_grid_and_recomputes_capacity():
    from services.sim.runs import capacity_report

    pt = lambda q, p99: {"offered_qps": q, "ttft_p99": p99}   # noqa: E731
    base = {"a": capacity_report([pt(100, 0.2), pt(200, 0.3)], 3.5), "b": capacity_report([pt(100, 0.2)], 3.5)}
    more = {"a": capacity_report([pt(300, 1.0), pt(400, 9.0)], 3.5), "c": capacity_report([pt(300, 1.0)], 3.5)}
    merged = run.merge_points(base, more, capacity_report)
    assert [p["offered_qps"] for p in merged["a"]["points"]] == [100, 200, 300, 400]
    assert merged["a"]["capacity"] == 300 and merged["a"]["censored"] == "none"
    assert merged["b"] == base["b"] and "c" not in merged
