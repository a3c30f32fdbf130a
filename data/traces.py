"""Request-trace loaders (docs/architecture.md §8): Mooncake JSONL and Azure LLM CSV traces.

A trace is a time-ordered list of requests, each with an arrival time, input and
output token counts and the ids of the input's KV-cache blocks. Identical block
ids across requests mean the same prefix block, so a trace carries exactly the
reuse a prefix cache can exploit.

Formats
-------
* ``mooncake`` — Mooncake FAST'25 trace release (kvcache-ai/Mooncake,
  ``FAST25-release/README.md``): JSON lines
  ``{"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}``,
  one hash id per 512-token block; ids are prefix-consistent (an id always has
  the same parent id). Unknown keys are ignored, blank lines are skipped.
* ``azure`` — Azure LLM inference trace 2023 (Azure/AzurePublicDataset; Patel et
  al., "Splitwise", ISCA 2024): CSV with header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, ``TIMESTAMP`` like
  ``2023-11-16 18:15:46.6805900``. It has no prefix identity, so every block gets
  a hash unique within the trace.

* generated — ``gen:<shape>[:key=value,...]`` names a seeded synthetic workload
  (``shared-prefix``, ``multi-turn``, ``agent``, ``mix``; :mod:`kvcost.data.workloads`)
  drawn in memory as Mooncake records; ``seed=`` in the name, else the load's
  ``spread_seed`` (the run's ``--seed``), else 0.

Use :func:`load_trace`; loaders are registered by name in :data:`TRACE_LOADERS`,
generated shapes in :data:`kvcost.data.workloads.WORKLOADS`.

Example
-------
>>> t = load_trace("mooncake-conversation", duration_s=60.0)   # doctest: +SKIP
>>> len(t), t.spread_bucket_s                                   # doctest: +SKIP
(162, 3.0)
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from kvcost.core.registry import Registry
from kvcost.data.workloads import GENERATED_PREFIX, WORKLOADS, generate, parent_rule_violation, parse_workload_name

__all__ = [
    "MISSING",
    "BUNDLED_TRACES",
    "TRACE_LOADERS",
    "RawTrace",
    "Trace",
    "TraceFormatError",
    "TraceLoader",
    "TraceRequest",
    "bundled_trace_path",
    "load_azure",
    "load_generated",
    "load_mooncake",
    "load_trace",
    "parse_azure_timestamp",
]

#: Bundled trace name → (loader name, path parts under ``kvcost/data/bundled``).
BUNDLED_TRACES: dict[str, tuple[str, tuple[str, ...]]] = {
    "mooncake-conversation": ("mooncake", ("traces", "mooncake", "conversation_trace.jsonl")),
    "azure-code": ("azure", ("traces", "azure_llm_2023", "AzureLLMInferenceTrace_code.csv")),
    "azure-conv": ("azure", ("traces", "azure_llm_2023", "AzureLLMInferenceTrace_conv.csv")),
}

_SUFFIX_LOADERS = {".jsonl": "mooncake", ".json": "mooncake", ".csv": "azure"}
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_BLOCK_BITS = 32  # azure block hash = (request_id << 32) | block_index
_BUCKETED_FRACTION = 0.5  # bucketed when distinct timestamps < this fraction of requests


class _Missing:
    """Sentinel for a field absent from a line (``TraceFormatError.value``)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
"""Value of :attr:`TraceFormatError.value` when the field is absent."""


class TraceFormatError(ValueError):
    """A trace line is malformed or violates the format.

    Attributes:
        path: the trace file.
        line_number: 1-based line in the file (a CSV header is line 1).
        field: offending field name, ``"<line>"`` for an unparsable line or
            ``"<header>"`` for a bad CSV header.
        value: the offending value (:data:`MISSING` when the field is absent).
        expected: human-readable description of what was expected.
    """

    def __init__(self, path: Path, line_number: int, field: str, value: Any, expected: str):
        self.path, self.line_number, self.field = path, line_number, field
        self.value, self.expected = value, expected
        shown = "is missing" if value is MISSING else f"= {_clip(repr(value))}"
        super().__init__(f"{path.name} line {line_number}: field {field!r} {shown}, expected {expected}")


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        request_id: 0-based index of the request's line among the file's data
            lines (CSV: data row, header excluded; JSONL: line index, blank lines
            included), so a request traces back to its input line after
            windowing or skipping.
        arrival_s: arrival time in seconds (after spread, windowing and rate
            scaling; ≥ 0).
        input_tokens: prompt length in tokens (≥ 1).
        output_tokens: generated tokens (≥ 1).
        block_hashes: ``ceil(input_tokens / block_size_tokens)`` block ids; equal
            ids across requests denote the same prefix block.
    """

    request_id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: requests in file order (arrivals non-decreasing).

    Attributes:
        name: bundled name, or the file stem for a path.
        source: path of the file read, or the ``gen:`` name of a generated workload.
        loader: registered loader name (``"mooncake"`` or ``"azure"``), or ``"generated"``.
        block_size_tokens: tokens per KV block.
        requests: the kept requests.
        skipped_lines: bad lines skipped (``skip_bad_lines=True``), else 0.
        spread_bucket_s: estimated timestamp bucket width in seconds when
            arrivals were spread, else ``None``.
        rate_scale: arrival-rate multiplier applied (arrival = (t − start_s) / rate_scale).
        start_s: window start on the original (spread) timeline, seconds.
        duration_s: window length on the original timeline, seconds (``None`` = to the end).
    """

    name: str
    source: str
    loader: str
    block_size_tokens: int
    requests: tuple[TraceRequest, ...]
    skipped_lines: int
    spread_bucket_s: float | None
    rate_scale: float
    start_s: float
    duration_s: float | None

    @property
    def duration_s_actual(self) -> float:
        """Last minus first arrival, seconds (0.0 for fewer than two requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def distinct_blocks(self) -> int:
        """Number of distinct block hashes over all requests."""
        return len({h for r in self.requests for h in r.block_hashes})

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.requests)


@dataclass(frozen=True, slots=True)
class RawTrace:
    """What a loader returns: requests with ``arrival_s`` on the source timeline.

    Attributes:
        requests: requests in file order; ``arrival_s`` is seconds since the
            trace's own zero (Mooncake: timestamp / 1000; Azure: since the first
            accepted row), non-decreasing.
        skipped_lines: number of bad lines skipped.
    """

    requests: tuple[TraceRequest, ...]
    skipped_lines: int


#: A loader: ``(path, block_size_tokens, skip_bad_lines) -> RawTrace``; raises
#: :class:`TraceFormatError` on a bad line unless ``skip_bad_lines``.
TraceLoader = Callable[[Path, int, bool], RawTrace]

TRACE_LOADERS: Registry[TraceLoader] = Registry("trace loader")

# A parsed line: (ordering key, raw timestamp, input tokens, output tokens, block hashes).
_Parsed = tuple[Any, Any, int, int, tuple[int, ...]]
_LineParser = Callable[[int, int, str], _Parsed]


def _collect(
    path: Path,
    lines: Iterable[tuple[int, str]],
    parse: _LineParser,
    timestamp_field: str,
    header_lines: int,
    skip_bad_lines: bool,
) -> tuple[list[tuple[int, _Parsed]], int]:
    """Parse numbered non-blank lines, enforcing non-decreasing timestamps.

    Returns ``([(request_id, parsed), ...], skipped)``. A skipped line does not
    update the previous timestamp.
    """
    kept: list[tuple[int, _Parsed]] = []
    skipped, prev_key, prev_raw = 0, None, None
    for line_number, text in lines:
        try:
            parsed = parse(line_number, line_number - 1 - header_lines, text)
            if prev_key is not None and parsed[0] < prev_key:
                expected = f"a value ≥ {prev_raw!r} (the previous accepted line's timestamp)"
                raise TraceFormatError(path, line_number, timestamp_field, parsed[1], expected)
        except TraceFormatError:
            if not skip_bad_lines:
                raise
            skipped += 1
            continue
        prev_key, prev_raw = parsed[0], parsed[1]
        kept.append((line_number - 1 - header_lines, parsed))
    return kept, skipped


def _to_raw(kept: list[tuple[int, _Parsed]], seconds: Callable[[Any], float], skipped: int) -> RawTrace:
    requests = tuple(TraceRequest(rid, seconds(p[0]), p[2], p[3], p[4]) for rid, p in kept)
    return RawTrace(requests, skipped)


def _numbered_nonblank(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8-sig") as f:
        for line_number, text in enumerate(f, start=1):
            if text.strip():
                yield line_number, text


# ---------------------------------------------------------------- mooncake


def _is_int(v: Any) -> bool:
    return type(v) is int


def _require(path: Path, line: int, obj: dict, field: str, ok: Callable[[Any], bool], expected: str) -> Any:
    value = obj.get(field, MISSING)
    if value is MISSING or not ok(value):
        raise TraceFormatError(path, line, field, value, expected)
    return value


def _mooncake_parser(path: Path, block_size_tokens: int) -> _LineParser:
    def is_ts(v: Any) -> bool:
        return type(v) in (int, float) and math.isfinite(v) and v >= 0

    def is_ids(v: Any) -> bool:
        return isinstance(v, list) and all(_is_int(h) and h >= 0 for h in v)

    def parse(line: int, request_id: int, text: str) -> _Parsed:
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise TraceFormatError(path, line, "<line>", text.strip(), f"a JSON object ({exc})") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(path, line, "<line>", text.strip(), "a JSON object")
        ts = _require(path, line, obj, "timestamp", is_ts, "a non-negative number (milliseconds)")
        n_in = _require(path, line, obj, "input_length", lambda v: _is_int(v) and v >= 1, "a positive integer")
        n_out = _require(path, line, obj, "output_length", lambda v: _is_int(v) and v >= 1, "a positive integer")
        ids = _require(path, line, obj, "hash_ids", is_ids, "a list of non-negative integers")
        n_blocks = -(-n_in // block_size_tokens)
        if len(ids) != n_blocks:
            expected = (
                f"{n_blocks} ids = ceil(input_length {n_in} / block_size_tokens {block_size_tokens}), got {len(ids)}"
            )
            raise TraceFormatError(path, line, "hash_ids", ids, expected)
        broken = parent_rule_violation(ids, parents)
        if broken is not None:
            block, earlier, parent = ("the start" if x is None else x for x in broken)
            expected = f"id {block} after {earlier} as on an earlier line (an id names one prefix block), "
            expected += f"got it after {parent}"
            raise TraceFormatError(path, line, "hash_ids", ids, expected)
        return ts, ts, n_in, n_out, tuple(ids)

    parents: dict[int, int | None] = {}
    return parse


@TRACE_LOADERS.register("mooncake")
def load_mooncake(path: Path, block_size_tokens: int = 512, skip_bad_lines: bool = False) -> RawTrace:
    """Read a Mooncake FAST'25 JSONL trace (kvcache-ai/Mooncake ``FAST25-release``).

    Each line ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``;
    the released traces use 512-token blocks, so ``block_size_tokens`` must be 512
    for them (else every ``hash_ids`` length check fails). Arrival = timestamp / 1000 s.

    Raises:
        TraceFormatError: bad JSON, missing/mistyped/out-of-range field,
            ``len(hash_ids) != ceil(input_length / block_size_tokens)``, an id after another parent
            id than on an earlier line, or a timestamp below the previous accepted one (unless
            ``skip_bad_lines``).
    """
    parse = _mooncake_parser(path, block_size_tokens)
    kept, skipped = _collect(path, _numbered_nonblank(path), parse, "timestamp", 0, skip_bad_lines)
    return _to_raw(kept, lambda ms: ms / 1000.0, skipped)


def load_generated(name: str, block_size_tokens: int = 512, seed: int | None = None) -> RawTrace:
    """Draw the generated workload ``name`` (``gen:<shape>[:key=value,...]``) as a Mooncake trace.

    The workload's seed is ``seed=`` in the name, else ``seed``, else 0. Records
    are checked exactly as :func:`load_mooncake` checks a file's lines, so a
    generated trace and its JSONL file load to the same requests.

    Raises:
        ValueError: bad name, option or parameter; ``block_size_tokens`` ≠ 512.
        KeyError: unknown shape.
    """
    shape, params, named_seed = parse_workload_name(name)
    chosen = named_seed if named_seed is not None else (seed if seed is not None else 0)
    records = generate(shape, params, chosen)
    parse = _mooncake_parser(Path(name), block_size_tokens)
    lines = ((i + 1, json.dumps(r)) for i, r in enumerate(records))
    kept, skipped = _collect(Path(name), lines, parse, "timestamp", 0, False)
    return _to_raw(kept, lambda ms: ms / 1000.0, skipped)


# ---------------------------------------------------------------- azure


def parse_azure_timestamp(text: str) -> datetime:
    """Parse ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (any number of fractional digits,
    truncated to microseconds). Raises ``ValueError`` on anything else."""
    base, _, frac = text.strip().partition(".")
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {frac!r}")
    dt = datetime.fromisoformat(base)
    return dt.replace(microsecond=int((frac + "000000")[:6]))


def _azure_header(path: Path, lines: Iterator[tuple[int, str]]) -> dict[str, int]:
    first = next(lines, None)
    header = [c.strip() for c in next(csv.reader([first[1]]))] if first else []
    if first is None or first[0] != 1 or not set(_AZURE_COLUMNS) <= set(header):
        value = first[1].strip() if first else ""
        raise TraceFormatError(path, 1, "<header>", value, "columns " + ",".join(_AZURE_COLUMNS))
    return {name: header.index(name) for name in _AZURE_COLUMNS} | {"<width>": len(header)}


def _azure_int(path: Path, line: int, row: list[str], cols: dict[str, int], field: str) -> int:
    text = row[cols[field]].strip()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise TraceFormatError(path, line, field, text, "a positive integer")
    return value


def _azure_parser(path: Path, block_size_tokens: int, cols: dict[str, int]) -> _LineParser:
    def parse(line: int, request_id: int, text: str) -> _Parsed:
        try:
            row = next(csv.reader([text]))
        except csv.Error:
            row = []
        if len(row) != cols["<width>"]:
            raise TraceFormatError(path, line, "<line>", text.strip(), f"{cols['<width>']} CSV columns")
        raw_ts = row[cols["TIMESTAMP"]].strip()
        try:
            ts = parse_azure_timestamp(raw_ts)
        except ValueError:
            raise TraceFormatError(path, line, "TIMESTAMP", raw_ts, "YYYY-MM-DD HH:MM:SS.fffffff") from None
        n_in = _azure_int(path, line, row, cols, "ContextTokens")
        n_out = _azure_int(path, line, row, cols, "GeneratedTokens")
        n_blocks = -(-n_in // block_size_tokens)
        base = request_id << _AZURE_BLOCK_BITS
        return ts, raw_ts, n_in, n_out, tuple(range(base, base + n_blocks))

    return parse


@TRACE_LOADERS.register("azure")
def load_azure(path: Path, block_size_tokens: int = 512, skip_bad_lines: bool = False) -> RawTrace:
    """Read an Azure LLM inference trace 2023 CSV (Azure/AzurePublicDataset;
    Splitwise, ISCA 2024): header ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    Arrival = seconds since the first accepted row's TIMESTAMP. The trace has no
    prefix identity: block ``i`` of request ``r`` gets hash ``(r << 32) | i``,
    unique within the trace.

    Raises:
        TraceFormatError: bad header (always), wrong column count, unparsable
            TIMESTAMP, token count not a positive integer, or TIMESTAMP below the
            previous accepted one (unless ``skip_bad_lines``).
    """
    lines = _numbered_nonblank(path)
    cols = _azure_header(path, lines)
    parse = _azure_parser(path, block_size_tokens, cols)
    kept, skipped = _collect(path, lines, parse, "TIMESTAMP", 1, skip_bad_lines)
    first = kept[0][1][0] if kept else None
    return _to_raw(kept, lambda dt: (dt - first).total_seconds(), skipped)


# ---------------------------------------------------------------- load_trace


def bundled_trace_path(name: str) -> Path:
    """Path of bundled trace ``name`` (a key of :data:`BUNDLED_TRACES`).

    Raises:
        KeyError: unknown name; the message lists the bundled names.
    """
    if name not in BUNDLED_TRACES:
        raise KeyError(f"unknown bundled trace {name!r}; expected one of: {', '.join(sorted(BUNDLED_TRACES))}")
    resource = files("kvcost.data").joinpath("bundled", *BUNDLED_TRACES[name][1])
    return Path(str(resource))


def _check_options(block_size_tokens: int, start_s: float, duration_s: float | None, rate_scale: float) -> None:
    def bad(name: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{name} = {value!r}, expected {expected}")

    def is_num(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not (_is_int(block_size_tokens) and block_size_tokens >= 1):
        raise bad("block_size_tokens", block_size_tokens, "an integer ≥ 1")
    if not (is_num(rate_scale) and rate_scale > 0):
        raise bad("rate_scale", rate_scale, "a finite number > 0")
    if not (is_num(start_s) and start_s >= 0):
        raise bad("start_s", start_s, "a finite number ≥ 0")
    if duration_s is not None and not (is_num(duration_s) and duration_s > 0):
        raise bad("duration_s", duration_s, "a finite number > 0 (omit it for the rest of the trace)")


def check_trace_name(trace: str | Path) -> None:
    """Check, without loading it, that ``trace`` names a bundled trace, a valid ``gen:`` workload or a file.

    For commands that validate their options before starting work (the trace itself loads later).

    Raises:
        ValueError: the reason, which starts with ``trace`` (so a command names its option).
    """
    try:
        if _is_generated(trace):
            parse_workload_name(str(trace))
        else:
            _resolve(trace, None)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ValueError(reason if reason.startswith("trace") else f"trace = {str(trace)!r}: {reason}") from None


def _is_generated(trace: str | Path) -> bool:
    return isinstance(trace, str) and trace.startswith(GENERATED_PREFIX)


def _resolve(trace: str | Path, loader: str | None) -> tuple[str, Path, str]:
    """Return (name, path, loader name) for a bundled name or a path."""
    if isinstance(trace, str) and trace in BUNDLED_TRACES:
        return trace, bundled_trace_path(trace), loader or BUNDLED_TRACES[trace][0]
    path = Path(trace)
    if not path.is_file():
        known = ", ".join(sorted(BUNDLED_TRACES))
        shapes = ", ".join(GENERATED_PREFIX + n for n in WORKLOADS.names())
        raise FileNotFoundError(
            f"trace {str(trace)!r} is neither a file nor a bundled trace ({known}) nor a generated one ({shapes})"
        )
    if loader is None:
        loader = _SUFFIX_LOADERS.get(path.suffix.lower())
        if loader is None:
            raise ValueError(
                f"cannot infer the trace loader for {path}: unknown suffix {path.suffix!r}; "
                "expected .jsonl or .json (mooncake) or .csv (azure), or pass loader=..."
            )
    return path.stem, path, loader


def _spread(times: np.ndarray, seed: int | None) -> tuple[np.ndarray, float | None]:
    """Spread requests sharing a bucketed timestamp uniformly inside their bucket.

    ``times`` (seconds, non-decreasing). When ``seed`` is not None and fewer than
    50 % of timestamps are distinct, the bucket is the median gap between
    consecutive distinct timestamps; each group at time ``t`` gets sorted
    uniform offsets in ``[t, t + min(bucket, gap to the next group))`` assigned in
    file order, so order is kept and arrivals stay non-decreasing.
    Returns (spread times, bucket seconds or None).
    """
    starts = np.r_[True, times[1:] != times[:-1]] if len(times) else np.zeros(0, bool)
    n_groups = int(starts.sum())
    if seed is None or n_groups < 2 or n_groups >= _BUCKETED_FRACTION * len(times):
        return times, None
    group_t = times[starts]
    bucket = round(float(np.median(np.diff(group_t))), 6)
    width = np.minimum(bucket, np.r_[np.diff(group_t), bucket])
    group = np.cumsum(starts) - 1
    offsets = np.random.default_rng(seed).random(len(times))
    offsets = offsets[np.lexsort((offsets, group))]
    return times + offsets * width[group], bucket


def _window(
    raw: RawTrace, times: np.ndarray, start_s: float, duration_s: float | None, rate_scale: float
) -> tuple[TraceRequest, ...]:
    end = math.inf if duration_s is None else start_s + duration_s
    keep = np.flatnonzero((times >= start_s) & (times < end))
    arrivals = ((times[keep] - start_s) / rate_scale).tolist()
    reqs = raw.requests
    return tuple(
        TraceRequest(reqs[i].request_id, a, reqs[i].input_tokens, reqs[i].output_tokens, reqs[i].block_hashes)
        for i, a in zip(keep.tolist(), arrivals, strict=True)
    )


def load_trace(
    trace: str | Path,
    *,
    loader: str | None = None,
    block_size_tokens: int = 512,
    start_s: float = 0.0,
    duration_s: float | None = None,
    rate_scale: float = 1.0,
    spread_seed: int | None = 0,
    skip_bad_lines: bool = False,
) -> Trace:
    """Load a bundled trace (``mooncake-conversation``, ``azure-code``,
    ``azure-conv``), a generated workload (``gen:mix`` ...) or a trace file, then
    spread, window and rate-scale it.

    Args:
        trace: bundled name, ``gen:<shape>[:key=value,...]`` name, or path.
        loader: registered loader name; ``None`` infers it from the bundled name or
            the suffix (``.jsonl``/``.json`` → mooncake, ``.csv`` → azure).
        block_size_tokens: tokens per KV block (≥ 1; Mooncake traces need 512).
        start_s: window start (seconds, ≥ 0) on the spread source timeline.
        duration_s: window length (seconds, > 0) or ``None`` for the rest.
        rate_scale: arrival-rate multiplier (> 0); arrival = (t − start_s) / rate_scale.
        spread_seed: seed for spreading bucketed timestamps (see :func:`_spread`);
            ``None`` disables spreading. Same seed → identical arrivals.
        skip_bad_lines: skip and count bad lines instead of raising.

    Raises:
        ValueError: invalid option, unknown suffix, no valid request, or an empty window.
        TraceFormatError: a bad line (unless ``skip_bad_lines``).
        FileNotFoundError: ``trace`` is neither a bundled name nor a file.
        KeyError: unknown ``loader``.
    """
    _check_options(block_size_tokens, start_s, duration_s, rate_scale)
    if _is_generated(trace):
        name, path, loader_name = str(trace), Path(str(trace)), "generated"
        raw = load_generated(name, block_size_tokens, spread_seed)
    else:
        name, path, loader_name = _resolve(trace, loader)
        raw = TRACE_LOADERS.get(loader_name)(path, block_size_tokens, skip_bad_lines)
    if not raw.requests:
        raise ValueError(f"trace {name!r} ({path}) has no valid requests ({raw.skipped_lines} lines skipped)")
    times, bucket = _spread(np.array([r.arrival_s for r in raw.requests]), spread_seed)
    requests = _window(raw, times, start_s, duration_s, rate_scale)
    if not requests:
        end = "end" if duration_s is None else f"{start_s + duration_s:g} s"
        raise ValueError(
            f"trace {name!r} is empty after windowing: no request arrives in "
            f"[{start_s:g} s, {end}) of a timeline spanning [{times[0]:g} s, {times[-1]:g} s]"
        )
    return Trace(
        name,
        str(path),
        loader_name,
        block_size_tokens,
        requests,
        raw.skipped_lines,
        bucket,
        float(rate_scale),
        float(start_s),
        duration_s,
    )
