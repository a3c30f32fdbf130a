"""``kvcost experiment``: the five configurations (and optionally the learned one) on one trace."""

from __future__ import annotations

from typing import Annotated

import typer

from kvcost.cli.common import MlflowOpt, guard
from kvcost.cli.options import with_settings
from kvcost.cli.summary import prepare_spec, run_arms
from kvcost.cli.tables import EXPERIMENT
from kvcost.replay.online import OnlineSettings
from kvcost.replay.runner import LearnedSetup, experiment_arms
from kvcost.replay.settings import ReplaySettings


@with_settings(EXPERIMENT)
def experiment(
    settings: ReplaySettings,
    learned: Annotated[
        bool, typer.Option(help="Add learned_cost_aware, routing with the MLflow champion's calibrated models.")
    ] = False,
    online: Annotated[bool, typer.Option(help="learned_cost_aware retrains inside the replay instead.")] = False,
    retrain_every_s: Annotated[float, typer.Option(help="Online retraining period, replay seconds.")] = (
        OnlineSettings().retrain_every_s
    ),
    replay_gate: Annotated[
        bool,
        typer.Option(help="Online: a new set routes only if a replay of the latest window with it routes no worse."),
    ] = OnlineSettings().gate_on_replay,
    mlflow_uri: MlflowOpt = None,
) -> None:
    """Replay one trace under balanced_nocache, balanced_cache, cost_aware, cost_aware_tiered, cost_aware_evicting;
    attribute the gains."""
    spec = prepare_spec(settings)
    setup = None
    if learned or online:
        online_settings = (
            guard(lambda: OnlineSettings(retrain_every_s=retrain_every_s, gate_on_replay=replay_gate))
            if online
            else None
        )
        setup = LearnedSetup(online=online_settings, mlflow_uri=mlflow_uri)
    run_arms(spec, experiment_arms(setup is not None, spec.config.eviction_policy), setup)
