"""``kvcost replay``: one trace under one router policy, prefix cache on or off."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from kvcost.cli.common import guard
from kvcost.cli.options import with_settings
from kvcost.cli.summary import prepare_spec, run_arms
from kvcost.cli.tables import REPLAY
from kvcost.replay.experiment import Configuration
from kvcost.replay.settings import ReplaySettings
from kvcost.routing.policies import ROUTER_POLICIES, check_policy_params


class CacheSwitch(StrEnum):
    """``--cache on|off``."""

    on = "on"
    off = "off"


@with_settings(REPLAY)
def replay(
    policy: Annotated[str, typer.Option(help=f"Router policy: {', '.join(ROUTER_POLICIES.names())}.")] = "cost_aware",
    cache: Annotated[CacheSwitch, typer.Option(help="Prefix cache on or off.")] = CacheSwitch.on,
    *,
    settings: ReplaySettings,
) -> None:
    """Replay one trace under one policy, cache on or off."""

    def check_policy() -> None:
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"policy = {policy!r}, expected one of {', '.join(ROUTER_POLICIES.names())}")
        check_policy_params(policy, settings.policy_params)

    guard(check_policy)
    spec = prepare_spec(settings)
    enabled = cache is CacheSwitch.on
    run_arms(spec, [Configuration(f"{policy}_{'cache' if enabled else 'nocache'}", policy, enabled)])
