"""Seeded workload generators writing Mooncake-format traces (kvcost issue 13, §1).

Four shapes the bundled conversation trace does not cover, each a function of
a frozen parameter dataclass and a seed; same (parameters, seed) → same trace.
Every request is a Mooncake record ``{"timestamp": ms, "input_length",
"output_length", "hash_ids"}`` (kvcache-ai/Mooncake ``FAST25-release``), so a
generated workload goes wherever ``--trace`` goes (``gen:<shape>`` names, see
:func:`parse_workload_name` and ``kvcost.data.traces.load_trace``) or into a
JSONL file (:func:`write_mooncake_jsonl`).

Block ids
---------
A request's prompt is a sequence of *segments* (a system prompt, a question,
an answer, a tool result ...), each with a stable identity. Block ``b`` covers
tokens ``[512 b, 512 (b + 1))`` of the prompt; its id is interned from (id of
block ``b − 1``, the pieces of segments it covers, with their offsets), so equal
ids mean equal prefixes, as vLLM's chained block hashes do. The **last-block
rule**: a prompt's partial last block gets an id of its own (its pieces end
before the block does), so an id that was a partial last block is never later
a full block of another request (:func:`last_block_rule_violations` checks it).

Shapes and sources of their defaults
------------------------------------
* ``shared-prefix`` — SGLang ``python/sglang/bench_serving.py``,
  ``--dataset-name generated-shared-prefix``: defaults ``--gsp-num-groups 64``,
  ``--gsp-prompts-per-group 16``, ``--gsp-system-prompt-len 2048``,
  ``--gsp-question-len 128``, ``--gsp-output-len 256``; Zipf popularity of the
  system prompts as its ``--gsp-group-distribution zipf --gsp-zipf-alpha 1.0``.
* ``multi-turn`` — vLLM ``benchmarks/multi_turn/generate_multi_turn.json``:
  turns uniform in [12, 18], a 500-token prefix common to all conversations, a
  per-conversation prefix log-normal with mean 1000 and max 5000 tokens,
  questions uniform in [120, 160] tokens, answers uniform in [80, 120] tokens.
  That benchmark is closed-loop (the next turn follows the answer); the think
  time here (exponential, mean 10 s) is an assumption. With 512-token blocks
  the 500-token common prefix fills no block of its own, so conversations
  share no full block: reuse is within a conversation.
* ``agent`` — tool/agent loops sized to the Mooncake FAST'25 tool&agent trace
  (Qin et al., FAST'25, trace table: mean input ≈ 8.6 k tokens, mean output
  ≈ 180 tokens; quoted from memory of the paper): a few long shared tool
  definitions, then short steps (the model's call + a tool result) following
  one another within seconds. Step counts, tool-result lengths and tool
  latency are assumptions, stated on :class:`AgentParams`.
* ``mix`` — the three at equal shares, arrivals warped by bursts (rate ×
  ``burst_factor`` for ``burst_s`` seconds, bursts every ``burst_every_s`` on
  average; an assumption in the spirit of the Azure LLM inference trace 2023,
  Patel et al., Splitwise, ISCA 2024).

Arrival rates are this module's choice: ``kvcost bench`` rescales every
workload by bisection to the utilisation it targets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from kvcost.core.registry import Registry

__all__ = [
    "DEFAULT_REQUESTS",
    "GENERATED_PREFIX",
    "WORKLOADS",
    "AgentParams",
    "MixParams",
    "MooncakeRecord",
    "MultiTurnParams",
    "SharedPrefixParams",
    "Workload",
    "generate",
    "last_block_rule_violations",
    "parse_workload_name",
    "sensitivity_names",
    "write_mooncake_jsonl",
    "write_workload",
]

#: Requests per generated workload by default (issue 13: ≥ 5,000).
DEFAULT_REQUESTS = 5000
#: Trace names starting with this are generated (``gen:mix``, ``gen:agent:seed=1,requests=2000``).
GENERATED_PREFIX = "gen:"
#: Tokens per hash id in Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512

#: One Mooncake trace line: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``.
MooncakeRecord = dict


# ---------------------------------------------------------------- parameters


@dataclass(frozen=True, slots=True)
class SharedPrefixParams:
    """Shared system prompts × many questions (SGLang ``generated-shared-prefix``).

    Attributes:
        requests: requests generated (≥ 1).
        system_prompts: distinct system prompts (``--gsp-num-groups`` 64).
        system_prompt_tokens: tokens of each system prompt (``--gsp-system-prompt-len`` 2048).
        question_tokens: tokens of each unique question (``--gsp-question-len`` 128).
        output_tokens: generated tokens per request (``--gsp-output-len`` 256).
        zipf_alpha: exponent of the Zipf popularity of the system prompts (``--gsp-zipf-alpha`` 1.0).
        arrival_rate_per_s: Poisson arrival rate, requests per second.
    """

    requests: int = DEFAULT_REQUESTS
    system_prompts: int = 64
    system_prompt_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    zipf_alpha: float = 1.0
    arrival_rate_per_s: float = 20.0


@dataclass(frozen=True, slots=True)
class MultiTurnParams:
    """Multi-turn sessions (vLLM ``benchmarks/multi_turn/generate_multi_turn.json``).

    Turn ``k``'s prompt = common prefix + conversation prefix + every earlier
    (question, answer) + question ``k``; it arrives a think time after turn ``k − 1``.

    Attributes:
        requests: requests generated (≥ 1); the last conversation is cut to fit.
        turns_min, turns_max: turns per conversation, uniform (12, 18).
        common_prefix_tokens: prefix shared by all conversations (500).
        conversation_prefix_mean_tokens, conversation_prefix_max_tokens: log-normal
            per-conversation prefix, mean and cap (1000, 5000).
        conversation_prefix_sigma: σ of that log-normal (assumption: 0.5).
        question_min_tokens, question_max_tokens: uniform question length (120, 160).
        answer_min_tokens, answer_max_tokens: uniform answer length (80, 120).
        think_time_mean_s: exponential time between turns (assumption: 10 s).
        conversation_rate_per_s: Poisson rate of new conversations (per second).
    """

    requests: int = DEFAULT_REQUESTS
    turns_min: int = 12
    turns_max: int = 18
    common_prefix_tokens: int = 500
    conversation_prefix_mean_tokens: float = 1000.0
    conversation_prefix_max_tokens: int = 5000
    conversation_prefix_sigma: float = 0.5
    question_min_tokens: int = 120
    question_max_tokens: int = 160
    answer_min_tokens: int = 80
    answer_max_tokens: int = 120
    think_time_mean_s: float = 10.0
    conversation_rate_per_s: float = 1.0


@dataclass(frozen=True, slots=True)
class AgentParams:
    """Tool/agent loops: long shared tool definitions, many short steps in quick succession.

    Step ``k`` of an episode sends tool definitions + task + every earlier (call,
    tool result); the model's call (output) and the tool result join the next step.

    Attributes:
        requests: requests generated (≥ 1); the last episode is cut to fit.
        toolsets: distinct tool-definition blocks, uniform popularity (assumption: 8).
        tool_definition_tokens: tokens of each toolset (assumption: 4000, so that with
            the other defaults the mean prompt is ≈ 8.4 k tokens, near the Mooncake
            tool&agent trace's ≈ 8.6 k).
        task_tokens: the user's task, per episode (assumption: 300).
        steps_mean: mean steps per episode, geometric, ≥ 1 (assumption: 8).
        call_min_tokens, call_max_tokens: model output per step, uniform (assumption: 100, 260,
            mean 180 as the Mooncake tool&agent trace).
        tool_result_min_tokens, tool_result_max_tokens: tool output per step, uniform
            (assumption: 100, 700).
        tool_latency_mean_s: exponential time between steps (assumption: 2 s).
        episode_rate_per_s: Poisson rate of new episodes (per second).
    """

    requests: int = DEFAULT_REQUESTS
    toolsets: int = 8
    tool_definition_tokens: int = 4000
    task_tokens: int = 300
    steps_mean: float = 8.0
    call_min_tokens: int = 100
    call_max_tokens: int = 260
    tool_result_min_tokens: int = 100
    tool_result_max_tokens: int = 700
    tool_latency_mean_s: float = 2.0
    episode_rate_per_s: float = 1.0


@dataclass(frozen=True, slots=True)
class MixParams:
    """The three shapes at equal shares, with bursts.

    Each component keeps its defaults except ``requests`` (a third each); arrival
    time is warped so that the rate is ``burst_factor`` × higher inside bursts.

    Attributes:
        requests: requests generated (≥ 3).
        burst_factor: rate multiplier inside a burst (assumption: 4).
        burst_s: burst length, seconds of the warped timeline (assumption: 20).
        burst_every_s: mean gap between bursts, exponential (assumption: 120 s).
    """

    requests: int = DEFAULT_REQUESTS
    burst_factor: float = 4.0
    burst_s: float = 20.0
    burst_every_s: float = 120.0


# ---------------------------------------------------------------- block ids


class _BlockIds:
    """Interns prefix-consistent block ids for prompts made of named segments.

    A prompt is ``[(segment_key, tokens), ...]``; a segment key identifies content
    (two prompts share a segment only if they share its key and position).
    """

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._ids: dict[tuple, int] = {}

    def hash_ids(self, segments: Sequence[tuple[object, int]]) -> list[int]:
        """Block ids of the prompt (``ceil(tokens / block_tokens)`` of them)."""
        ids: list[int] = []
        parent, pieces, filled = -1, [], 0
        for key, tokens in segments:
            offset = 0
            while offset < tokens:
                take = min(tokens - offset, self.block_tokens - filled)
                pieces.append((key, offset, offset + take))
                offset, filled = offset + take, filled + take
                if filled == self.block_tokens:
                    parent = self._intern(parent, pieces)
                    ids.append(parent)
                    pieces, filled = [], 0
        if pieces:
            ids.append(self._intern(parent, pieces))
        return ids

    def _intern(self, parent: int, pieces: list) -> int:
        return self._ids.setdefault((parent, tuple(pieces)), len(self._ids))


# ---------------------------------------------------------------- shapes


@dataclass(frozen=True, slots=True)
class _Request:
    arrival_s: float
    segments: tuple[tuple[object, int], ...]
    output_tokens: int


def _shared_prefix(p: SharedPrefixParams, rng: np.random.Generator) -> list[_Request]:
    weights = 1.0 / np.arange(1, p.system_prompts + 1) ** p.zipf_alpha
    prompts = rng.choice(p.system_prompts, size=p.requests, p=weights / weights.sum())
    arrivals = np.cumsum(rng.exponential(1.0 / p.arrival_rate_per_s, p.requests))
    return [
        _Request(float(t), ((("sys", int(g)), p.system_prompt_tokens), (("q", i), p.question_tokens)), p.output_tokens)
        for i, (g, t) in enumerate(zip(prompts, arrivals, strict=True))
    ]


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, cap: int) -> int:
    mu = math.log(mean) - sigma**2 / 2
    return int(min(cap, max(1, round(rng.lognormal(mu, sigma)))))


def _multi_turn(p: MultiTurnParams, rng: np.random.Generator) -> list[_Request]:
    out: list[_Request] = []
    start_s, c = 0.0, 0
    while len(out) < p.requests:
        start_s += rng.exponential(1.0 / p.conversation_rate_per_s)
        turns = int(rng.integers(p.turns_min, p.turns_max + 1))
        prefix = _lognormal_tokens(
            rng, p.conversation_prefix_mean_tokens, p.conversation_prefix_sigma, p.conversation_prefix_max_tokens
        )
        context: list[tuple[object, int]] = [(("common",), p.common_prefix_tokens), (("conv", c), prefix)]
        t = start_s
        for k in range(min(turns, p.requests - len(out))):
            question = (("q", c, k), int(rng.integers(p.question_min_tokens, p.question_max_tokens + 1)))
            answer = int(rng.integers(p.answer_min_tokens, p.answer_max_tokens + 1))
            out.append(_Request(t, (*context, question), answer))
            context += [question, (("a", c, k), answer)]
            t += rng.exponential(p.think_time_mean_s)
        c += 1
    return out


def _agent(p: AgentParams, rng: np.random.Generator) -> list[_Request]:
    out: list[_Request] = []
    start_s, e = 0.0, 0
    while len(out) < p.requests:
        start_s += rng.exponential(1.0 / p.episode_rate_per_s)
        steps = int(rng.geometric(1.0 / p.steps_mean))
        tools = (("tools", int(rng.integers(p.toolsets))), p.tool_definition_tokens)
        context: list[tuple[object, int]] = [tools, (("task", e), p.task_tokens)]
        t = start_s
        for k in range(min(steps, p.requests - len(out))):
            call = int(rng.integers(p.call_min_tokens, p.call_max_tokens + 1))
            out.append(_Request(t, tuple(context), call))
            result = int(rng.integers(p.tool_result_min_tokens, p.tool_result_max_tokens + 1))
            context += [(("call", e, k), call), (("result", e, k), result)]
            t += rng.exponential(p.tool_latency_mean_s)
        e += 1
    return out


def _burst_warp(times_s: np.ndarray, p: MixParams, rng: np.random.Generator) -> np.ndarray:
    """Map homogeneous arrival times onto a timeline whose rate is ``burst_factor`` × inside bursts.

    Real time t carries ``burst_factor`` units of homogeneous time per second
    inside a burst and 1 outside; returns t for every homogeneous time.
    """
    horizon = float(times_s.max(initial=0.0))
    real, work = [0.0], [0.0]
    while work[-1] <= horizon:
        gap = rng.exponential(p.burst_every_s)
        real += [real[-1] + gap, real[-1] + gap + p.burst_s]
        work += [work[-1] + gap, work[-1] + gap + p.burst_s * p.burst_factor]
    return np.interp(times_s, work, real)


def _mix(p: MixParams, rng: np.random.Generator) -> list[_Request]:
    shares = [p.requests // 3 + (1 if i < p.requests % 3 else 0) for i in range(3)]
    parts = [
        _shared_prefix(SharedPrefixParams(requests=shares[0]), rng),
        _multi_turn(MultiTurnParams(requests=shares[1]), rng),
        _agent(AgentParams(requests=shares[2]), rng),
    ]
    tagged = [
        replace(r, segments=tuple(((i, key), n) for key, n in r.segments)) for i, part in enumerate(parts) for r in part
    ]
    warped = _burst_warp(np.array([r.arrival_s for r in tagged]), p, rng)
    return [replace(r, arrival_s=float(t)) for r, t in zip(tagged, warped, strict=True)]


# ---------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class Workload:
    """A registered shape: its parameter class and the function drawing its requests."""

    params: type
    draw: Callable[[object, np.random.Generator], list[_Request]]

    def check(self, params: object) -> None:
        """Raise ``ValueError`` naming the first parameter out of range.

        Every parameter is a finite number > 0; besides, ``*_min*`` ≤ ``*_max*``,
        ``steps_mean`` ≥ 1, ``burst_factor`` ≥ 1 and a mix has ≥ 3 requests.
        """
        name = type(params).__name__
        values = {f.name: getattr(params, f.name) for f in fields(params)}
        for key, value in values.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}.{key} = {value!r}, expected a finite number > 0")
        for key, lowest in (("steps_mean", 1), ("burst_factor", 1), ("requests", 3 if name == "MixParams" else 1)):
            if key in values and values[key] < lowest:
                raise ValueError(f"{name}.{key} = {values[key]!r}, expected a number ≥ {lowest}")
        for key, value in values.items():
            high = key.replace("_min", "_max")
            if "_min" in key and high in values and value > values[high]:
                raise ValueError(f"{name}.{key} = {value!r}, expected ≤ {high} = {values[high]!r}")


#: Generated workload shapes by name.
WORKLOADS: Registry[Workload] = Registry("workload")
WORKLOADS.add("shared-prefix", Workload(SharedPrefixParams, _shared_prefix))
WORKLOADS.add("multi-turn", Workload(MultiTurnParams, _multi_turn))
WORKLOADS.add("agent", Workload(AgentParams, _agent))
WORKLOADS.add("mix", Workload(MixParams, _mix))


def parse_workload_name(name: str) -> tuple[str, object, int | None]:
    """Parse ``gen:<shape>[:key=value,...]`` into (shape, parameters, seed or None).

    Keys are the shape's parameter fields plus ``seed``; values are converted to
    the field's type. Example: ``gen:multi-turn:seed=1,think_time_mean_s=20``.

    Raises:
        ValueError: not a ``gen:`` name, unknown key, or a value of the wrong type / range.
        KeyError: unknown shape (the message lists the shapes).
    """
    if not name.startswith(GENERATED_PREFIX):
        raise ValueError(f"trace = {name!r}, expected a generated workload name '{GENERATED_PREFIX}<shape>[:k=v,...]'")
    shape, _, options = name[len(GENERATED_PREFIX) :].partition(":")
    workload = WORKLOADS.get(shape)
    types = {f.name: f.type for f in fields(workload.params)}
    values: dict[str, object] = {}
    seed = None
    for item in filter(None, (s.strip() for s in options.split(","))):
        key, eq, text = item.partition("=")
        if not eq or (key not in types and key != "seed"):
            known = ", ".join(["seed", *types])
            raise ValueError(f"trace = {name!r}: option {item!r}, expected key=value with key one of: {known}")
        kind = "int" if key == "seed" else types[key]
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            raise ValueError(
                f"trace = {name!r}: {key} = {text!r}, expected {'an integer' if kind == 'int' else 'a number'}"
            ) from None
        if key == "seed":
            if value < 0:
                raise ValueError(f"trace = {name!r}: seed = {value}, expected an integer ≥ 0 (numpy's seeds)")
            seed = value
        else:
            values[key] = value
    params = workload.params(**values)
    try:
        workload.check(params)
    except ValueError as exc:  # name the option as the user wrote it, not the parameter class
        raise ValueError(f"trace = {name!r}: {str(exc).partition('.')[2]}") from None
    return shape, params, seed


def generate(shape: str, params: object | None = None, seed: int = 0) -> list[MooncakeRecord]:
    """Draw workload ``shape`` (a :data:`WORKLOADS` name) as Mooncake records, in arrival order.

    Timestamps are integer milliseconds from the first arrival (the bundled
    Mooncake traces' unit); ``hash_ids`` has ``ceil(input_length / 512)`` ids.
    Deterministic: same (shape, params, seed) → same records.

    Raises:
        KeyError: unknown shape. ValueError: a parameter out of range.
    """
    workload = WORKLOADS.get(shape)
    params = workload.params() if params is None else params
    if not isinstance(params, workload.params):
        raise ValueError(f"params = {params!r}, expected a {workload.params.__name__} for shape {shape!r}")
    workload.check(params)
    requests = workload.draw(params, np.random.default_rng(seed))
    requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep generation order
    ids = _BlockIds()
    first_s = requests[0].arrival_s if requests else 0.0
    return [
        {
            "timestamp": int(round((r.arrival_s - first_s) * 1000)),
            "input_length": sum(n for _, n in r.segments),
            "output_length": r.output_tokens,
            "hash_ids": ids.hash_ids(r.segments),
        }
        for r in requests
    ]


def write_mooncake_jsonl(records: Iterable[MooncakeRecord], path: Path) -> int:
    """Write records as Mooncake JSONL (one object per line); returns the number written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, separators=(", ", ": ")) + "\n")
            n += 1
    return n


def sensitivity_names(shape: str, seed: int = 0, factors: Sequence[float] = (0.5, 2.0)) -> list[str]:
    """``gen:`` names of ``shape`` with each parameter (but ``requests``) × each factor, at ``seed``.

    Issue 13 reports seeds 1 and 2 and every parameter at ×0.5 and ×2. A
    ``*_min`` / ``*_max`` pair scales together (one range), so it stays ordered;
    integer parameters are rounded and kept ≥ 1. Every name parses.
    """
    defaults = WORKLOADS.get(shape).params()
    values = {f.name: (getattr(defaults, f.name), f.type) for f in fields(defaults) if f.name != "requests"}
    names = []
    for key in values:
        if "_max" in key and key.replace("_max", "_min") in values:
            continue
        group = [key] + ([key.replace("_min", "_max")] if "_min" in key else [])
        for factor in factors:
            scaled = {k: values[k][0] * factor for k in group}
            text = ",".join(f"{k}={max(1, round(v)) if values[k][1] == 'int' else v:g}" for k, v in scaled.items())
            names.append(f"{GENERATED_PREFIX}{shape}:seed={seed},{text}")
    return names


def write_workload(name: str, path: Path, seed: int = 0) -> int:
    """Write generated workload ``name`` (``gen:<shape>[:key=value,...]``; ``seed=`` in it wins over
    ``seed``) to ``path`` as Mooncake JSONL; returns the number of requests.

    Raises:
        ValueError, KeyError: as :func:`parse_workload_name`.
    """
    shape, params, named_seed = parse_workload_name(name)
    return write_mooncake_jsonl(generate(shape, params, seed if named_seed is None else named_seed), path)


def parent_rule_violation(ids: Sequence[int], parents: dict[int, int | None]) -> tuple[int, int | None, int] | None:
    """The first id of one request's ``ids`` that follows another parent than it did before, as ``(id, earlier
    parent, parent here)`` (None: the first block), or None; then ``ids`` join ``parents`` (id → parent, shared
    over a trace's requests in order). An id names one prefix block (the Mooncake format: an id always has
    the same parent), so one id under two parents would be counted as a hit it is not.
    """
    pairs = list(zip([None, *ids[:-1]], ids, strict=True))  # (parent, id)
    for parent, block in pairs:
        earlier = parents.get(block, parent)
        if earlier != parent:
            return block, earlier, parent
    for parent, block in pairs:
        parents.setdefault(block, parent)
    return None


def last_block_rule_violations(
    records: Sequence[MooncakeRecord], block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[int]:
    """Ids that were some request's partial last block and later a full block of a request.

    Empty for every generated workload; a non-empty list means a cache would
    count a block as fully cached that an earlier request only partly filled.
    """
    partial: set[int] = set()
    bad: list[int] = []
    for r in records:
        full = r["input_length"] // block_tokens
        bad += [h for h in r["hash_ids"][:full] if h in partial]
        if r["input_length"] % block_tokens:
            partial.add(r["hash_ids"][-1])
    return bad
