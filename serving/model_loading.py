"""The service's cost model: the MLflow champion when it loads, else the analytic model, and why.

:class:`ModelManager` loads (and reloads) the champion in a thread with a
timeout; a failure while no champion is loaded falls back to the analytic
model, marks the service degraded (``/readyz``) and counts
``kvcost_model_fallbacks_total``. It also lists the registry's versions for
``GET /v1/cost-models``. :func:`default_step_models` gives the step-time model of
every GPU type the service can score.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvcost.core.engine_profile import EngineProfile
from kvcost.core.hardware import GPUS, StepTimeModel
from kvcost.core.reporting import json_safe
from kvcost.features.spec import feature_spec_hash
from kvcost.models.term_set import TermModelSet
from kvcost.serving.metrics import FALLBACK_REASONS, ServiceMetrics
from kvcost.serving.schemas import ModelsResponse, ModelStatusOut

_log = logging.getLogger(__name__)

ModelLoader = Callable[[], tuple[TermModelSet, str | None]]
"""Loads the champion: returns the model set and its registry version (None if unknown). Runs in a thread."""
RegistryLister = Callable[[], list[dict]]
"""Lists the registry's versions (rows of :func:`kvcost.models.mlflow_store.list_versions`). Runs in a thread."""


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """The cost model in use and why (see :class:`kvcost.serving.schemas.ModelStatusOut`)."""

    kind: str
    source: str
    version: str | None
    status: str
    reason: str
    loaded_at_s: float | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``analytic``, ``champion`` or ``champion vN``."""
        if self.source != "champion":
            return "analytic"
        return f"champion v{self.version}" if self.version else "champion"


def default_step_models(model: str, tp: int = 1, profiles: Sequence[str | Path] = ()) -> dict[str, StepTimeModel]:
    """Step-time model of ``model`` (name or ``config.json`` path) at tensor-parallel degree ``tp``
    on every GPU type of the table (measured profiles where bundled, the roofline elsewhere), plus
    one GPU type per ``kvcost profile`` file of ``profiles``, named after it.

    Raises:
        FileNotFoundError, ValueError: a profile file that cannot be read.
    """
    models = {}
    for gpu in GPUS.names():
        try:
            models[gpu] = StepTimeModel.for_hardware(model, gpu, tp=tp)
        except KeyError:
            _log.info("no profile of %s on %s: snapshots naming it are refused", model, gpu)
    for path in profiles:
        measured = EngineProfile.load(path)
        models[measured.name] = measured.step_time_model()
    return models


def mlflow_champion_loader(uri: str) -> ModelLoader:
    """Loads the ``champion`` of ``kvcost-terms`` at ``uri`` and looks up its version number."""

    def load() -> tuple[TermModelSet, str | None]:
        from kvcost.models.mlflow_store import CHAMPION, list_versions, load_model_set

        model_set = load_model_set(uri, CHAMPION)
        version = next((row["version"] for row in list_versions(uri) if CHAMPION in row["aliases"]), None)
        return model_set, version

    return load


def mlflow_lister(uri: str) -> RegistryLister:
    """Lists the ``kvcost-terms`` versions at ``uri``."""

    def lister() -> list[dict]:
        from kvcost.models.mlflow_store import list_versions

        return list_versions(uri)

    return lister


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of ``exc`` (for a reason or an HTTP detail)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class ModelManager:
    """The cost model in use (:attr:`status`), its loading and reloading, and the registry listing.

    Args:
        loader: loads the champion; None = analytic by configuration.
        lister: lists registry versions for ``GET /v1/cost-models``; None = none.
        apply: installs a model set in the routers (called under no lock of its own).
        metrics: the service's metrics (fallbacks, degraded, learned gauges).
        clock: wall clock, epoch seconds (``loaded_at_s``).
        timeout_s: limit of one load or listing, seconds.
        registry_uri: the registry's URI, reported by :meth:`models_info`.

    Thread safety: call from one event loop.
    """

    def __init__(
        self,
        loader: ModelLoader | None,
        lister: RegistryLister | None,
        *,
        apply: Callable[[TermModelSet], None],
        metrics: ServiceMetrics,
        clock: Callable[[], float],
        timeout_s: float,
        registry_uri: str | None,
    ) -> None:
        self._loader = loader
        self._lister = lister
        self._apply = apply
        self._metrics = metrics
        self._clock = clock
        self._timeout_s = timeout_s
        self._registry_uri = registry_uri
        self._reload_lock = asyncio.Lock()
        if loader is None:
            self.status = ModelStatus(
                "analytic", "analytic", None, "ready", "no model registry configured: the analytic model by choice"
            )
        else:
            self.status = ModelStatus("analytic", "analytic", None, "loading", "loading the champion")

    async def load(self) -> ModelStatus:
        """Load (or reload) the champion; on failure keep scoring (analytic fallback, or the champion already loaded).

        A failure while no champion is loaded falls back to the analytic model,
        marks the service degraded and counts ``kvcost_model_fallbacks_total``.
        A failed *reload* keeps the champion already in use (degraded: the
        registry is unreachable) rather than replacing it by the analytic model.
        """
        if self._loader is None:
            return self.status
        async with self._reload_lock:
            try:
                model_set, version = await asyncio.wait_for(asyncio.to_thread(self._loader), self._timeout_s)
            except Exception as exc:  # the registry's errors are many; every one means "not loaded"
                self._fall_back(exc)
            else:
                self._apply(model_set)
                kind = "learned" if model_set.learned else "analytic"
                label = f"champion v{version}" if version else "champion"
                self.status = ModelStatus(
                    kind, "champion", version, "ready", f"{label} loaded", self._clock(), dict(model_set.metadata)
                )
            self.publish_metrics()
            return self.status

    def _fall_back(self, exc: Exception) -> None:
        if isinstance(exc, TimeoutError):
            reason, kind = f"timed out after {self._timeout_s:g} s", FALLBACK_REASONS[0]
        else:
            reason, kind = one_line(exc), FALLBACK_REASONS[1]
        current = self.status
        if current.source == "champion":
            why = f"reload failed ({reason}); still serving {current.label}"
            self.status = replace(current, status="degraded", reason=why)
        else:
            self._apply(TermModelSet.analytic())
            self._metrics.model_fallbacks.labels(kind).inc()
            why = f"champion not loaded ({reason}); scoring with the analytic model"
            self.status = ModelStatus("analytic", "analytic", None, "degraded", why, self._clock())
        _log.warning("%s", why)

    def publish_metrics(self) -> None:
        """Set the ``kvcost_model_degraded`` and ``kvcost_model_learned`` gauges from :attr:`status`."""
        self._metrics.model_degraded.set(1 if self.status.status == "degraded" else 0)
        self._metrics.model_learned.set(1 if self.status.kind == "learned" else 0)

    def status_out(self) -> ModelStatusOut:
        """The wire form of :attr:`status`."""
        s = self.status
        return ModelStatusOut(
            kind=s.kind,
            source=s.source,
            version=s.version,
            status=s.status,
            reason=s.reason,
            loaded_at_s=s.loaded_at_s,
            feature_spec_hash=s.metadata.get("feature_spec_hash", feature_spec_hash()),
            metadata=json_safe(s.metadata),
        )

    async def models_info(self) -> ModelsResponse:
        """The serving model and the registry's versions (a registry error is reported, not raised)."""
        versions: list[dict] = []
        error = None
        if self._lister is not None:
            try:
                versions = await asyncio.wait_for(asyncio.to_thread(self._lister), self._timeout_s)
            except Exception as exc:
                error = one_line(exc) if not isinstance(exc, TimeoutError) else "registry listing timed out"
        return ModelsResponse(
            serving=self.status_out(),
            feature_spec_hash=feature_spec_hash(),
            registry_uri=self._registry_uri,
            registry_error=error,
            versions=[json_safe(v) for v in versions],
        )
