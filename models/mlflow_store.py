"""Model registry and review with MLflow: log a training run, register, promote, list, load.

One registered model, ``kvcost-terms``, holds the whole set (five term
predictors + calibrators) per version, so that a version is always a
consistent set trained together on one data window. Each training run also
logs every learned term predictor with MLflow's native flavour (lightgbm or
sklearn) for review, its metrics, parameters, the feature-spec hash, the data
window, the resolved configuration, and the holdout rows it was evaluated on
(``holdout/holdout.parquet``), which promotion uses to compare challenger and
champion on the same data.

Aliases: a new version becomes ``challenger``; :func:`promote` moves
``champion`` to it only if its holdout TTFT MAE and its 90 % coverage error
``|coverage − 0.9|`` are no worse than the champion's on the challenger's
holdout, and, when a routing gate is given (``kvcost models promote --trace``:
a replay of the latest window, :mod:`kvcost.replay.promotion`), if it routes no
worse; unless forced with a recorded reason.

Default store: a local SQLite tracking database and an artifact folder under
``runs/`` (no server). Another SQLite URI keeps its artifacts next to its
database (``mlartifacts/`` beside the file); a tracking server keeps them where
it is configured to. Review with::

    mlflow ui --backend-store-uri sqlite:///runs/mlflow.db
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvcost.models.predictors import FeatureSpecMismatch
from kvcost.models.term_set import TermModelSet

REGISTERED_MODEL = "kvcost-terms"
EXPERIMENT = "kvcost-training"
DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"
CHAMPION, CHALLENGER = "champion", "challenger"
_PYFUNC_CODE = Path(__file__).with_name("mlflow_pyfunc.py")


@dataclass(frozen=True, slots=True)
class RegisteredVersion:
    """A logged and registered training run."""

    version: str
    run_id: str


@dataclass(frozen=True, slots=True)
class RoutingVerdict:
    """A routing gate's answer: whether the challenger routes no worse, and each side's figures.

    Attributes:
        passed: the challenger may be promoted as far as routing goes.
        figures: ``{"challenger": {...}, "champion": {...}}``, e.g. TTFT P50 and P99 in seconds.
        note: what was compared (printed with the verdict).
    """

    passed: bool
    figures: dict[str, dict]
    note: str


#: ``(challenger, champion or None when none can be loaded) → RoutingVerdict``.
RoutingGate = Callable[[TermModelSet, TermModelSet | None], RoutingVerdict]


@dataclass(frozen=True, slots=True)
class Promotion:
    """Outcome of :func:`promote`: whether ``champion`` moved, both sides' holdout figures, and the
    routing gate's verdict (None when gated on the holdout alone)."""

    promoted: bool
    version: str
    challenger: dict
    champion: dict | None
    message: str
    routing: RoutingVerdict | None = None


def _mlflow(uri: str | None):
    import mlflow  # imported lazily: it takes ~2 s

    mlflow.set_tracking_uri(uri or DEFAULT_TRACKING_URI)
    return mlflow


def _client(uri: str | None):
    from mlflow import MlflowClient

    return MlflowClient(_mlflow(uri).get_tracking_uri())


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def check_tracking_uri(uri: str) -> str:
    """``uri``, unless it names a SQLite store in a folder that does not exist.

    MLflow would create that folder and an empty database silently, so a mistyped
    ``sqlite:////nonexistent/dir/mlflow.db`` would run on without a champion (kvcost issue 15).
    The default store (:data:`DEFAULT_TRACKING_URI`, under kvcost's own ``runs/``, made as needed)
    and other stores are returned as given.

    Raises:
        ValueError: names the URI and the missing folder.
    """
    store = _sqlite_file(uri)
    if store is not None and uri != DEFAULT_TRACKING_URI:
        folder = store.parent
        if not folder.is_dir():
            raise ValueError(
                f"mlflow_uri = {uri!r}: the folder {str(folder)!r} does not exist, expected the folder of the "
                "SQLite store to exist (create it, or correct the path)"
            )
    return uri


def artifact_root_for(uri: str | None) -> Path | None:
    """Artifact folder of a new experiment: ``mlartifacts/`` beside a SQLite tracking database
    (``runs/mlartifacts`` for the default store); None for any other store (a tracking server
    or a ``file:`` store places them itself)."""
    store = _sqlite_file(uri or DEFAULT_TRACKING_URI)
    return None if store is None else store.parent / "mlartifacts"


def _experiment_id(mlflow, artifact_root: Path | None) -> str:
    exp = mlflow.get_experiment_by_name(EXPERIMENT)
    if exp is not None:
        return exp.experiment_id
    if artifact_root is None:
        return mlflow.create_experiment(EXPERIMENT)
    artifact_root.mkdir(parents=True, exist_ok=True)
    return mlflow.create_experiment(EXPERIMENT, artifact_location=artifact_root.resolve().as_uri())


def _flat_metrics(evaluation: dict) -> dict[str, float]:
    out = {"coverage_90": evaluation["coverage_90"]}
    for kind in ("learned", "analytic"):
        for term, metrics in evaluation[kind].items():
            out |= {f"{kind}.{term}.{name}": value for name, value in metrics.items() if value == value}
    return out


def log_and_register(
    model_set: TermModelSet,
    evaluation: dict,
    holdout: pd.DataFrame,
    config: dict,
    uri: str | None = None,
    artifact_root: Path | None = None,
) -> RegisteredVersion:
    """Log one training run, register its model set as a new ``kvcost-terms`` version, alias it ``challenger``.

    ``artifact_root`` (only used when the experiment is created): default :func:`artifact_root_for` the URI.
    """
    mlflow = _mlflow(uri)
    experiment_id = _experiment_id(mlflow, artifact_root or artifact_root_for(uri))
    with mlflow.start_run(experiment_id=experiment_id) as run, tempfile.TemporaryDirectory() as tmp:
        mlflow.set_tag("feature_spec_hash", model_set.metadata["feature_spec_hash"])
        mlflow.log_params(
            {
                "predictor": model_set.metadata.get("predictor"),
                "feature_spec_hash": model_set.metadata["feature_spec_hash"],
                **{f"rows.{k}": v for k, v in model_set.metadata.get("rows", {}).items()},
            }
        )
        mlflow.log_metrics(_flat_metrics(evaluation))
        mlflow.log_dict({"config": config, "metadata": model_set.metadata, "evaluation": evaluation}, "training.json")
        _log_flavours(mlflow, model_set)
        holdout_path = Path(tmp) / "holdout.parquet"
        holdout.to_parquet(holdout_path, index=False)
        mlflow.log_artifact(str(holdout_path), "holdout")
        set_dir = model_set.save(Path(tmp) / "term_set")
        info = mlflow.pyfunc.log_model(
            name=REGISTERED_MODEL,
            python_model=str(_PYFUNC_CODE),
            artifacts={"term_set": str(set_dir)},
            registered_model_name=REGISTERED_MODEL,
            pip_requirements=["kvcost", "lightgbm", "scikit-learn", "pandas", "numpy"],
        )
    version = str(info.registered_model_version)
    _client(uri).set_registered_model_alias(REGISTERED_MODEL, CHALLENGER, version)
    return RegisteredVersion(version, run.info.run_id)


def _log_flavours(mlflow, model_set: TermModelSet) -> None:
    for term, predictor in model_set.predictors.items():
        if hasattr(predictor, "booster"):
            import mlflow.lightgbm

            mlflow.lightgbm.log_model(predictor.booster, name=f"term-{term}")
        elif hasattr(predictor, "estimator"):
            import mlflow.sklearn

            mlflow.sklearn.log_model(predictor.estimator, name=f"term-{term}")


def load_model_set(uri: str | None = None, alias: str = CHAMPION) -> TermModelSet:
    """Download and load the version that carries ``alias``.

    Raises:
        LookupError: no registered model or no version with that alias.
        FeatureSpecMismatch: the version was trained under another feature spec.
    """
    mlflow = _mlflow(uri)
    try:
        path = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{REGISTERED_MODEL}@{alias}")
    except Exception as exc:  # MLflow raises MlflowException / RestException subclasses
        raise LookupError(f"no {REGISTERED_MODEL} version with alias {alias!r} at {mlflow.get_tracking_uri()}") from exc
    return TermModelSet.load(Path(path) / "artifacts" / "term_set")


def list_versions(uri: str | None = None) -> list[dict]:
    """Every ``kvcost-terms`` version, newest first: version, aliases, run id, spec hash, key metrics.

    A SQLite store whose file does not exist has no versions: ``[]``, and the file is not created
    (MLflow would create and migrate an empty database, ~8 s, as a side effect of a listing).
    """
    store = _sqlite_file(uri or DEFAULT_TRACKING_URI)
    if store is not None and not store.exists():
        return []
    client = _client(uri)
    try:
        versions = client.search_model_versions(f"name = '{REGISTERED_MODEL}'")
    except Exception:
        return []
    rows = []
    for found in sorted(versions, key=lambda v: int(v.version), reverse=True):
        v = client.get_model_version(REGISTERED_MODEL, found.version)  # search results omit aliases
        metrics = client.get_run(v.run_id).data.metrics
        rows.append(
            {
                "version": str(v.version),
                "aliases": sorted(v.aliases),
                "run_id": v.run_id,
                "feature_spec_hash": client.get_run(v.run_id).data.tags.get("feature_spec_hash"),
                "ttft_mae_s": metrics.get("learned.ttft.mae_s"),
                "analytic_ttft_mae_s": metrics.get("analytic.ttft.mae_s"),
                "coverage_90": metrics.get("coverage_90"),
            }
        )
    return rows


def promote(
    uri: str | None = None,
    version: str | None = None,
    force: bool = False,
    reason: str = "",
    routing_gate: RoutingGate | None = None,
) -> Promotion:
    """Move ``champion`` to ``version`` (default: the ``challenger``) if it is no worse on the same holdout.

    Both versions are evaluated on the challenger's holdout rows. The gate: TTFT
    MAE and ``|coverage_90 − 0.9|`` each no worse than the champion's (without a
    loadable champion, TTFT MAE no worse than the analytic model's, which routes
    meanwhile: a model trained on a short or biased log must not replace a profile
    that predicts better; the replay's online learning gates alike,
    :meth:`~kvcost.replay.online.OnlineLearner.maybe_retrain`), and, with
    ``routing_gate``, its verdict (it is asked even without a champion: then the
    challenger is compared with what routes meanwhile, the analytic model). Without
    one the message says the promotion was gated on MAE and coverage only (a live
    log without block hashes or an engine profile cannot be replayed). ``force``
    skips the gates and records ``reason`` (required) as a tag on the version. A
    champion trained under another feature spec cannot be loaded (the router
    serves the analytic model meanwhile), so it counts as absent and the message
    says so.

    Raises:
        LookupError: no such version / no challenger. ValueError: ``force`` without a reason.
    """
    from kvcost.models.training import evaluate

    if force and not reason.strip():
        raise ValueError("force = True needs a reason (--reason), which is recorded on the version")
    client = _client(uri)
    mlflow = _mlflow(uri)
    version = version or _alias_version(client, CHALLENGER)
    mv = client.get_model_version(REGISTERED_MODEL, version)
    with tempfile.TemporaryDirectory() as tmp:  # MLflow's own download folder would be left behind
        holdout_dir = mlflow.artifacts.download_artifacts(run_id=mv.run_id, artifact_path="holdout", dst_path=tmp)
        holdout = pd.read_parquet(Path(holdout_dir) / "holdout.parquet")
    challenger_set = _load_version(mlflow, version)
    challenger = _gate_figures(evaluate(challenger_set, holdout))
    champion_version = _alias_version(client, CHAMPION, missing_ok=True)
    champion, champion_set, unloadable = None, None, ""
    if champion_version is not None:
        try:
            champion_set = _load_version(mlflow, champion_version)
            champion = _gate_figures(evaluate(champion_set, holdout))
        except FeatureSpecMismatch as exc:  # the router cannot load it either: it serves analytic
            unloadable = f" (champion version {champion_version} cannot be loaded, so no gate: {exc})"
    if champion is None:  # the analytic model routes meanwhile: beat its TTFT MAE (it serves no bounds)
        passed, against = challenger["ttft_mae_s"] <= challenger["analytic_ttft_mae_s"], "the analytic model"
    else:
        passed, against = (
            (
                challenger["ttft_mae_s"] <= champion["ttft_mae_s"]
                and challenger["coverage_error"] <= champion["coverage_error"]
            ),
            "champion",
        )
    routing = routing_gate(challenger_set, champion_set) if routing_gate is not None else None
    passed = passed and (routing is None or routing.passed)
    if passed or force:
        client.set_registered_model_alias(REGISTERED_MODEL, CHAMPION, version)
        if force and not passed:
            client.set_model_version_tag(REGISTERED_MODEL, version, "forced_promotion_reason", reason)
    verdict = "promoted" if passed else ("promoted by force: " + reason if force else f"refused: worse than {against}")
    gated = f"; {routing.note}" if routing is not None else "; gated on TTFT MAE and coverage only (no replay)"
    message = f"version {version} {verdict}{unloadable}{gated}"
    return Promotion(passed or force, version, challenger, champion, message, routing)


def _gate_figures(evaluation: dict) -> dict:
    cov = evaluation["coverage_90"]
    return {
        "ttft_mae_s": evaluation["learned"]["ttft"]["mae_s"],
        "analytic_ttft_mae_s": evaluation["analytic"]["ttft"]["mae_s"],
        "coverage_90": cov,
        "coverage_error": abs(cov - 0.9),
    }


def _alias_version(client, alias: str, missing_ok: bool = False) -> str | None:
    try:
        return str(client.get_model_version_by_alias(REGISTERED_MODEL, alias).version)
    except Exception:
        if missing_ok:
            return None
        raise LookupError(f"no {REGISTERED_MODEL} version has alias {alias!r}; train one with `kvcost train`") from None


def _load_version(mlflow, version: str) -> TermModelSet:
    path = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{REGISTERED_MODEL}/{version}")
    return TermModelSet.load(Path(path) / "artifacts" / "term_set")
