"""P(reuse within H) from a mixture cure survival model of the gap between a block's idle moment and its next use.

A conversation's cached chain is used again only if the conversation goes on
(many never do) and then after a think time of seconds to hours. A mixture
cure model (Berkson and Gage, JASA 1952; Farewell, Biometrics 1982) says
exactly that: with probability π the block is used again, after a gap ``G``
with a log-normal distribution ``F`` (parameters μ, σ of ln G); with
probability 1 − π never. A block that has stayed idle for ``a`` seconds is
still in the race, so

    P(reused within (a, a + H] | not reused by a) = π [F(a + H) − F(a)] / (1 − π F(a)),

which falls with the idle age both because the gap's hazard falls (heavy
tail) and because a long silence makes "never" likelier. Where the LightGBM
classifier of :mod:`kvcost.models.reuse` must extrapolate past the idle ages
its training window shows (a sample at age ``a`` needs ``a + H`` of log after
it), the model's three parameters per class are fitted by maximum likelihood
on every idle period, the unfinished ones included as right-censored
observations (the standard survival likelihood: density for observed gaps,
1 − π F(c) for gaps still open at the end of the log).

Classes: the share of the last request's prompt that was found cached
(``request_reused_share``, bins :data:`REUSED_SHARE_EDGES`): near 0 for a
conversation's first turn, near 1 for later turns, whose conversations are
likelier to go on (the fitted π per class on the conversation trace:
``docs/eviction-study.md``). A class with fewer than
:data:`MIN_OBSERVED_REUSES` observed reuses uses the pooled fit.

Chosen on validation replays inside the training period of the conversation
trace only (figures: ``docs/eviction-study.md``).
Saved as ``cure.json`` (parameters, H, bins); no pickle.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtr

from kvcost.models.reuse import REUSE_MODELS, ReuseModel, idle_periods

#: Upper edges of the ``request_reused_share`` classes: [0, 0.2), [0.2, 0.5), [0.5, 0.8), [0.8, 1].
REUSED_SHARE_EDGES: tuple[float, ...] = (0.2, 0.5, 0.8)
#: Observed reuses a class needs for its own fit (else it takes the pooled parameters).
MIN_OBSERVED_REUSES = 50
#: Shortest gap, seconds: ln(0) is undefined and a same-instant reuse is a gap of ~0.
MIN_GAP_S = 1e-3
#: File name of a saved model.
CURE_FILE = "cure.json"


def reused_share_class(reused_blocks: np.ndarray, request_blocks: np.ndarray) -> np.ndarray:
    """Class in ``[0, len(REUSED_SHARE_EDGES)]`` of reused ÷ request blocks (clipped to [0, 1]), int64 ``(n,)``."""
    share = np.clip(np.asarray(reused_blocks, dtype=np.float64) / np.maximum(request_blocks, 1), 0.0, 1.0)
    return np.searchsorted(np.asarray(REUSED_SHARE_EDGES), share, side="right").astype(np.int64)


def fit_cure(gap_s: np.ndarray, observed: np.ndarray) -> tuple[float, float, float]:
    """Maximum-likelihood (π, μ, σ) of a log-normal mixture cure model.

    Args:
        gap_s: float ``(n,)``: idle → next use for observed gaps, idle → end of log for censored ones, ≥ 0.
        observed: bool ``(n,)``: the next use happened within the log.

    Returns:
        π in (0, 1), μ (mean of ln gap, ln seconds), σ > 0. Nelder–Mead from (π = 0.5, μ = ln median
        observed gap, σ = 1) on unconstrained (logit π, μ, ln σ); deterministic.

    Raises:
        ValueError: no rows, shapes differ, or no observed gap.
    """
    gap_s, observed = np.asarray(gap_s, dtype=np.float64), np.asarray(observed, dtype=bool)
    if gap_s.shape != observed.shape or gap_s.size == 0:
        raise ValueError(f"gap_s {gap_s.shape} and observed {observed.shape}: expected one non-empty shape")
    if not observed.any():
        raise ValueError(f"none of {gap_s.size} gaps is observed, expected at least one reuse")
    log_gap = np.log(np.maximum(gap_s, MIN_GAP_S))
    log_used, log_open = log_gap[observed], log_gap[~observed]  # split once: the likelihood runs ~500 times a fit

    def negative_log_likelihood(theta: np.ndarray) -> float:
        pi, mu, sigma = _unpack(theta)
        z_used = (log_used - mu) / sigma
        used = math.log(pi) + _standard_normal_logpdf(z_used) - math.log(sigma) - log_used
        open_ = np.log(np.maximum(1.0 - pi * ndtr((log_open - mu) / sigma), 1e-300))
        return -float(used.sum() + open_.sum())

    # imported here, not at the top: every kvcost command imports this module, and scipy.optimize
    # takes about half a second to import
    from scipy.optimize import minimize

    start = np.array([0.0, float(np.median(log_used)), 0.0])
    result = minimize(
        negative_log_likelihood, start, method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-6}
    )
    return _unpack(result.x)


#: ln √(2π), the standard normal density's constant (the value ``scipy.stats.norm.logpdf`` subtracts).
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def _standard_normal_logpdf(z: np.ndarray) -> np.ndarray:
    """ln φ(z), float64 like ``z``: ``scipy.stats.norm.logpdf``'s formula without its argument checks, which
    took most of a refit's time (the same values to the last bit)."""
    return -(z**2) / 2.0 - _LOG_SQRT_2PI


def _unpack(theta: np.ndarray) -> tuple[float, float, float]:
    """(logit π, μ, ln σ) → (π, μ, σ), π kept inside (0, 1) in floating point."""
    pi = float(np.clip(1.0 / (1.0 + math.exp(-float(np.clip(theta[0], -30, 30)))), 1e-12, 1 - 1e-12))
    return pi, float(theta[1]), float(math.exp(float(np.clip(theta[2], -10, 10))))


@REUSE_MODELS.register("cure")
class CureReuseModel(ReuseModel):
    """P(reuse within ``horizon_s``) of idle blocks by reused-share class (see the module docstring).

    Args:
        horizon_s: H, seconds (> 0, finite).
        params: per class ``(π, μ, σ)``, ``len(REUSED_SHARE_EDGES) + 1`` triples.

    Raises:
        ValueError: bad ``horizon_s``, wrong number of classes, or π outside [0, 1] / σ ≤ 0.
    """

    name = "cure"
    saved_file = CURE_FILE

    def __init__(self, horizon_s: float, params: list[tuple[float, float, float]]) -> None:
        if not (horizon_s > 0 and math.isfinite(horizon_s)):
            raise ValueError(f"horizon_s = {horizon_s!r}, expected a finite number of seconds > 0")
        if len(params) != len(REUSED_SHARE_EDGES) + 1:
            raise ValueError(f"params has {len(params)} classes, expected {len(REUSED_SHARE_EDGES) + 1}")
        for c, (pi, _, sigma) in enumerate(params):
            if not (0 <= pi <= 1 and sigma > 0):
                raise ValueError(f"params[{c}] = (π {pi!r}, σ {sigma!r}), expected π in [0, 1] and σ > 0")
        self.horizon_s = float(horizon_s)
        self.params = [tuple(float(v) for v in p) for p in params]

    @classmethod
    def from_log(
        cls, events: pd.DataFrame, frame: pd.DataFrame, horizon_s: float, end_s: float
    ) -> CureReuseModel | None:
        """Fitted on the log's :func:`~kvcost.models.reuse.idle_periods`; None when no idle block was
        demanded again before ``end_s`` (nothing to fit). ``frame`` is not used."""
        periods = idle_periods(events)
        if not (periods["next_demand_s"] <= end_s).any():
            return None
        return cls.fit(periods, end_s, horizon_s)

    @classmethod
    def fit(cls, periods: pd.DataFrame, end_s: float, horizon_s: float) -> CureReuseModel:
        """Fit on :func:`~kvcost.models.reuse.idle_periods` of a log that ends at ``end_s`` (seconds).

        A period whose ``next_demand_s`` is after ``end_s`` (or never) is censored at ``end_s``.

        Raises:
            ValueError: no period, or not a single observed reuse.
        """
        if len(periods) == 0:
            raise ValueError("periods is empty, expected idle periods of a block access log")
        idle_t = periods["idle_t_s"].to_numpy(dtype=np.float64)
        demand_t = periods["next_demand_s"].to_numpy(dtype=np.float64)
        observed = demand_t <= end_s
        gap_s = np.where(observed, demand_t, end_s) - idle_t
        classes = reused_share_class(periods["reused_blocks"].to_numpy(), periods["request_blocks"].to_numpy())
        pooled = functools.cache(lambda: fit_cure(gap_s, observed))  # fitted only for a thin class (half a refit)
        params = [
            fit_cure(gap_s[classes == c], observed[classes == c])
            if observed[classes == c].sum() >= MIN_OBSERVED_REUSES
            else pooled()
            for c in range(len(REUSED_SHARE_EDGES) + 1)
        ]
        return cls(horizon_s, params)

    def probability(self, classes: np.ndarray, idle_s: np.ndarray) -> np.ndarray:
        """P(reused within (a, a + H] | idle a) per row, float64 ``(n,)`` in [0, 1]."""
        idle = np.maximum(np.asarray(idle_s, dtype=np.float64), 0.0)
        out = np.zeros(idle.shape)
        for c, (pi, mu, sigma) in enumerate(self.params):
            rows = classes == c
            if rows.any():
                f_now = ndtr((np.log(np.maximum(idle[rows], MIN_GAP_S)) - mu) / sigma)
                f_later = ndtr((np.log(idle[rows] + self.horizon_s) - mu) / sigma)
                out[rows] = pi * (f_later - f_now) / np.maximum(1.0 - pi * f_now, 1e-12)
        return np.clip(out, 0.0, 1.0)

    def predict_proba(self, nodes, now_s: float) -> np.ndarray:
        """P(reuse within H) of the idle blocks of a ``NodeTable`` at ``now_s``, float64 ``(n,)``."""
        classes = reused_share_class(nodes.request_reused_blocks, nodes.request_blocks)
        return self.probability(classes, now_s - nodes.last_access_s)

    def save(self, path: str | Path) -> Path:
        """Write ``cure.json`` into folder ``path`` (created); returns the folder."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {"horizon_s": self.horizon_s, "reused_share_edges": list(REUSED_SHARE_EDGES), "params": self.params}
        (path / CURE_FILE).write_text(json.dumps(state, indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> CureReuseModel:
        """Read a saved model.

        Raises:
            FileNotFoundError: no ``cure.json`` in ``path``.
            ValueError: saved with other class edges than :data:`REUSED_SHARE_EDGES`.
        """
        file = Path(path) / CURE_FILE
        if not file.exists():
            raise FileNotFoundError(f"{path}: no {CURE_FILE}, expected a folder written by CureReuseModel.save")
        state = json.loads(file.read_text())
        if tuple(state.get("reused_share_edges", ())) != REUSED_SHARE_EDGES:
            raise ValueError(
                f"{file}: reused_share_edges = {state.get('reused_share_edges')}, this kvcost uses "
                f"{list(REUSED_SHARE_EDGES)}; refit the model"
            )
        return cls(state["horizon_s"], [tuple(p) for p in state["params"]])
