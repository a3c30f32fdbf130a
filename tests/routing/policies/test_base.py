"""Tests for kvcost.routing.policies.base: the base class's flags and no-op hooks, make_policy, the replay's truth."""

import logging

import numpy as np
import pandas as pd
import pytest

from kvcost.replay.config import ClusterConfig
from kvcost.replay.simulator import ClusterSimulator
from kvcost.routing.directory import CacheDirectory
from kvcost.routing.policies import DEFAULT_SEED, ROUTER_POLICIES, RouterPolicy, check_policy_params, make_policy
from kvcost.routing.policies.basic import LeastLoadedPolicy
from kvcost.routing.router import Router, RouterSettings
from tests.replay.test_simulator import busy_trace
from tests.routing.policies.test_basic import context


def test_every_registered_policy_is_a_router_policy_and_the_flags_name_oracle_and_learned():
    assert all(issubclass(ROUTER_POLICIES.get(name), RouterPolicy) for name in ROUTER_POLICIES)
    assert [n for n in ROUTER_POLICIES if ROUTER_POLICIES.get(n).replay_only] == ["oracle"]
    learned = [n for n in ROUTER_POLICIES if ROUTER_POLICIES.get(n).learned]
    assert learned == ["learned_cost_aware", "llmd_predicted_latency"]
    assert [n for n in ROUTER_POLICIES if ROUTER_POLICIES.get(n).own_model] == ["llmd_predicted_latency"]
    assert (RouterPolicy.name, RouterPolicy.replay_only, RouterPolicy.learned, RouterPolicy.own_model) == (
        "base",
        False,
        False,
        False,
    )


def test_the_base_hooks_do_nothing_and_choose_is_abstract(make_snapshot):
    policy = RouterPolicy()
    ctx = context(make_snapshot, [0.1, 0.2], [0.0, 0.0])
    assert policy.on_routed(ctx, 0) is None
    assert policy.attach_truth(lambda c: np.zeros(2)) is None
    assert policy.on_outcome(3, 0.5, 1.0) is None
    assert policy.fit_own_model(pd.DataFrame()) is None
    with pytest.raises(NotImplementedError):
        policy.choose(ctx)


def test_make_policy_passes_the_seed_and_the_policys_own_parameters():
    assert DEFAULT_SEED == 0
    assert [make_policy(name).seed for name in ROUTER_POLICIES] == [0] * len(ROUTER_POLICIES.names())
    assert make_policy("round_robin", 7).seed == 7
    assert make_policy("preble_e2", seed=3, kv_capacity_blocks=100).kv_capacity_blocks == 100
    # the seed drives the random tie-breaks: same seed, same stream
    assert make_policy("dynamo_kv", 5)._rng.integers(1 << 30) == np.random.default_rng(5).integers(1 << 30)
    with pytest.raises(TypeError, match="window_s"):
        make_policy("cost_aware", window_s=1.0)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "cost_aware",
            (("window_s", 1.0),),
            "policy_params name 'window_s', expected a parameter of policy 'cost_aware': arrival_price_weight, "
            "duplicate_price_weight, hold_tokens, memory_price_weight",
        ),
        ("least_loaded", (("duplicate_price_weight", 0.0),), "expected a parameter of policy 'least_loaded': none"),
        ("cost_aware", (("memory_price_weight", -1.0),), "memory_price_weight = -1.0, expected a number ≥ 0"),
        ("cost_aware", (("memory_price_weight", "0"),), "policy_params memory_price_weight = '0', expected a number"),
        ("cost_aware", (("memory_price_weight", True),), "memory_price_weight = True, expected a number"),
        ("cost_aware", ("memory_price_weight",), "policy_params entry 'memory_price_weight', expected a (name, value)"),
    ],
)
def test_policy_params_must_be_numbers_the_policy_takes_and_accepts(name, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_policy_params(name, params)


def test_good_policy_params_and_an_unknown_policy_pass_the_check():
    check_policy_params("learned_cost_aware", (("duplicate_price_weight", 0), ("hold_tokens", 64.0)))
    check_policy_params("preble_e2", (("kv_capacity_blocks", 100),))
    check_policy_params("nope", (("x", 1.0),))  # make_policy raises for the name, listing the known ones


def test_make_policy_with_an_unknown_name_names_the_known_ones():
    with pytest.raises(KeyError) as err:
        make_policy("nope", 1)
    assert err.value.args[0] == f"unknown router policy 'nope'; expected one of: {', '.join(ROUTER_POLICIES.names())}"


def test_the_router_calls_on_routed_of_any_policy_after_its_choice(monkeypatch):
    routed = []
    monkeypatch.setattr(LeastLoadedPolicy, "on_routed", lambda self, ctx, index: routed.append((ctx, index)))
    config = ClusterConfig(fleet=("a100", "a100"), router=RouterSettings(policy="least_loaded"))
    trace = busy_trace()
    ClusterSimulator(config, trace.block_size_tokens).run(trace)
    assert [ctx.request.request_id for ctx, _ in routed] == [r.request_id for r in trace.requests]
    assert {index for _, index in routed} <= {0, 1}


def test_the_simulator_gives_the_oracle_its_truth_and_the_oracle_follows_it():
    config = ClusterConfig(fleet=("a100", "a100"), router=RouterSettings(policy="oracle"), jitter_sigma=0.0)
    trace = busy_trace()
    sim = ClusterSimulator(config, trace.block_size_tokens)
    asked = []
    truth = sim.router.policy._truth_s
    sim.router.policy.attach_truth(lambda ctx: asked.append(ctx.request.request_id) or truth(ctx))
    result = sim.run(trace)
    assert asked == [r.request_id for r in trace.requests]
    assert len(result.requests) == len(trace.requests)


def test_a_learned_policy_without_a_learned_model_warns_once_because_of_its_flag(monkeypatch, caplog):
    step_models = {"a100": ClusterSimulator(ClusterConfig(fleet=("a100",)), 16).step_models["a100"]}
    assert Router(CacheDirectory(), step_models, RouterSettings(policy="least_loaded")).fallbacks == 0
    monkeypatch.setattr(LeastLoadedPolicy, "learned", True)
    with caplog.at_level(logging.WARNING, logger="kvcost.routing.router"):
        router = Router(CacheDirectory(), step_models, RouterSettings(policy="least_loaded"))
        router.set_cost_model(None)
    assert router.fallbacks == 1
    assert [r.getMessage() for r in caplog.records if r.name == "kvcost.routing.router"] == [
        "least_loaded has no learned model: routing with the analytic model"
    ]


def test_a_policy_with_its_own_model_does_not_warn_about_the_term_models(monkeypatch, caplog):
    step_models = {"a100": ClusterSimulator(ClusterConfig(fleet=("a100",)), 16).step_models["a100"]}
    monkeypatch.setattr(LeastLoadedPolicy, "learned", True)
    monkeypatch.setattr(LeastLoadedPolicy, "own_model", True)
    with caplog.at_level(logging.WARNING, logger="kvcost.routing.router"):
        router = Router(CacheDirectory(), step_models, RouterSettings(policy="least_loaded"))
        router.set_cost_model(None)
    assert router.fallbacks == 0
    assert [r for r in caplog.records if r.name == "kvcost.routing.router"] == []


def test_only_kvcosts_own_policies_may_be_credited_with_in_flight_prefixes():
    credited = sorted(name for name in ROUTER_POLICIES.names() if ROUTER_POLICIES.get(name).counts_in_flight)
    assert credited == ["cost_aware", "learned_cost_aware"]
