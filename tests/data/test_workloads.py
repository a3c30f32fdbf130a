"""Generated workloads: exact block ids, determinism under a seed, the last-block rule, gen: names."""

import pytest

from kvcost.data.traces import load_trace
from kvcost.data.workloads import (
    DEFAULT_REQUESTS,
    WORKLOADS,
    AgentParams,
    MultiTurnParams,
    SharedPrefixParams,
    _BlockIds,
    generate,
    last_block_rule_violations,
    parent_rule_violation,
    parse_workload_name,
    sensitivity_names,
    write_mooncake_jsonl,
)


def test_block_ids_are_prefix_chained_and_a_partial_last_block_gets_its_own_id():
    ids = _BlockIds(block_tokens=512)
    assert ids.hash_ids([("sys", 1024), ("q1", 100)]) == [0, 1, 2]
    assert ids.hash_ids([("sys", 1024), ("q2", 100)]) == [0, 1, 3]
    # turn 2 of a session: block 2 is now full (q1 + answer) — a new id, not the partial id 2
    assert ids.hash_ids([("sys", 1024), ("q1", 100), ("a1", 500)]) == [0, 1, 4, 5]
    assert ids.hash_ids([("other", 1024)]) == [6, 7]


def test_shared_prefix_exact_records():
    params = SharedPrefixParams(requests=3, system_prompts=1, system_prompt_tokens=1024, question_tokens=100)
    records = generate("shared-prefix", params, seed=0)
    assert [r["hash_ids"] for r in records] == [[0, 1, 2], [0, 1, 3], [0, 1, 4]]
    assert [(r["input_length"], r["output_length"]) for r in records] == [(1124, 256)] * 3
    assert records[0]["timestamp"] == 0
    assert records[1]["timestamp"] < records[2]["timestamp"]


@pytest.mark.parametrize("shape", WORKLOADS.names())
def test_generator_is_deterministic_under_a_seed_and_respects_the_last_block_rule(shape):
    params = WORKLOADS.get(shape).params(requests=600)
    first = generate(shape, params, seed=0)
    assert first == generate(shape, params, seed=0)
    assert first != generate(shape, params, seed=1)
    assert len(first) == 600
    assert last_block_rule_violations(first) == []
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in first)
    stamps = [r["timestamp"] for r in first]
    assert stamps == sorted(stamps) and stamps[0] == 0


def test_last_block_rule_checker_flags_a_partial_block_reused_as_full():
    records = [
        {"input_length": 700, "hash_ids": [0, 1]},  # block 1 partial (188 tokens)
        {"input_length": 1024, "hash_ids": [0, 1]},  # block 1 full: the violation
    ]
    assert last_block_rule_violations(records) == [1]


def test_multi_turn_context_grows_by_answer_and_question():
    params = MultiTurnParams(requests=3, turns_min=3, turns_max=3, answer_min_tokens=90, answer_max_tokens=90)
    records = generate("multi-turn", params, seed=0)
    lengths = [r["input_length"] for r in records]
    assert all(120 <= later - earlier - 90 <= 160 for earlier, later in zip(lengths[:-1], lengths[1:], strict=True))
    assert [r["output_length"] for r in records] == [90, 90, 90]
    first, second = records[0]["hash_ids"], records[1]["hash_ids"]
    full = lengths[0] // 512
    assert second[:full] == first[:full] and second[full] != first[full]  # turn 1's partial block is not reused


def test_agent_steps_share_the_tool_definitions():
    params = AgentParams(requests=4, toolsets=1, steps_mean=1.0)  # one step per episode
    records = generate("agent", params, seed=0)
    assert {tuple(r["hash_ids"][:7]) for r in records} == {(0, 1, 2, 3, 4, 5, 6)}  # 4000 tokens = 7 full blocks


def test_default_size_is_at_least_5000_requests():
    assert DEFAULT_REQUESTS >= 5000
    assert len(generate("mix")) == DEFAULT_REQUESTS


def test_names_parse_into_parameters_and_seed():
    shape, params, seed = parse_workload_name("gen:multi-turn:seed=2,think_time_mean_s=20,requests=100")
    assert (shape, seed) == ("multi-turn", 2)
    assert params == MultiTurnParams(requests=100, think_time_mean_s=20.0)
    assert parse_workload_name("gen:agent")[2] is None


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("gen:nope", KeyError, "unknown workload 'nope'"),
        ("gen:agent:steps=3", ValueError, "option 'steps=3', expected key=value with key one of: seed, requests"),
        ("gen:agent:requests=many", ValueError, "requests = 'many', expected an integer"),
        ("gen:agent:requests=0", ValueError, "^trace = 'gen:agent:requests=0': requests = 0, expected a finite number"),
        ("gen:multi-turn:turns_min=20", ValueError, ": turns_min = 20, expected ≤ turns_max = 18$"),
        ("gen:mix:requests=2", ValueError, ": requests = 2, expected a number ≥ 3$"),
        ("gen:mix:seed=-1", ValueError, "^trace = 'gen:mix:seed=-1': seed = -1, expected an integer ≥ 0"),
    ],
)
def test_bad_names_say_what_is_wrong(name, error, message):
    with pytest.raises(error, match=message):
        parse_workload_name(name)


def test_generated_trace_loads_like_its_jsonl_file(tmp_path):
    name = "gen:mix:requests=300,seed=3"
    in_memory = load_trace(name)
    path = tmp_path / "mix.jsonl"
    assert write_mooncake_jsonl(generate("mix", parse_workload_name(name)[1], seed=3), path) == 300
    from_file = load_trace(path)
    assert in_memory.requests == from_file.requests
    assert (in_memory.loader, in_memory.source, from_file.loader) == ("generated", name, "mooncake")


def test_seed_comes_from_the_name_else_the_run_seed():
    a = load_trace("gen:agent:requests=50", spread_seed=1)
    b = load_trace("gen:agent:requests=50,seed=1", spread_seed=0)
    c = load_trace("gen:agent:requests=50", spread_seed=0)
    assert a.requests == b.requests != c.requests


def test_sensitivity_names_scale_each_parameter_and_ranges_together():
    names = sensitivity_names("multi-turn", seed=1)
    assert names[:2] == [
        "gen:multi-turn:seed=1,turns_min=6,turns_max=9",
        "gen:multi-turn:seed=1,turns_min=24,turns_max=36",
    ]
    assert len(names) == 2 * 9  # 12 parameters besides requests, 3 min/max ranges scaled as one
    assert parse_workload_name(names[-1])[1] == MultiTurnParams(conversation_rate_per_s=2.0)


def test_an_id_under_another_parent_is_the_violation_and_a_clean_request_joins_the_parents():
    parents: dict[int, int | None] = {}
    assert parent_rule_violation([0, 1, 2], parents) is None
    assert parents == {0: None, 1: 0, 2: 1}
    assert parent_rule_violation([5, 1], parents) == (1, 0, 5)
    assert parent_rule_violation([7, 0], parents) == (0, None, 7)
    assert parents == {0: None, 1: 0, 2: 1}  # a refused request leaves nothing behind
    assert parent_rule_violation([0, 1, 9], parents) is None and parents[9] == 1
