"""Tests for kvcost.data.traces: exact parsing, errors, spread, windowing, bundled data."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kvcost.data.traces import (
    MISSING,
    TRACE_LOADERS,
    Trace,
    TraceFormatError,
    TraceRequest,
    bundled_trace_path,
    check_trace_name,
    load_trace,
)


def _line(ts, n_in, n_out, ids, **extra) -> str:
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids, **extra})


def _write(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _mooncake_ms(tmp_path: Path, timestamps_ms: list[int]) -> Path:
    """One 1-block request per timestamp (block size 4 tokens)."""
    return _write(tmp_path, [_line(ts, 4, 1, [i]) for i, ts in enumerate(timestamps_ms)])


# ------------------------------------------------------------------ registry


def test_registry_names():
    assert TRACE_LOADERS.names() == ["azure", "mooncake"]


# ------------------------------------------------------------------ mooncake parsing


def test_mooncake_three_lines_exact(tmp_path):
    path = _write(
        tmp_path,
        [
            _line(0, 8, 5, [0, 1], extra_key="ignored"),
            _line(1500, 9, 2, [0, 1, 2]),
            _line(4000, 4, 1, [7]),
        ],
    )
    t = load_trace(path, block_size_tokens=4)
    assert t == Trace(
        name="t",
        source=str(path),
        loader="mooncake",
        block_size_tokens=4,
        requests=(
            TraceRequest(0, 0.0, 8, 5, (0, 1)),
            TraceRequest(1, 1.5, 9, 2, (0, 1, 2)),
            TraceRequest(2, 4.0, 4, 1, (7,)),
        ),
        skipped_lines=0,
        spread_bucket_s=None,
        rate_scale=1.0,
        start_s=0.0,
        duration_s=None,
    )
    assert len(t) == 3
    assert t.distinct_blocks == 4
    assert t.duration_s_actual == 4.0


def test_json_suffix_and_explicit_loader(tmp_path):
    lines = [_line(0, 4, 1, [3]), _line(10, 4, 1, [3])]
    assert load_trace(_write(tmp_path, lines, "a.json"), block_size_tokens=4).loader == "mooncake"
    t = load_trace(_write(tmp_path, lines, "a.txt"), loader="mooncake", block_size_tokens=4)
    assert [r.arrival_s for r in t.requests] == [0.0, 0.01]


def _error(tmp_path, bad_line: str, **kwargs) -> TraceFormatError:
    path = _write(tmp_path, [_line(1000, 8, 1, [0, 1]), bad_line, _line(3000, 8, 1, [0, 2])])
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, block_size_tokens=4, **kwargs)
    err = info.value
    assert err.path == path and err.line_number == 2
    return err


def test_error_malformed_json(tmp_path):
    err = _error(tmp_path, '{"timestamp": 5,')
    assert (err.field, err.value) == ("<line>", '{"timestamp": 5,')
    assert str(err).startswith("""t.jsonl line 2: field '<line>' = '{"timestamp": 5,', expected a JSON object (""")


def test_error_not_an_object(tmp_path):
    err = _error(tmp_path, "[1, 2]")
    assert str(err) == "t.jsonl line 2: field '<line>' = '[1, 2]', expected a JSON object"


def test_error_missing_field(tmp_path):
    err = _error(tmp_path, json.dumps({"timestamp": 2000, "input_length": 8, "hash_ids": [0, 1]}))
    assert (err.field, err.value, err.expected) == ("output_length", MISSING, "a positive integer")
    assert str(err) == "t.jsonl line 2: field 'output_length' is missing, expected a positive integer"


def test_error_negative_value(tmp_path):
    err = _error(tmp_path, _line(2000, -3, 1, []))
    assert (err.field, err.value) == ("input_length", -3)
    assert str(err) == "t.jsonl line 2: field 'input_length' = -3, expected a positive integer"


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        (_line(-1, 8, 1, [0, 1]), "timestamp", -1),
        (_line("5", 8, 1, [0, 1]), "timestamp", "5"),
        (_line(2000, 8, 0, [0, 1]), "output_length", 0),
        (_line(2000, 8.0, 1, [0, 1]), "input_length", 8.0),
        (_line(2000, True, 1, [0]), "input_length", True),
        (_line(2000, 8, 1, [0, -1]), "hash_ids", [0, -1]),
        (_line(2000, 8, 1, "0,1"), "hash_ids", "0,1"),
    ],
)
def test_error_wrong_type_or_range(tmp_path, line, field, value):
    err = _error(tmp_path, line)
    assert (err.field, err.value) == (field, value)


def test_error_hash_ids_length(tmp_path):
    err = _error(tmp_path, _line(2000, 8, 1, [0, 1, 2]))
    assert (err.field, err.value) == ("hash_ids", [0, 1, 2])
    assert str(err) == (
        "t.jsonl line 2: field 'hash_ids' = [0, 1, 2], expected 2 ids = "
        "ceil(input_length 8 / block_size_tokens 4), got 3"
    )


def test_error_an_id_under_another_parent(tmp_path):
    # line 1 holds [0, 1]: 1 follows 0, and 0 starts a prompt
    err = _error(tmp_path, _line(2000, 8, 1, [5, 1]))
    assert (err.field, err.value) == ("hash_ids", [5, 1])
    assert str(err) == (
        "t.jsonl line 2: field 'hash_ids' = [5, 1], expected id 1 after 0 as on an earlier line "
        "(an id names one prefix block), got it after 5"
    )
    err = _error(tmp_path, _line(2000, 8, 1, [7, 0]))
    assert "expected id 0 after the start as on an earlier line (an id names one prefix block), got it after 7" in (
        str(err)
    )
    # a skipped bad line leaves no parent behind: [9, 1] refused, then [9, 4] is consistent
    path = _write(tmp_path, [_line(1000, 8, 1, [0, 1]), _line(2000, 8, 1, [9, 1]), _line(3000, 8, 1, [9, 4])])
    assert [r.block_hashes for r in load_trace(path, block_size_tokens=4, skip_bad_lines=True).requests] == [
        (0, 1),
        (9, 4),
    ]


def test_error_backwards_timestamp(tmp_path):
    err = _error(tmp_path, _line(999, 8, 1, [0, 1]))
    assert (err.field, err.value) == ("timestamp", 999)
    assert str(err) == (
        "t.jsonl line 2: field 'timestamp' = 999, expected a value ≥ 1000 (the previous accepted line's timestamp)"
    )


def test_line_numbers_count_blank_lines(tmp_path):
    path = _write(tmp_path, [_line(0, 4, 1, [0]), "", "   ", "oops"])
    with pytest.raises(TraceFormatError, match=r"^t\.jsonl line 4: field '<line>' = 'oops'"):
        load_trace(path, block_size_tokens=4)


def test_skip_bad_lines(tmp_path):
    path = _write(
        tmp_path,
        [
            _line(0, 4, 1, [0]),  # 1 kept
            "{bad",  # 2 skipped: JSON
            _line(1000, 4, 1, [1]),  # 3 kept
            _line(5000, 4, 1, [1, 2]),  # 4 skipped: hash_ids length (does not update prev)
            _line(2000, 4, 1, [2]),  # 5 kept
            _line(500, 4, 1, [3]),  # 6 skipped: backwards (does not update prev)
            "",  # 7 blank: neither request nor skipped
            _line(800, 4, 1, [4]),  # 8 skipped: still backwards vs 2000
            _line(2000, 4, 1, [5]),  # 9 kept
        ],
    )
    t = load_trace(path, block_size_tokens=4, skip_bad_lines=True, spread_seed=None)
    assert t.skipped_lines == 4
    assert [r.request_id for r in t.requests] == [0, 2, 4, 8]
    assert [r.arrival_s for r in t.requests] == [0.0, 1.0, 2.0, 2.0]
    assert [r.block_hashes for r in t.requests] == [(0,), (1,), (2,), (5,)]


def test_all_lines_bad_is_an_error(tmp_path):
    path = _write(tmp_path, ["{bad", "nope"])
    with pytest.raises(ValueError, match=r"has no valid requests \(2 lines skipped\)"):
        load_trace(path, skip_bad_lines=True)


# ------------------------------------------------------------------ azure

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def test_azure_parse_unique_blocks(tmp_path):
    path = _write(
        tmp_path,
        [
            AZURE_HEADER,
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,1025,109",
            "2023-11-16 18:15:51.0000000,512,7",
        ],
        "az.csv",
    )
    t = load_trace(path)
    assert t.loader == "azure" and t.name == "az" and t.spread_bucket_s is None
    assert t.requests == (
        TraceRequest(0, 0.0, 374, 44, (0,)),
        TraceRequest(1, 4.314579, 1025, 109, ((1 << 32) | 0, (1 << 32) | 1, (1 << 32) | 2)),
        TraceRequest(2, 4.31941, 512, 7, ((2 << 32) | 0,)),
    )
    assert t.distinct_blocks == 5


def test_azure_skip_keeps_row_ids(tmp_path):
    path = _write(
        tmp_path,
        [
            AZURE_HEADER,
            "2023-11-16 18:15:46.5,10,1",
            "2023-11-16 18:15:47,0,1",  # row 1 skipped: ContextTokens 0
            "2023-11-16 18:15:45,10,1",  # row 2 skipped: backwards
            "2023-11-16 18:15:48,10",  # row 3 skipped: 2 columns
            "2023-11-16 18:15:49.25,600,1",
        ],
        "az.csv",
    )
    t = load_trace(path, block_size_tokens=512, skip_bad_lines=True)
    assert t.skipped_lines == 3
    assert [(r.request_id, r.arrival_s) for r in t.requests] == [(0, 0.0), (4, 2.75)]
    assert t.requests[1].block_hashes == ((4 << 32), (4 << 32) | 1)


@pytest.mark.parametrize(
    ("row", "field", "value", "message"),
    [
        (
            "2023-11-16 18:15:47,0,1",
            "ContextTokens",
            "0",
            "az.csv line 3: field 'ContextTokens' = '0', expected a positive integer",
        ),
        (
            "2023-11-16 18:15:47,5",
            "<line>",
            "2023-11-16 18:15:47,5",
            "az.csv line 3: field '<line>' = '2023-11-16 18:15:47,5', expected 3 CSV columns",
        ),
        (
            "yesterday,5,5",
            "TIMESTAMP",
            "yesterday",
            "az.csv line 3: field 'TIMESTAMP' = 'yesterday', expected YYYY-MM-DD HH:MM:SS.fffffff",
        ),
        (
            "2023-11-16 18:15:45.9,5,5",
            "TIMESTAMP",
            "2023-11-16 18:15:45.9",
            "az.csv line 3: field 'TIMESTAMP' = '2023-11-16 18:15:45.9', expected a value ≥ "
            "'2023-11-16 18:15:46.0000000' (the previous accepted line's timestamp)",
        ),
    ],
)
def test_azure_errors(tmp_path, row, field, value, message):
    path = _write(tmp_path, [AZURE_HEADER, "2023-11-16 18:15:46.0000000,5,5", row], "az.csv")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    err = info.value
    assert (err.line_number, err.field, err.value, str(err)) == (3, field, value, message)


def test_azure_bad_header(tmp_path):
    path = _write(tmp_path, ["time,in,out", "2023-11-16 18:15:46,5,5"], "az.csv")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, skip_bad_lines=True)
    assert (info.value.line_number, info.value.field) == (1, "<header>")


# ------------------------------------------------------------------ windowing


def test_window_and_rate_scale_exact(tmp_path):
    path = _mooncake_ms(tmp_path, [0, 1000, 2000, 3000, 4000])
    t = load_trace(path, block_size_tokens=4, start_s=1.0, duration_s=2.0, rate_scale=2.0)
    assert [(r.request_id, r.arrival_s) for r in t.requests] == [(1, 0.0), (2, 0.5)]
    assert (t.start_s, t.duration_s, t.rate_scale) == (1.0, 2.0, 2.0)
    assert t.duration_s_actual == 0.5
    t = load_trace(path, block_size_tokens=4, start_s=2.5, rate_scale=0.5)
    assert [(r.request_id, r.arrival_s) for r in t.requests] == [(3, 1.0), (4, 3.0)]


def test_empty_window_is_an_error(tmp_path):
    path = _mooncake_ms(tmp_path, [0, 1000])
    with pytest.raises(ValueError, match=r"empty after windowing: no request arrives in \[5 s, 6 s\)"):
        load_trace(path, block_size_tokens=4, start_s=5.0, duration_s=1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size_tokens": 0}, "block_size_tokens = 0, expected an integer ≥ 1"),
        ({"block_size_tokens": 4.0}, "block_size_tokens = 4.0, expected an integer ≥ 1"),
        ({"rate_scale": 0.0}, "rate_scale = 0.0, expected a finite number > 0"),
        ({"rate_scale": float("inf")}, "rate_scale = inf, expected a finite number > 0"),
        ({"start_s": -1.0}, "start_s = -1.0, expected a finite number ≥ 0"),
        ({"duration_s": 0.0}, "duration_s = 0.0, expected a finite number > 0 (omit it for the rest of the trace)"),
    ],
)
def test_option_validation(tmp_path, kwargs, message):
    path = _mooncake_ms(tmp_path, [0])
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        load_trace(path, **kwargs)


def test_unknown_suffix_and_missing_file(tmp_path):
    path = _write(tmp_path, [_line(0, 4, 1, [0])], "t.txt")
    with pytest.raises(ValueError, match=r"t\.txt: unknown suffix '\.txt'; expected \.jsonl or \.json"):
        load_trace(path)
    with pytest.raises(FileNotFoundError, match="neither a file nor a bundled trace"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(KeyError, match="unknown trace loader 'csv'"):
        load_trace(path, loader="csv")


# ------------------------------------------------------------------ spread

BUCKETED_MS = [0, 0, 0, 0, 3000, 3000, 3000, 6000, 6000]


def _arrivals(path, **kwargs) -> list[float]:
    return [r.arrival_s for r in load_trace(path, block_size_tokens=4, **kwargs).requests]


def test_spread_deterministic_and_inside_buckets(tmp_path):
    path = _mooncake_ms(tmp_path, BUCKETED_MS)
    t = load_trace(path, block_size_tokens=4, spread_seed=7)
    assert t.spread_bucket_s == 3.0
    arrivals = [r.arrival_s for r in t.requests]
    assert arrivals == _arrivals(path, spread_seed=7)
    assert arrivals != _arrivals(path, spread_seed=8)
    assert [r.request_id for r in t.requests] == list(range(len(BUCKETED_MS)))
    assert arrivals == sorted(arrivals)
    for a, ms in zip(arrivals, BUCKETED_MS, strict=True):
        assert ms / 1000 <= a < ms / 1000 + 3.0
    assert len(set(arrivals)) == len(arrivals)


def test_spread_clipped_to_next_group(tmp_path):
    ms = [0, 0, 0, 2000, 2000, 2000, 6000, 6000, 6000]  # gaps 2 s, 4 s → median 3 s
    path = _mooncake_ms(tmp_path, ms)
    t = load_trace(path, block_size_tokens=4, spread_seed=1)
    assert t.spread_bucket_s == 3.0
    arrivals = [r.arrival_s for r in t.requests]
    assert arrivals == sorted(arrivals)
    assert all(0.0 <= a < 2.0 for a in arrivals[:3])
    assert all(2.0 <= a < 5.0 for a in arrivals[3:6])
    assert all(6.0 <= a < 9.0 for a in arrivals[6:])


def test_no_spread_when_disabled_or_not_bucketed(tmp_path):
    path = _mooncake_ms(tmp_path, BUCKETED_MS)
    t = load_trace(path, block_size_tokens=4, spread_seed=None)
    assert t.spread_bucket_s is None
    assert [r.arrival_s for r in t.requests] == [m / 1000 for m in BUCKETED_MS]
    distinct = _mooncake_ms(tmp_path, [0, 0, 1000, 2000])  # 3 of 4 distinct: not bucketed
    assert load_trace(distinct, block_size_tokens=4).spread_bucket_s is None


def test_window_applies_to_spread_timeline(tmp_path):
    path = _mooncake_ms(tmp_path, BUCKETED_MS)
    full = _arrivals(path, spread_seed=3)
    t = load_trace(path, block_size_tokens=4, spread_seed=3, start_s=3.0, duration_s=3.0, rate_scale=2.0)
    assert [r.request_id for r in t.requests] == [4, 5, 6]
    assert [r.arrival_s for r in t.requests] == [(a - 3.0) / 2.0 for a in full[4:7]]


# ------------------------------------------------------------------ bundled


def test_bundled_mooncake_conversation():
    t0 = time.perf_counter()
    t = load_trace("mooncake-conversation")
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0
    assert (t.name, t.loader, len(t), t.skipped_lines) == (
        "mooncake-conversation",
        "mooncake",
        12031,
        0,
    )
    assert t.distinct_blocks == 182790
    assert t.spread_bucket_s == 3.0
    assert t.requests[0].block_hashes[:3] == (0, 1, 2)
    assert [r.request_id for r in t.requests] == list(range(12031))
    arrivals = [r.arrival_s for r in t.requests]
    assert arrivals == sorted(arrivals)


@pytest.mark.parametrize(("name", "count"), [("azure-code", 8819), ("azure-conv", 19366)])
def test_bundled_azure(name, count):
    t = load_trace(name)
    assert (t.loader, len(t), t.skipped_lines, t.spread_bucket_s) == ("azure", count, 0, None)
    assert t.requests[0].arrival_s == 0.0
    assert t.distinct_blocks == sum(len(r.block_hashes) for r in t.requests)


def test_bundled_files_have_licences():
    for name in ("mooncake-conversation", "azure-code", "azure-conv"):
        assert (bundled_trace_path(name).parent / "LICENSE-SOURCE.txt").is_file()
    with pytest.raises(KeyError, match="unknown bundled trace 'x'"):
        bundled_trace_path("x")


def test_check_trace_name_names_the_trace_without_loading_it(tmp_path):
    for good in ("mooncake-conversation", "gen:mix", "gen:multi-turn:seed=1,think_time_mean_s=20"):
        check_trace_name(good)
    with pytest.raises(ValueError, match=r"^trace = 'gen:nope': unknown workload 'nope'; expected one of: agent, mix"):
        check_trace_name("gen:nope")
    with pytest.raises(ValueError, match=r"^trace = 'gen:mix:zipf=3': option 'zipf=3', expected key=value"):
        check_trace_name("gen:mix:zipf=3")
    with pytest.raises(ValueError, match=r"^trace '.*nope.jsonl' is neither a file nor a bundled trace"):
        check_trace_name(tmp_path / "nope.jsonl")
