"""One eviction policy against the best of a set over several studies: exact figures on hand-made studies."""

import json
import math

import pytest

from kvcost.replay.eviction_summary import group_figures, load_study, parse_groups, summary_cells


def _study(trace, seed, saved):
    """An eviction-study result with ``saved`` = {fraction: {policy: prefill seconds saved}}."""
    results = [
        {"cache_fraction": f, "policy": p, "prefill_saved_s": s} for f, by in saved.items() for p, s in by.items()
    ]
    return {"trace": trace, "seed": seed, "results": results}


STUDIES = [
    _study("conv", 0, {0.05: {"lru": 100.0, "gdsf": 120.0, "cost_aware": 126.0, "clairvoyant": 240.0}}),
    _study("conv", 1, {0.05: {"lru": 80.0, "gdsf": 100.0, "cost_aware": 99.5}, 0.5: {"lru": 50.0, "cost_aware": 45.0}}),
    _study("gen:agent", 0, {0.1: {"lhd": 200.0, "cost_aware": 190.0}, 0.25: {"cost_aware": 9.0}}),
]


def test_each_cell_compares_with_the_best_of_the_set():
    cells = summary_cells(STUDIES)
    assert [(c.trace, c.seed, c.cache_fraction, c.best_other) for c in cells] == [
        ("conv", 0, 0.05, "gdsf"),
        ("conv", 1, 0.05, "gdsf"),
        ("conv", 1, 0.5, "lru"),
        ("gen:agent", 0, 0.1, "lhd"),
    ]  # 0.25 has no policy of the set: skipped
    assert [round(c.gain, 6) for c in cells] == [0.05, -0.005, -0.1, -0.05]
    assert cells[0].clairvoyant_gain == 1.0 and math.isnan(cells[1].clairvoyant_gain)


def test_group_figures_count_the_cells_at_or_above_and_within_the_tolerance():
    small, large = group_figures(summary_cells(STUDIES))
    assert (small.fractions, small.cells, small.at_or_above, small.within) == ((0.05, 0.1), 3, 1, 2)
    assert small.mean_gain == pytest.approx((0.05 - 0.005 - 0.05) / 3)
    assert (large.cells, large.at_or_above, large.within) == (1, 0, 0) and large.mean_gain == pytest.approx(-0.1)
    (looser,) = group_figures(summary_cells(STUDIES), groups=[(0.05, 0.1)], tolerance=0.06)
    assert looser.within == 3


def test_a_cell_whose_best_saved_nothing_has_no_gain_and_is_not_counted():
    cells = summary_cells([_study("t", 0, {0.05: {"lru": 0.0, "cost_aware": 3.0}})])
    assert math.isnan(cells[0].gain)
    (group,) = group_figures(cells, groups=[(0.05,)])
    assert group.cells == 0 and math.isnan(group.mean_gain)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.05,0.1;0.25,0.5", ((0.05, 0.1), (0.25, 0.5))), (" 1 ", ((1.0,),))],
)
def test_parse_groups(text, expected):
    assert parse_groups(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.05;;0.5", "groups = '0.05;;0.5': an empty group, expected e.g. 0.05,0.1;0.25,0.5"),
        ("0.05,x", "groups = '0.05,x': 'x' is not a cache fraction, expected a number in (0, 1]"),
        ("1.5", "groups = '1.5': '1.5' is not a cache fraction, expected a number in (0, 1]"),
    ],
)
def test_parse_groups_refuses_what_is_not_a_fraction(text, message):
    with pytest.raises(ValueError) as error:
        parse_groups(text)
    assert str(error.value) == message


def test_refusals_name_what_was_expected(tmp_path):
    with pytest.raises(ValueError, match=r"against = \['cost_aware'\], expected one or more policies other than"):
        summary_cells(STUDIES, against=["cost_aware"])
    with pytest.raises(ValueError, match=r"no study has a cache fraction with both 'lfu' and one of \['lru'\]"):
        summary_cells(STUDIES, policy="lfu", against=["lru"])
    with pytest.raises(ValueError, match=r"tolerance = -0.1, expected a finite number ≥ 0"):
        group_figures(summary_cells(STUDIES), tolerance=-0.1)
    with pytest.raises(FileNotFoundError, match=r"eviction.json: no such file, expected the eviction.json of a"):
        load_study(tmp_path)
    (tmp_path / "eviction.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match=r"no 'trace' and 'results' list, expected an eviction-study result"):
        load_study(tmp_path)


def test_load_study_reads_a_folder_or_the_file(tmp_path):
    (tmp_path / "eviction.json").write_text(json.dumps(STUDIES[0]))
    assert load_study(tmp_path) == load_study(tmp_path / "eviction.json") == STUDIES[0]
