import json

import numpy as np
import pytest

from experiments.run import AZURE_CONVERSATION as AZURE
from experiments.run import MOONCAKE_CONVERSATION as CONVERSATION
from experiments.run import MOONCAKE_SYNTHETIC as SYNTHETIC
from experiments.run import data_path
from services.core.request import BLOCK_TOKENS
from services.core.traces import ideal_hit_rate
from services.sim.tracefiles import load_azure, load_mooncake


def real(path: str) -> str:
    """A real trace under $CACHEROUTE_DATA (experiments.run's names); unset, the test fails in one line."""
    try:
        return data_path(path)
    except SystemExit as e:
        pytest.fail(str(e), pytrace=False)


def write_jsonl(tmp_path, records, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 3000, "input_length": 1500, "output_length": 0, "hash_ids": [0, 1, 3]},
    {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 4]},
    {"timestamp": 9000, "input_length": 512, "output_length": 7, "hash_ids": [5]},
]


def test_mooncake_block_mapping_keeps_chaining(tmp_path):
    w = load_mooncake(write_jsonl(tmp_path, MOONCAKE))
    a, b, c, d = w.requests
    assert len(a.blocks) == 1100 // 16                       # 32 + 32 + 4 (76 of 512 tokens)
    assert a.blocks[:64] == b.blocks[:64]                    # shared ids 0, 1
    assert a.blocks[64] != b.blocks[64]                      # id 2 vs id 3
    assert len(b.blocks) == 1500 // 16
    assert a.blocks[:32] == c.blocks[:32] and len(c.blocks) == 600 // 16
    assert len(d.blocks) == 32 and not set(d.blocks) & set(a.blocks)
    assert len(set(a.blocks)) == len(a.blocks)
    # a final partial id covers a prefix of the same id's full hashes
    full = load_mooncake(write_jsonl(tmp_path, [
        {"timestamp": 0, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]}], "f.jsonl"))
    assert full.requests[0].blocks[:68] == a.blocks


def test_mooncake_keys_times_and_lengths(tmp_path):
    w = load_mooncake(write_jsonl(tmp_path, MOONCAKE))
    assert [r.key for r in w.requests] == ["0-1", "0-1", "0-4", "5"]
    assert [r.arrival for r in w.requests] == [0.0, 3.0, 3.0, 9.0]
    assert [r.output_tokens for r in w.requests] == [10, 1, 5, 7]   # 0 -> 1: a request emits a token
    assert [r.prompt_tokens for r in w.requests] == [1100, 1500, 600, 512]
    assert w.rates["0-1"] == pytest.approx(2 / w.duration)
    assert w.prefix_tokens["0-1"] == 1024 and w.prefix_tokens["5"] == 512
    assert load_mooncake(write_jsonl(tmp_path, MOONCAKE), key_blocks=1).requests[2].key == "0"


def test_mooncake_qps_rescales_to_the_mean_rate(tmp_path):
    w = load_mooncake(write_jsonl(tmp_path, MOONCAKE), qps=2.0)
    times = [r.arrival for r in w.requests]
    assert (len(times) - 1) / (times[-1] - times[0]) == pytest.approx(2.0)
    assert times[1] / times[3] == pytest.approx(3 / 9)            # shape preserved


def test_out_of_order_records_keep_their_own_times(tmp_path):
    records = [MOONCAKE[3], MOONCAKE[0], MOONCAKE[2], MOONCAKE[1]]
    w = load_mooncake(write_jsonl(tmp_path, records))
    assert [(r.arrival, r.prompt_tokens) for r in w.requests] == \
           [(0.0, 1100), (3.0, 600), (3.0, 1500), (9.0, 512)]
    assert [r.rid for r in w.requests] == [0, 1, 2, 3]


def test_mooncake_limit(tmp_path):
    assert len(load_mooncake(write_jsonl(tmp_path, MOONCAKE), limit=2).requests) == 2


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field 'hash_ids'"),
    ('{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": []}', "timestamp"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}', "hash_ids"),
    ('{"timestamp": 0, "input_len', "malformed"),
])
def test_mooncake_malformed_lines_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(MOONCAKE[0]) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:3: .*{message}"):
        load_mooncake(str(path))


def test_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read trace"):
        load_mooncake(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="cannot read trace"):
        load_azure(str(tmp_path))                                  # a directory
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no requests"):
        load_mooncake(str(empty))


AZURE_CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,3000,109
2023-11-16 18:15:51.0000000,20,0
2023-11-16 18:16:46.6805900,1000,12
"""


def test_azure_arrivals_lengths_and_keys(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(AZURE_CSV)
    w = load_azure(str(path), seed=3, keys=2)
    assert [round(r.arrival, 4) for r in w.requests] == [0.0, 4.3146, 4.3194, 60.0]
    assert [r.prompt_tokens for r in w.requests] == [374, 3000, 20, 1000]
    assert [r.output_tokens for r in w.requests] == [44, 109, 1, 12]
    for r in w.requests:
        assert len(r.blocks) <= (r.prompt_tokens - 1) // BLOCK_TOKENS
    by_key = {}
    for r in w.requests:                                            # one chain per key, cut to fit
        full = by_key.setdefault(r.key, r.blocks)
        short, long_ = sorted((full, r.blocks), key=len)
        assert long_[: len(short)] == short
    assert load_azure(str(path), seed=3, keys=2).requests == w.requests
    assert set(w.rates) == {r.key for r in w.requests}


@pytest.mark.parametrize("body, message", [
    ("TIME,Ctx,Gen\n", "expected header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-date,1,1\n", ":2: malformed"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n", ":2: .*3 fields"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n2023-11-16 18:15:47,0,1\n",
     ":3: .*ContextTokens"),
])
def test_azure_malformed(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        load_azure(str(path))


def test_ideal_hit_rate_counts_only_repeated_prefixes(tmp_path):
    w = load_mooncake(write_jsonl(tmp_path, MOONCAKE))
    # only b reuses ids 0, 1 (1024 tokens) and c reuses id 0 (512 tokens)
    assert ideal_hit_rate(w.requests) == pytest.approx((1024 + 512) / (1100 + 1500 + 600 + 512))


def test_real_traces_smoke():
    conv = load_mooncake(real(CONVERSATION))
    assert len(conv.requests) == 5606
    assert conv.duration == pytest.approx(1767, rel=0.01)
    # README: ideal infinite-cache token hit rate ~37% (full trace); first half ~35%
    assert 0.30 < ideal_hit_rate(conv.requests) < 0.40
    keys = {r.key for r in conv.requests}
    assert all(k.startswith("0-") for k in keys)                    # block 0 is the system prompt
    synthetic = load_mooncake(real(SYNTHETIC), qps=10.0)
    assert len(synthetic.requests) == 3993 and synthetic.qps == pytest.approx(10.0, rel=0.01)
    assert 0.60 < ideal_hit_rate(synthetic.requests) < 0.70         # README: ~65%
    azure = load_azure(real(AZURE))
    assert len(azure.requests) == 19_366
    assert azure.requests[-1].arrival == pytest.approx(3500, rel=0.05)


def test_replayed_arrivals_keep_the_records_shape_at_the_offered_rate(tmp_path):
    from services.core.traces import replay_arrivals
    from services.core.workloads import make_workload
    from services.sim.tracefiles import replayed_arrivals

    stamps = [0.0, 1.0, 1.5, 4.0]                       # span 4 s, period 4 + 4/3 s when looped
    once = replay_arrivals(stamps, qps=1.0, duration=3.0)
    assert once.tolist() == pytest.approx([0.0, 3.0 / 4.0, 3.0 / 4.0 * 1.5])    # arrival 4 lands at 3 s
    looped = replay_arrivals(stamps, qps=2.0, duration=5.0)                     # 10 arrivals from 4
    assert len(looped) == 10 and np.all(np.diff(looped) >= 0) and looped[-1] < 5.0
    gaps = np.diff(looped)
    assert gaps[4] == pytest.approx(gaps[0]) and gaps[3] == pytest.approx(gaps[0] * 4 / 3)   # the record repeats
    with pytest.raises(ValueError):
        replay_arrivals([1.0, 1.0], qps=1.0, duration=1.0)
    path = tmp_path / "a.csv"
    path.write_text(AZURE_CSV)
    times = replayed_arrivals(str(path), qps=10.0, duration=2.0)
    assert len(times) == 20
    w = make_workload("paper", qps=10.0, duration=2.0, seed=0, arrivals=times)
    assert [r.arrival for r in w.requests] == times and w.knobs["arrivals"] == 20
    f = make_workload("flagship", qps=10.0, duration=2.0, seed=0, arrivals=times)
    assert [r.arrival for r in f.requests] == times
    with pytest.raises(ValueError, match="cv"):
        make_workload("paper", qps=10.0, duration=2.0, seed=0, arrivals=times, cv=1.9)


def test_real_azure_arrivals_replayed_keep_their_gap_cv():
    from services.core.traces import azure_arrivals
    from services.core.traces import replay_arrivals

    with open(real(AZURE), encoding="utf-8", newline="") as f:
        stamps = azure_arrivals(f, AZURE)
    gaps = np.diff(stamps)
    times = replay_arrivals(stamps, qps=250.0, duration=150.0)                 # looped: 37,500 of 19,366
    assert len(times) == 37_500
    replayed = np.diff(times)
    assert replayed.std() / replayed.mean() == pytest.approx(gaps.std() / gaps.mean(), rel=0.05)
