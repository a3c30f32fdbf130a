"""The reuse-probability model of ``cost_aware`` eviction: P(an idle block is reused on its worker within H).

A LightGBM binary classifier (``objective="binary"``, trained with
``lightgbm.train``) on :data:`~kvcost.features.spec.EVICTION_FEATURE_SPEC`
rows. LRB (Song et al., "Learning relaxed Belady for content distribution
network caching", NSDI 2020) learns time-to-next-request with LightGBM from
similar per-object history (recency, frequency, size); here the target is
the binary "reused within H" that the eviction value needs directly.

Training data (:func:`reuse_training_frame`) come from a block pool's access
history (:data:`~kvcost.replay.kv_cache.BLOCK_EVENT_COLUMNS`, or the DuckDB
``block_events`` table): every ``idle`` event (a block's reference count
reaching 0) is sampled at idle age 0 and at ``samples_per_idle − 1`` seeded
log-uniform idle ages, because a candidate is ranked at every age it reaches,
not only when it turns idle. A sample at time t is labelled 1 when the same
worker demands the block (``hit``, or ``stored`` again after an eviction: the
request needed it) within (t, t + H]. Samples are kept only while no demand
has happened yet, and only where the label is known before the end of the log
(no right-censoring). An eviction does not end the samples: demand is what is
learned, so an LRU training log does not teach "evicted = never reused".

Saved as ``model.txt`` (LightGBM text format) + ``manifest.json`` (the
eviction-spec hash and H); :meth:`ReuseClassifier.load` refuses another hash.

Every P(reuse) model is a :class:`ReuseModel` registered by name in
:data:`REUSE_MODELS` (``prior``, ``lightgbm``, ``cure``; importing this module
registers them all); :func:`load_reuse_model` recognises a saved one by its file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvcost.core.registry import Registry
from kvcost.features.eviction import eviction_feature_matrix, eviction_features
from kvcost.features.spec import EVICTION_FEATURE_NAMES, EVICTION_FEATURE_SPEC, feature_spec_hash

#: Training parameters (LightGBM names); deterministic, single-threaded prediction. Regularised
#: (15 leaves, ≥ 200 rows per leaf, L2 1.0) and P(reuse) constrained non-increasing in ``idle_s``
#: (``monotone``, a name → sign map turned into LightGBM's ``monotone_constraints`` over the model's
#: features): a looser fit swings between neighbouring idle ages, and that noise, multiplied by the
#: spread of seconds saved over depth, ranks worse than LRU (docs/eviction-study.md). The assumption
#: behind the constraint: the longer a block has been idle, the less likely it is to be reused within
#: the next H (true of think-time gaps that are mostly short).
DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "binary",
    "learning_rate": 0.05,
    "num_boost_round": 150,
    "num_leaves": 15,
    "min_data_in_leaf": 200,
    "lambda_l2": 1.0,
    "monotone": {"idle_s": -1},
    "num_threads": 1,  # fits run in parallel processes (kvcost eviction-study --jobs); 2 threads each thrash 2 cores
    "deterministic": True,
    "force_row_wise": True,
    "seed": 0,
    "verbosity": -1,
}

#: Features of the eviction study's classifier (``cost_aware``'s P(reuse)): the block's own
#: history (hits, idle time) and the chain-level facts of the request that last held it (how much of
#: it was found cached: a continuing conversation). Depth, prompt length, tail distance, age and the
#: mean reuse gap are left out: from few samples the classifier used them to give deep blocks of
#: continuing conversations P ≈ 0.01, cancelling the seconds saved at depth (validation figures:
#: docs/eviction-study.md). Depth enters the value only through the prefill seconds saved.
STUDY_FEATURES: tuple[str, ...] = ("hits", "idle_s", "request_reused_blocks", "request_reused_share")
#: Training parameters of the study's classifier (overrides of :data:`DEFAULT_PARAMS`): P(reuse)
#: non-increasing in idle time, non-decreasing in hits and in the reused prefix of the last request
#: (later turns of a conversation are likelier to continue; docs/eviction-study.md gives the shares),
#: ≥ 1000 rows per leaf.
STUDY_PARAMS: dict[str, Any] = {
    "monotone": {"idle_s": -1, "hits": 1, "request_reused_blocks": 1, "request_reused_share": 1},
    "min_data_in_leaf": 1000,
}
#: Longest idle age sampled for training, seconds (1 h).
MAX_SAMPLE_AGE_S = 3600.0


class EvictionSpecMismatch(ValueError):  # noqa: N818  (parallel to FeatureSpecMismatch)
    """A saved reuse model was trained under another eviction feature spec."""

    def __init__(self, path: Path, saved: str | None, current: str) -> None:
        super().__init__(
            f"{path}: reuse model trained with eviction feature spec {saved}, this kvcost uses {current}; "
            "retrain it on a fresh block history (kvcost eviction-study trains one)"
        )
        self.path, self.saved, self.current = path, saved, current


def eviction_spec_hash() -> str:
    """``feature_spec_hash(EVICTION_FEATURE_SPEC)``."""
    return feature_spec_hash(EVICTION_FEATURE_SPEC)


class ReuseModel:
    """Base of the P(reuse within ``horizon_s``) models of ``cost_aware`` eviction.

    Class attributes:
        name: registry name (:data:`REUSE_MODELS`).
        saved_file: the file :meth:`save` writes into a model folder, by which
            :func:`load_reuse_model` recognises the model; None = nothing is saved.

    A fitted model has ``horizon_s`` (H, seconds) and :meth:`predict_proba`.
    """

    name = "base"
    saved_file: str | None = None
    horizon_s: float

    @classmethod
    def from_log(cls, events: pd.DataFrame, frame: pd.DataFrame, horizon_s: float, end_s: float) -> ReuseModel | None:
        """Fit on a block access log that ends at ``end_s`` (seconds).

        Args:
            events: the log, :data:`~kvcost.replay.kv_cache.BLOCK_EVENT_COLUMNS` plus ``worker_id``.
            frame: its :func:`reuse_training_frame` with horizon ``horizon_s``.
            horizon_s: H, seconds.
            end_s: end of the log, seconds (later demand is unknown).

        Returns:
            The fitted model, or None when the log cannot support one (e.g. no reuse in it):
            ``cost_aware`` then uses the recency prior with H.
        """
        raise NotImplementedError

    @classmethod
    def load(cls, path: str | Path) -> ReuseModel:
        """Read a model :meth:`save` wrote into folder ``path``."""
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Write the model into folder ``path`` (created); returns it."""
        raise NotImplementedError

    def predict_proba(self, nodes, now_s: float) -> np.ndarray:
        """P(reuse within H) of the idle blocks of a ``NodeTable`` at ``now_s``, float64 ``(n,)`` in [0, 1]."""
        raise NotImplementedError


#: P(reuse) models by name (``kvcost eviction-study --reuse-model``); a duplicate name is an error.
REUSE_MODELS: Registry[type[ReuseModel]] = Registry("reuse model")


@REUSE_MODELS.register("prior")
class RecencyPrior(ReuseModel):
    """No fitted model: ``cost_aware`` uses the recency prior exp(−idle / H)
    (:func:`~kvcost.eviction.base.recency_prior`) with the H measured on the log."""

    name = "prior"

    @classmethod
    def from_log(cls, events: pd.DataFrame, frame: pd.DataFrame, horizon_s: float, end_s: float) -> None:
        """Nothing to fit: always None."""
        return None


@REUSE_MODELS.register("lightgbm")
class ReuseClassifier(ReuseModel):
    """P(reuse within ``horizon_s``) of idle blocks.

    Args:
        horizon_s: H, seconds (> 0, finite).
        features: the columns of :data:`EVICTION_FEATURE_NAMES` the trees may use (default: all);
            rows passed to :meth:`predict_features` still have every column.
        **params: overrides of :data:`DEFAULT_PARAMS` (LightGBM names plus ``num_boost_round`` and
            ``monotone``, a feature name → −1 / +1 map of monotone constraints).

    Raises:
        ValueError: ``horizon_s`` not > 0, an unknown feature, or a ``monotone`` name not in ``features``.

    Construction is pure; :meth:`fit` or :meth:`load` makes it usable.
    """

    name = "lightgbm"
    saved_file = "manifest.json"

    def __init__(self, horizon_s: float, features: tuple[str, ...] | None = None, **params: Any) -> None:
        if not (horizon_s > 0 and math.isfinite(horizon_s)):
            raise ValueError(f"horizon_s = {horizon_s!r}, expected a finite number of seconds > 0")
        self.horizon_s = float(horizon_s)
        self.features = tuple(features) if features is not None else EVICTION_FEATURE_NAMES
        unknown = [f for f in self.features if f not in EVICTION_FEATURE_NAMES]
        if unknown or not self.features:
            raise ValueError(
                f"features {unknown or '()'} invalid, expected a non-empty subset of EVICTION_FEATURE_NAMES"
            )
        self.params = {**DEFAULT_PARAMS, **params}
        stray = [f for f in self.params.get("monotone", {}) if f not in self.features]
        if stray and features is not None:
            raise ValueError(f"monotone names {stray} that are not among features {list(self.features)}")
        self._columns = [EVICTION_FEATURE_NAMES.index(f) for f in self.features]
        self.booster = None
        self.metadata: dict[str, Any] = {}

    @classmethod
    def from_log(
        cls, events: pd.DataFrame, frame: pd.DataFrame, horizon_s: float, end_s: float
    ) -> ReuseClassifier | None:
        """The eviction study's classifier (:data:`STUDY_FEATURES`, :data:`STUDY_PARAMS`) fitted on
        ``frame``; None when ``frame`` has a single label class."""
        if frame["label"].nunique() != 2:
            return None
        return cls(horizon_s, STUDY_FEATURES, **STUDY_PARAMS).fit(frame)

    def fit(self, frame: pd.DataFrame) -> ReuseClassifier:
        """Train on a :func:`reuse_training_frame` (columns ``EVICTION_FEATURE_NAMES`` + ``label``).

        Raises:
            ValueError: missing columns, no rows, or a single label class.
        """
        import lightgbm

        missing = [c for c in (*EVICTION_FEATURE_NAMES, "label") if c not in frame.columns]
        if missing:
            raise ValueError(f"frame lacks columns {missing}, expected EVICTION_FEATURE_NAMES and 'label'")
        labels = frame["label"].to_numpy(dtype=np.float64)
        if len(np.unique(labels)) < 2:
            raise ValueError(
                f"label has {len(np.unique(labels))} class(es) in {len(frame)} rows, expected both 0 and 1"
            )
        params = dict(self.params)
        rounds = int(params.pop("num_boost_round"))
        monotone = params.pop("monotone", {})
        params["monotone_constraints"] = [int(monotone.get(f, 0)) for f in self.features]
        x = frame[list(self.features)].to_numpy(dtype=np.float64)
        data = lightgbm.Dataset(x, label=labels, feature_name=list(self.features), params=params)
        self.booster = lightgbm.train(params, data, num_boost_round=rounds)
        self.metadata = {"rows": int(len(frame)), "positive_share": float(labels.mean())}
        return self

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """P(reuse) per row of ``x`` (float64 ``(n, len(EVICTION_FEATURE_SPEC))``), float64 ``(n,)`` in [0, 1].

        Raises:
            RuntimeError: not fitted or loaded.
        """
        if self.booster is None:
            raise RuntimeError("ReuseClassifier is not fitted; call fit() or load() first")
        if len(x) == 0:
            return np.zeros(0)
        x = np.ascontiguousarray(np.asarray(x, dtype=np.float64)[:, self._columns])
        return np.asarray(self.booster.predict(x, num_threads=1), dtype=np.float64)

    def predict_proba(self, nodes, now_s: float) -> np.ndarray:
        """P(reuse within H) of the idle blocks of a ``NodeTable`` at ``now_s``, float64 ``(n,)``."""
        return self.predict_features(eviction_features(nodes, now_s))

    def save(self, path: str | Path) -> Path:
        """Write ``model.txt`` and ``manifest.json`` into folder ``path`` (created); returns it."""
        if self.booster is None:
            raise RuntimeError("ReuseClassifier is not fitted; nothing to save")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path / "model.txt"))
        manifest = {
            "eviction_spec_hash": eviction_spec_hash(),
            "horizon_s": self.horizon_s,
            "features": list(self.features),
            "params": self.params,
            "metadata": self.metadata,
        }
        (path / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ReuseClassifier:
        """Read a saved classifier.

        Raises:
            FileNotFoundError: no ``manifest.json`` in ``path``.
            EvictionSpecMismatch: saved under another eviction feature spec (message names both hashes).
        """
        import lightgbm

        path = Path(path)
        manifest_path = path / "manifest.json"
        if not manifest_path.exists():
            raise FileNotFoundError(f"{path}: no manifest.json, expected a folder written by ReuseClassifier.save")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("eviction_spec_hash") != eviction_spec_hash():
            raise EvictionSpecMismatch(path, manifest.get("eviction_spec_hash"), eviction_spec_hash())
        model = cls(manifest["horizon_s"], manifest.get("features"), **manifest.get("params", {}))
        model.booster = lightgbm.Booster(model_file=str(path / "model.txt"))
        model.metadata = manifest.get("metadata", {})
        return model


def saved_reuse_model(path: str | Path) -> type[ReuseModel] | None:
    """The registered model whose ``saved_file`` is in folder ``path`` (the first registered); None if none is."""
    for _, model in REUSE_MODELS.items():
        if model.saved_file is not None and (Path(path) / model.saved_file).exists():
            return model
    return None


def load_reuse_model(path: str | Path) -> ReuseModel:
    """The P(reuse) model saved in folder ``path``, recognised by its ``saved_file`` (:data:`REUSE_MODELS`).

    Raises:
        FileNotFoundError: the folder holds no registered model's file.
        EvictionSpecMismatch, ValueError: the saved model does not fit this kvcost (see each ``load``).
    """
    model = saved_reuse_model(path)
    if model is None:
        files = [m.saved_file for _, m in REUSE_MODELS.items() if m.saved_file is not None]
        raise FileNotFoundError(
            f"{path}: neither {' nor '.join(files)}, expected a folder saved by a reuse model "
            "(kvcost eviction-study writes one per cache size: OUT/reuse_models/fraction_*)"
        )
    return model.load(path)


def _ordered(events: pd.DataFrame) -> pd.DataFrame:
    """Events grouped by (worker, block), in logged order inside each group."""
    required = ["worker_id", "t_s", "block_hash", "event", "depth_blocks", "request_blocks"]
    missing = [c for c in required if c not in events.columns]
    if missing:
        raise ValueError(f"events lack columns {missing}, expected {required}")
    frame = events.reset_index(drop=True)
    if "reused_blocks" not in frame.columns:  # a log written before the column existed
        frame["reused_blocks"] = 0
    frame["_row"] = np.arange(len(frame))
    return frame.sort_values(["worker_id", "block_hash", "_row"], kind="stable", ignore_index=True)


def idle_periods(events: pd.DataFrame) -> pd.DataFrame:
    """One row per ``idle`` event with the block's state then and what happened next.

    Returns:
        Columns ``worker_id, block_hash, idle_t_s, depth_blocks, request_blocks, reused_blocks, hits,
        created_s, next_demand_s`` (inf if never demanded again in the log) and ``evicted_s`` (time of
        the eviction that ended the idle period, inf if none).

    Raises:
        ValueError: missing columns.
    """
    f = _ordered(events)
    group_start = f["worker_id"].ne(f["worker_id"].shift()) | f["block_hash"].ne(f["block_hash"].shift())
    key = group_start.cumsum()
    stored = f["event"].eq("stored")
    hit = f["event"].eq("hit")
    segment = (stored | group_start).cumsum()
    created = f["t_s"].where(stored | group_start).groupby(segment).transform("first")
    hits = hit.astype(np.int64).groupby(segment).cumsum()
    demand_t = f["t_s"].where(stored | hit)
    next_demand = _next_in_group(demand_t, key)
    next_evict = _next_in_group(f["t_s"].where(f["event"].eq("evicted")), key)
    idle = f["event"].eq("idle")
    out = pd.DataFrame(
        {
            "worker_id": f["worker_id"][idle],
            "block_hash": f["block_hash"][idle],
            "idle_t_s": f["t_s"][idle],
            "depth_blocks": f["depth_blocks"][idle],
            "request_blocks": f["request_blocks"][idle],
            "reused_blocks": f["reused_blocks"][idle].fillna(0).astype(np.int64),
            "hits": hits[idle],
            "created_s": created[idle],
            "next_demand_s": next_demand[idle].fillna(np.inf),
            "evicted_s": next_evict[idle].fillna(np.inf),
        }
    )
    out.loc[out["evicted_s"] > out["next_demand_s"], "evicted_s"] = np.inf
    return out.reset_index(drop=True)


def _next_in_group(times: pd.Series, key: pd.Series) -> pd.Series:
    """Per row, the first non-NaN ``times`` value strictly after it in the same group (NaN if none)."""
    return times.groupby(key).shift(-1).groupby(key).bfill()


def characteristic_time_s(events: pd.DataFrame) -> float:
    """Median idle time of blocks that were evicted (idle → evicted), seconds, or their mean where that
    median is 0 (below); NaN if none was evicted.

    Under LRU this is Che's characteristic time (Che, Tung and Wang, IEEE JSAC 2002): about how
    long a block survives unused, a natural reuse horizon H.

    Where that median is 0 (more than half of the evicted blocks went the moment they turned idle:
    a pool so small for its load that it turns over within a step), the median measures no
    survival time, and the **mean** idle time of the evicted blocks is returned instead: how long
    the blocks that do survive a while last, averaged over all, which is still the pool's turnover
    time (measured on ``gen:mix``'s small caches: ``docs/eviction-study.md``, "The characteristic
    time where most evicted blocks never idled"). Why it should hold on other workloads: it
    changes nothing where the median is positive, and where it is 0 the alternative is a horizon
    with no relation to the pool (the caller's fallback, e.g. the training part's length).
    """
    periods = idle_periods(events)
    ended = periods[np.isfinite(periods["evicted_s"])]
    if not len(ended):
        return math.nan
    idle_s = ended["evicted_s"] - ended["idle_t_s"]
    median_s = float(idle_s.median())
    return median_s if median_s > 0 else float(idle_s.mean())


def reuse_training_frame(
    events: pd.DataFrame,
    horizon_s: float,
    size_bytes: float,
    seed: int,
    samples_per_idle: int = 4,
    end_s: float | None = None,
) -> pd.DataFrame:
    """Features at sampled idle moments and the label "demanded within ``horizon_s``" (see the module docstring).

    Args:
        events: access history, columns ``worker_id`` + ``BLOCK_EVENT_COLUMNS``.
        horizon_s: H, seconds (> 0).
        size_bytes: KV bytes of one block (> 0).
        seed: seed of the sampled ages.
        samples_per_idle: samples per idle event (≥ 1; the first at idle age 0).
        end_s: end of the observed log (default: its last event); labels must be known by then.

    Returns:
        Columns ``EVICTION_FEATURE_NAMES`` + ``label`` (0/1) + ``t_s`` (sample time), one row per kept sample.

    Raises:
        ValueError: bad argument or missing columns.
    """
    if not horizon_s > 0:
        raise ValueError(f"horizon_s = {horizon_s!r}, expected a number > 0")
    if samples_per_idle < 1:
        raise ValueError(f"samples_per_idle = {samples_per_idle}, expected an integer ≥ 1")
    periods = idle_periods(events)
    end_s = float(events["t_s"].max()) if end_s is None else end_s
    rng = np.random.default_rng(seed)
    n = len(periods)
    ages = np.zeros((n, samples_per_idle))
    if samples_per_idle > 1:
        ages[:, 1:] = np.exp(rng.uniform(0.0, math.log(MAX_SAMPLE_AGE_S), (n, samples_per_idle - 1)))
    p = periods.loc[np.repeat(np.arange(n), samples_per_idle)].reset_index(drop=True)
    age = ages.reshape(-1)
    t = p["idle_t_s"].to_numpy() + age
    next_demand = p["next_demand_s"].to_numpy()
    label = (next_demand - t) <= horizon_s
    keep = (t < next_demand) & (label | (t + horizon_s <= end_s))
    x = eviction_feature_matrix(
        p["depth_blocks"].to_numpy(),
        p["hits"].to_numpy(),
        age,
        t - p["created_s"].to_numpy(),
        np.float64(size_bytes),
        np.float64(0),
        p["request_blocks"].to_numpy(),
        p["reused_blocks"].to_numpy(),
    )
    frame = pd.DataFrame(x[keep], columns=list(EVICTION_FEATURE_NAMES))
    frame["label"] = label[keep].astype(np.int64)
    frame["t_s"] = t[keep]
    return frame


# The cure model registers itself in its own module; importing it here makes REUSE_MODELS complete
# whichever of the two modules is imported first (it imports this one, which is defined by now).
from kvcost.models import reuse_cure  # noqa: E402, F401
