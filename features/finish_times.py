"""When the decoders of a batch finish, given each one's progress: the finish times of the KV-wait
estimate (:func:`kvcost.features.nominal.kv_wait_s`).

A router does not know output lengths. It knows each decoder's tokens so far (the gateway counts
each stream's tokens, a replay its decoders') and the mean and spread of the lengths of the
requests that finished (:class:`~kvcost.features.decode_length.OutputLengthEstimate`). Under the
gamma law of that mean and spread, :func:`finish_steps` places the ``k``-th finish of a batch where
the decoders' expected finishes reach ``k`` (the mean-field order statistic); :func:`finish_steps_batch`
does it for several batches at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain

import numpy as np

#: Equal-count groups of decoders (by progress) :func:`finish_steps_batch` pools each batch into:
#: each group counts at its mean progress (a batch of hundreds costs what 16 decoders do).
FINISH_PROGRESS_GROUPS = 16
#: The bracket of the finish time, in mean output lengths: it starts at the exponential's answer and
#: doubles or halves within these bounds.
_FINISH_MIN_MEANS, _FINISH_MAX_MEANS = 1e-6, 1e3
#: Where the gamma's log-survival is tabulated, in mean output lengths: 0, then 10⁻⁶ to 10⁴, 240 a
#: decade (neighbours 1 % apart: linear interpolation of the smooth ``ln S`` is exact to ~10⁻⁵;
#: exact for the exponential, whose ``ln S`` is linear).
_SURVIVAL_X = np.concatenate(([0.0], np.logspace(-6.0, 4.0, 10 * 240 + 1)))
#: ``ln S`` at or below this counts as 0 survival (``e^−700`` ≈ 10⁻³⁰⁴).
_DEAD_LOG_SURVIVAL = -700.0
#: Range of the gamma law's shape ``1 / cv²`` (a squared coefficient of variation from 0.0025 to 20).
_GAMMA_SHAPE_RANGE = (0.05, 400.0)
#: Bits of a decoder's token count in the sort key of :func:`_progress_groups` (the batch's index
#: above them), and the largest count the key holds.
_PROGRESS_BITS = 32
_PROGRESS_MAX_TOKENS = (1 << _PROGRESS_BITS) - 1
#: Regula falsi steps per finish time (:func:`finish_steps_batch`), at most.
_ILLINOIS_ITERATIONS = 12


@lru_cache(maxsize=32)
def _log_survival(shape: float) -> np.ndarray:
    """``ln S(x)`` of the gamma of shape ``shape`` and mean 1 at :data:`_SURVIVAL_X`, floored at
    :data:`_DEAD_LOG_SURVIVAL` (one table per shape; :func:`finish_steps_batch` rounds the shape to
    3 significant digits, so a slowly moving estimate reuses it)."""
    from scipy.special import gammaincc  # lazy: LMCache's environment imports this module without scipy

    with np.errstate(divide="ignore"):
        log_s = np.log(gammaincc(shape, _SURVIVAL_X * shape))
    return np.maximum(log_s, _DEAD_LOG_SURVIVAL)


def finish_steps(finishes: int, output_tokens_so_far: Sequence[int], mean_tokens: float, cv2: float = 1.0) -> float:
    """Decode steps until ``finishes`` of the running decoders have finished, expected (≥ 0).

    Law of the output length ``L``: the gamma with the observed mean and variance (shape
    ``α = 1 / cv²``, scale ``mean × cv²``; ``cv² = 1`` is the exponential). A decoder that has
    produced ``a`` tokens has ``L > a`` and finishes within ``s`` more steps with probability
    ``F_a(s) = 1 − S(a + s) ÷ S(a)`` (``S`` the gamma's survival function). The ``k``-th finish is
    placed where the expected number of finishes reaches ``k n ÷ (n + ½)`` (the mean-field order
    statistic, ``Σ_i F_{a_i}(s) = k n ÷ (n + ½)``: for exponential lengths it is ``mean × ln((n + ½) ÷
    (n − k + ½))``, the usual approximation of ``mean × (H(n) − H(n − k))``, the exact mean that
    :func:`~kvcost.features.nominal.kv_wait_s` takes when the progress is unknown).

    Why the progress matters: lengths that vary less than an exponential's (``cv² < 1``, the
    generated workloads and the bundled conversation trace) have a rising hazard, so a batch a
    burst admitted together has young decoders and no finish for most of an output length, while a
    batch of old decoders finishes soon. Lengths with a long tail (``cv² > 1``) have a falling
    hazard: a decoder that has run long will likely run longer. Only for exponential lengths is the
    progress irrelevant. Why the gamma: it is the two-parameter law fixed by the mean and the
    variance the router estimates (:class:`~kvcost.features.decode_length.OutputLengthEstimate`),
    has the exponential as its special case, and its survival function is one special function
    (``scipy.special.gammaincc``); no shape is fitted to a trace.

    One batch of decoders; :func:`finish_steps_batch` (which this calls) takes several at once.

    Args:
        finishes: how many decoders must finish, 1 … ``len(output_tokens_so_far)``.
        output_tokens_so_far: tokens each running decoder has produced, each ≥ 0.
        mean_tokens: mean output length, tokens (> 0).
        cv2: squared coefficient of variation of the output lengths (variance ÷ mean², > 0;
            clipped to the shapes of ``_GAMMA_SHAPE_RANGE``).

    Returns:
        Steps, a float ≥ 0, to about 10⁻⁵ relative (the tabulated survival; exact for ``cv² = 1``);
        at most 1,000 × ``mean_tokens``. Decoders whose survival is 0 (far beyond the law's mean)
        count as finishing now.

    Raises:
        ValueError: ``finishes`` outside 1 … n, or ``mean_tokens`` or ``cv2`` not > 0.
    """
    if not 1 <= finishes <= len(output_tokens_so_far):
        n = len(output_tokens_so_far)
        raise ValueError(f"finishes = {finishes}, expected an integer in 1 … {n} (the running decoders)")
    return float(finish_steps_batch((finishes,), (output_tokens_so_far,), mean_tokens, cv2)[0])


def finish_steps_batch(
    finishes: Sequence[int], output_tokens_so_far: Sequence[Sequence[int]], mean_tokens: float, cv2: float = 1.0
) -> np.ndarray:
    """:func:`finish_steps` of several batches of decoders (one per worker), float64 ``(b,)``, steps.

    Cost: it runs for every candidate short of memory in every decision, so all candidates' roots
    are found together, in numpy operations over a ``(b, 16)`` array:

    * ``ln S`` is read from a table per shape (the shape rounded to 3 significant digits, a change
      of at most 0.5 %);
    * each batch is pooled into :data:`FINISH_PROGRESS_GROUPS` equal-count groups by progress;
    * each root is bracketed from the exponential's answer (doubling or halving), then refined by
      regula falsi, Illinois variant (Dowell & Jarratt, BIT 11, 1971: superlinear on a smooth
      function), for at most 12 steps, stopping where the bracket is under 10⁻⁹ of its end or the
      expected count within 10⁻⁹ of its target.

    Args:
        finishes: how many decoders must finish in each batch, ``finishes[i]`` in 1 … ``len(output_tokens_so_far[i])``.
        output_tokens_so_far: per batch, the tokens each decoder has produced, each ≥ 0.
        mean_tokens, cv2: the law of the output lengths, as in :func:`finish_steps`.

    Returns:
        Steps per batch, as :func:`finish_steps` returns them.

    Raises:
        ValueError: the two sequences' lengths differ, a ``finishes[i]`` is outside 1 … n (named by
            index), or ``mean_tokens`` or ``cv2`` not > 0.
    """
    if len(finishes) != len(output_tokens_so_far):
        raise ValueError(
            f"finishes has {len(finishes)} entries and output_tokens_so_far {len(output_tokens_so_far)}: "
            "expected one of each per batch"
        )
    sizes = np.fromiter(map(len, output_tokens_so_far), dtype=np.int64, count=len(output_tokens_so_far))
    k = np.asarray(finishes, dtype=np.int64).reshape(-1)
    for i in np.flatnonzero((k < 1) | (k > sizes))[:1].tolist():
        raise ValueError(f"finishes[{i}] = {k[i]}, expected an integer in 1 … {sizes[i]} (the running decoders)")
    if not (mean_tokens > 0 and cv2 > 0):
        raise ValueError(f"mean_tokens = {mean_tokens}, cv2 = {cv2}: expected numbers > 0")
    if len(k) == 0:
        return np.zeros(0, dtype=np.float64)
    shape = float(f"{min(max(1.0 / cv2, _GAMMA_SHAPE_RANGE[0]), _GAMMA_SHAPE_RANGE[1]):.3g}")
    curve = _FinishCurve.of_groups(_log_survival(shape), *_progress_groups(output_tokens_so_far, sizes, mean_tokens))
    n = sizes.astype(np.float64)
    target = k * n / (n + 0.5) - (n - curve.counts.sum(axis=1))  # the dead have finished
    means = np.zeros(len(k), dtype=np.float64)
    rows = np.flatnonzero(target > 0)
    if len(rows):
        start = np.log((n[rows] + 0.5) / np.maximum(n[rows] + 0.5 - target[rows], 0.5))  # the exponential's
        means[rows] = curve.subset(rows).solve(target[rows], np.maximum(start, _FINISH_MIN_MEANS))
    return means * mean_tokens


def _progress_groups(
    output_tokens_so_far: Sequence[Sequence[int]], sizes: np.ndarray, mean_tokens: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each batch's decoders in :data:`FINISH_PROGRESS_GROUPS` equal-count groups by progress (a
    batch of fewer decoders has one per group and empty groups): each group's mean progress in mean
    output lengths (0 where empty) and its size, float64 ``(b, 16)`` each. Counts are read as
    integers in 0 … 2³² − 1 (more tokens than any output length law the router estimates reaches:
    such a decoder counts as finished either way)."""
    tokens = np.fromiter(chain.from_iterable(output_tokens_so_far), dtype=np.int64, count=int(sizes.sum()))
    owner = np.repeat(np.arange(len(sizes), dtype=np.int64) << _PROGRESS_BITS, sizes)
    keys = np.sort(owner + np.clip(tokens, 0, _PROGRESS_MAX_TOKENS))  # one sort orders every batch
    progress = (keys & _PROGRESS_MAX_TOKENS).astype(np.float64) / mean_tokens
    cumulative = np.concatenate(([0.0], np.cumsum(progress)))
    offsets = np.cumsum(sizes) - sizes
    cuts = offsets[:, None] + (np.arange(FINISH_PROGRESS_GROUPS + 1) * sizes[:, None]) // FINISH_PROGRESS_GROUPS
    counts = np.diff(cuts, axis=1).astype(np.float64)
    sums = np.diff(cumulative[cuts], axis=1)
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0), counts


@dataclass(frozen=True, slots=True)
class _FinishCurve:
    """The expected finishes of pooled batches of decoders as a function of time (in mean output
    lengths), and its root finding (:func:`finish_steps_batch`). Groups whose decoders are past
    the law's support count 0 here: they are finished. Every step works on all batches at once,
    masks choosing which move (fewer numpy calls than gathering the batches still moving).
    ``ages``, ``log_alive`` and ``counts`` are ``(b, 16)``; ``log_s`` is the shape's table."""

    log_s: np.ndarray
    ages: np.ndarray
    log_alive: np.ndarray
    counts: np.ndarray

    @classmethod
    def of_groups(cls, log_s: np.ndarray, ages: np.ndarray, counts: np.ndarray) -> _FinishCurve:
        """The curve of the groups of :func:`_progress_groups` under the survival table ``log_s``."""
        log_alive = np.interp(ages, _SURVIVAL_X, log_s)
        return cls(log_s, ages, log_alive, np.where(log_alive > _DEAD_LOG_SURVIVAL, counts, 0.0))

    def subset(self, rows: np.ndarray) -> _FinishCurve:
        """The curve of batches ``rows`` only."""
        return _FinishCurve(self.log_s, self.ages[rows], self.log_alive[rows], self.counts[rows])

    def expected(self, x: np.ndarray) -> np.ndarray:
        """Expected finishes of each batch after ``x`` (one per batch) mean output lengths."""
        log_later = np.interp(self.ages + x[:, None], _SURVIVAL_X, self.log_s)
        return (self.counts * -np.expm1(log_later - self.log_alive)).sum(axis=1)

    def solve(self, target: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Where each batch's expected finishes reach ``target`` (> 0), mean output lengths;
        :data:`_FINISH_MAX_MEANS` where they stay under it."""
        lo_x, lo_f, hi_x, hi_f, found = self._bracket(target, start)
        root = self._illinois(target, lo_x, lo_f, hi_x, hi_f)
        return np.where(found, root, _FINISH_MAX_MEANS)

    def _bracket(self, target, start):
        """``(lo_x, lo_f, hi_x, hi_f, found)``: ``f(lo_x) = lo_f < target ≤ hi_f = f(hi_x)`` where
        ``found``; doubling up from ``start`` (to :data:`_FINISH_MAX_MEANS`), or halving down (to
        :data:`_FINISH_MIN_MEANS`, below which ``lo_x = 0``)."""
        hi_x = start
        hi_f = self.expected(hi_x)
        lo_x, lo_f = np.zeros_like(hi_x), np.zeros_like(hi_x)
        found = np.ones(len(hi_x), dtype=bool)
        down = (hi_f >= target) & (hi_x > _FINISH_MIN_MEANS)
        up = hi_f < target
        while up.any():
            found &= ~(up & (hi_x >= _FINISH_MAX_MEANS))
            up &= hi_x < _FINISH_MAX_MEANS
            lo_x, lo_f = np.where(up, hi_x, lo_x), np.where(up, hi_f, lo_f)
            hi_x = np.where(up, 2.0 * hi_x, hi_x)
            hi_f = np.where(up, self.expected(hi_x), hi_f)
            up &= hi_f < target
        while down.any():
            half_x = np.where(down, hi_x / 2.0, hi_x)
            half_f = self.expected(half_x)
            below = down & (half_f < target)
            lo_x, lo_f = np.where(below, half_x, lo_x), np.where(below, half_f, lo_f)
            down &= ~below
            hi_x, hi_f = np.where(down, half_x, hi_x), np.where(down, half_f, hi_f)
            down &= hi_x > _FINISH_MIN_MEANS
        return lo_x, lo_f, hi_x, hi_f, found

    def _illinois(self, target, x0, f0, x1, f1):
        """The root in each bracket ``[x0, x1]`` (regula falsi, Illinois variant; :func:`finish_steps_batch`)."""
        f0, f1 = f0 - target, f1 - target
        side = np.zeros(len(x0), dtype=np.int8)
        root = np.full(len(x0), np.nan)
        live = np.ones(len(x0), dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for _ in range(_ILLINOIS_ITERATIONS):
                live &= (f1 != f0) & (x1 - x0 > 1e-9 * x1)
                if not live.any():
                    break
                x = np.where(live, x1 - f1 * (x1 - x0) / (f1 - f0), x1)
                fx = self.expected(x) - target
                hit = live & (np.abs(fx) <= 1e-9)
                root = np.where(hit, x, root)
                live &= ~hit
                above, below = live & (fx > 0), live & (fx <= 0)
                f0 = np.where(above & (side == 1), f0 / 2, f0)
                f1 = np.where(below & (side == -1), f1 / 2, f1)
                x1, f1 = np.where(above, x, x1), np.where(above, fx, f1)
                x0, f0 = np.where(below, x, x0), np.where(below, fx, f0)
                side = np.where(above, 1, np.where(below, -1, side)).astype(np.int8)
            falsi = np.where(f1 != f0, x1 - f1 * (x1 - x0) / (f1 - f0), x1)
        return np.where(np.isnan(root), falsi, root)
