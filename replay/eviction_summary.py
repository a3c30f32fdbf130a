"""One policy against the best of a set, over several eviction studies (``kvcost eviction-summary``).

``kvcost eviction-study`` measures every policy on one trace at one seed. A claim such as "``cost_aware``
saves at least as many prefill seconds as the best of ``gdsf``, ``lhd``, ``lru`` and ``flop_aware`` in
every cell, and 5 % more on average" (kvcost issue 17) spans many of them: the bundled trace on three
seeds and each generated workload. This module reads their ``eviction.json`` files and computes, per
cell (trace × seed × cache fraction), the policy's gain over the best of the set, and per group of cache
fractions the mean gain, the cells at or above the best and the cells within a tolerance of it.

Gain of a cell = (policy − best of the set) ÷ best of the set, in prefill seconds saved (e.g. +0.05 = 5 %
more). A cell whose best is 0 s saved has no gain (NaN) and is left out of the figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The policies kvcost issue 17 measures ``cost_aware`` against.
DEFAULT_AGAINST: tuple[str, ...] = ("gdsf", "lhd", "lru", "flop_aware")
#: Issue 17's two groups of cache fractions: the small caches (a mean gain of ≥ 5 % is asked) and the large
#: ones (no worse than the best by more than 1 %).
DEFAULT_GROUPS: tuple[tuple[float, ...], ...] = ((0.05, 0.1), (0.25, 0.5))
#: A cell is "within" the best when its gain is at least minus this (issue 17: 1 %).
DEFAULT_TOLERANCE = 0.01


@dataclass(frozen=True)
class SummaryCell:
    """One trace × seed × cache fraction.

    Attributes:
        trace, seed, cache_fraction: the study's trace name, seed and cache size (fraction of its distinct blocks).
        best_other: the policy of the set that saved the most prefill seconds; ``best_other_s`` its seconds.
        policy_s: the summarised policy's prefill seconds saved.
        gain: (policy_s − best_other_s) ÷ best_other_s; NaN when best_other_s is 0.
        clairvoyant_gain: the same for ``clairvoyant`` where the study ran it, else NaN.
    """

    trace: str
    seed: int
    cache_fraction: float
    best_other: str
    best_other_s: float
    policy_s: float
    gain: float
    clairvoyant_gain: float


@dataclass(frozen=True)
class GroupFigures:
    """The figures over the cells of one group of cache fractions (NaN-gain cells left out).

    Attributes:
        fractions: the group's cache fractions.
        cells: cells counted; ``at_or_above``: cells with gain ≥ 0; ``within``: cells with gain ≥ −tolerance.
        mean_gain: mean of the cells' gains (NaN with no cell).
    """

    fractions: tuple[float, ...]
    cells: int
    at_or_above: int
    within: int
    mean_gain: float


def load_study(path: Path) -> dict:
    """The ``eviction.json`` of a study folder (or the file itself).

    Raises:
        FileNotFoundError: no such file (the message names the path and what was expected).
        ValueError: not JSON, or no ``results`` list with ``trace`` and ``seed`` (the message names the file).
    """
    path = Path(path)
    file = path / "eviction.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such file, expected the eviction.json of a `kvcost eviction-study` run")
    try:
        study = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}: not JSON ({error}), expected an eviction-study result") from None
    if not isinstance(study, dict) or not isinstance(study.get("results"), list) or "trace" not in study:
        raise ValueError(f"{file}: no 'trace' and 'results' list, expected an eviction-study result")
    return study


def summary_cells(
    studies: Sequence[dict], policy: str = "cost_aware", against: Sequence[str] = DEFAULT_AGAINST
) -> list[SummaryCell]:
    """:class:`SummaryCell` per trace × seed × cache fraction of ``studies``, in the order given, fractions ascending.

    A fraction where ``policy`` or every policy of ``against`` is missing is skipped.

    Raises:
        ValueError: ``against`` is empty or names ``policy``; or no study has a fraction with both.
    """
    if not against or policy in against:
        raise ValueError(f"against = {list(against)!r}, expected one or more policies other than {policy!r}")
    cells = []
    for study in studies:
        for fraction in sorted({r["cache_fraction"] for r in study["results"]}):
            saved = {r["policy"]: r["prefill_saved_s"] for r in study["results"] if r["cache_fraction"] == fraction}
            others = {p: saved[p] for p in against if p in saved}
            if policy not in saved or not others:
                continue
            best = max(others, key=lambda p: others[p])
            cells.append(
                SummaryCell(
                    trace=study["trace"],
                    seed=int(study.get("seed", 0)),
                    cache_fraction=fraction,
                    best_other=best,
                    best_other_s=others[best],
                    policy_s=saved[policy],
                    gain=_gain(saved[policy], others[best]),
                    clairvoyant_gain=_gain(saved.get("clairvoyant", math.nan), others[best]),
                )
            )
    if not cells:
        raise ValueError(f"no study has a cache fraction with both {policy!r} and one of {list(against)!r}")
    return cells


def _gain(value_s: float, best_s: float) -> float:
    return value_s / best_s - 1.0 if best_s > 0 else math.nan


def group_figures(
    cells: Sequence[SummaryCell],
    groups: Sequence[Sequence[float]] = DEFAULT_GROUPS,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[GroupFigures]:
    """:class:`GroupFigures` per group of cache fractions (matched to 1e-9), in the order given.

    Raises:
        ValueError: ``tolerance`` negative or not finite.
    """
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance = {tolerance!r}, expected a finite number ≥ 0")
    out = []
    for fractions in groups:
        gains = [
            c.gain
            for c in cells
            if math.isfinite(c.gain) and any(math.isclose(c.cache_fraction, f, abs_tol=1e-9) for f in fractions)
        ]
        out.append(
            GroupFigures(
                fractions=tuple(fractions),
                cells=len(gains),
                at_or_above=sum(g >= 0 for g in gains),
                within=sum(g >= -tolerance for g in gains),
                mean_gain=sum(gains) / len(gains) if gains else math.nan,
            )
        )
    return out


def parse_groups(text: str) -> tuple[tuple[float, ...], ...]:
    """``"0.05,0.1;0.25,0.5"`` → ((0.05, 0.1), (0.25, 0.5)): groups split by ``;``, fractions by ``,``.

    Raises:
        ValueError: an empty group or a fraction that is not a number in (0, 1] (the message names it).
    """
    groups = []
    for part in text.split(";"):
        items = [x.strip() for x in part.split(",") if x.strip()]
        if not items:
            raise ValueError(f"groups = {text!r}: an empty group, expected e.g. 0.05,0.1;0.25,0.5")
        fractions = []
        for item in items:
            try:
                fraction = float(item)
            except ValueError:
                fraction = math.nan
            if not 0 < fraction <= 1:
                raise ValueError(f"groups = {text!r}: {item!r} is not a cache fraction, expected a number in (0, 1]")
            fractions.append(fraction)
        groups.append(tuple(fractions))
    return tuple(groups)
