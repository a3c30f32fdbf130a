"""Every plot draws exactly the data it is given and writes a PNG of the stated size."""

import struct

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from kvcost.core.plots import (
    plot_eviction_study,
    plot_hit_vs_p99,
    plot_holdout_ttft,
    plot_p99_vs_load,
    plot_queues,
    plot_ttft_cdf,
)


def png_size(path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_holdout_scatters_each_model_and_the_diagonal(tmp_path):
    actual = np.array([0.5, 2.0, 4.0])
    predicted = {"analytic": np.array([1.0, 1.0, 1.0]), "learned (calibrated)": np.array([0.4, 2.2, 3.9])}
    fig = plot_holdout_ttft(actual, predicted, tmp_path / "h.png")
    (ax,) = fig.axes
    assert [c.get_label() for c in ax.collections] == ["analytic", "learned (calibrated)"]
    np.testing.assert_array_equal(ax.collections[0].get_offsets(), [[0.5, 1.0], [2.0, 1.0], [4.0, 1.0]])
    np.testing.assert_array_equal(ax.collections[1].get_offsets(), [[0.5, 0.4], [2.0, 2.2], [4.0, 3.9]])
    (ideal,) = ax.lines
    assert ideal.get_label() == "ideal"
    np.testing.assert_array_equal(ideal.get_xydata(), [[1e-3, 1e-3], [4.0, 4.0]])
    assert ax.get_title() == "Holdout TTFT, 3 requests"
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert png_size(tmp_path / "h.png") == (660, 605)


def test_ttft_cdf_sorts_each_configuration_and_skips_empty_ones(tmp_path):
    ttft = {"a": np.array([3.0, 1.0, 2.0]), "empty": np.array([]), "b": np.array([0.5, 0.25])}
    fig = plot_ttft_cdf(ttft, tmp_path / "cdf.png", "tiny")
    (ax,) = fig.axes
    a, b = ax.lines
    assert (a.get_label(), a.get_linestyle(), b.get_label(), b.get_linestyle()) == ("a", "-", "b", ":")
    np.testing.assert_array_equal(a.get_xdata(), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(a.get_ydata(), [1 / 3, 2 / 3, 1.0])
    np.testing.assert_array_equal(b.get_xydata(), [[0.25, 0.5], [0.5, 1.0]])
    assert ax.get_title() == "TTFT CDF — tiny"
    assert ax.get_xscale() == "log"
    assert png_size(tmp_path / "cdf.png") == (770, 495)


def test_queues_one_panel_per_run_one_line_per_worker(tmp_path):
    first = pd.DataFrame(
        {"worker_id": [1, 0, 1, 0], "t_s": [0.0, 0.0, 1.0, 1.0], "queued_prefill_tokens": [5, 7, 3, 0]}
    )
    second = pd.DataFrame({"worker_id": [0, 0], "t_s": [0.0, 2.0], "queued_prefill_tokens": [9, 1]})
    fig = plot_queues({"lru": first, "kvcost": second}, tmp_path / "q.png", "demo")
    top, bottom = fig.axes
    assert (top.get_title(), bottom.get_title()) == ("lru", "kvcost")
    assert [line.get_label() for line in top.lines] == ["worker 0", "worker 1"]
    np.testing.assert_array_equal(top.lines[0].get_xydata(), [[0.0, 7.0], [1.0, 0.0]])
    np.testing.assert_array_equal(top.lines[1].get_xydata(), [[0.0, 5.0], [1.0, 3.0]])
    np.testing.assert_array_equal(bottom.lines[0].get_xydata(), [[0.0, 9.0], [2.0, 1.0]])
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["worker 0", "worker 1"]
    assert fig.get_suptitle() == "Queued prefill tokens per worker — demo"
    assert png_size(tmp_path / "q.png") == (880, 616)


BENCH_ROWS = [  # each cell's measured utilisation differs from its level's target, as in a bench
    {"workers": 4, "policy": "cost_aware", "load": "80%", "utilisation": 0.83, "ttft_p99_s": 2.0, "hit_ratio": 0.3},
    {"workers": 4, "policy": "cost_aware", "load": "60%", "utilisation": 0.55, "ttft_p99_s": 1.0, "hit_ratio": 0.2},
    {"workers": 4, "policy": "oracle", "load": "60%", "utilisation": 0.61, "ttft_p99_s": 0.5, "hit_ratio": 0.4},
    {"workers": 8, "policy": "cost_aware", "load": "60%", "utilisation": 0.6, "ttft_p99_s": 3.0, "hit_ratio": 0.1},
]


def test_p99_vs_load_one_panel_per_size_lines_sorted_by_load(tmp_path):
    styles = {"cost_aware": {"lw": 2.4, "marker": "o"}, "oracle": {"lw": 1.4, "ls": "--", "color": "black"}}
    fig = plot_p99_vs_load(BENCH_ROWS, tmp_path / "p99.png", styles)
    four, eight = fig.axes
    assert (four.get_title(), eight.get_title()) == ("4 workers", "8 workers")
    ours, oracle = four.lines
    np.testing.assert_array_equal(ours.get_xydata(), [[60, 1.0], [80, 2.0]])  # the levels' targets, in %
    assert (ours.get_linewidth(), ours.get_marker()) == (2.4, "o")
    np.testing.assert_array_equal(oracle.get_xydata(), [[60, 0.5]])
    assert (oracle.get_linestyle(), oracle.get_color()) == ("--", "black")
    assert [line.get_xydata().shape for line in eight.lines] == [(1, 2), (0, 2)]
    assert png_size(tmp_path / "p99.png") == (1320, 506)


def test_hit_vs_p99_one_scatter_per_policy(tmp_path):
    styles = {"cost_aware": {"marker": "o", "s": 40, "color": None}, "oracle": {"marker": "x", "s": 22, "color": "k"}}
    fig = plot_hit_vs_p99(BENCH_ROWS, tmp_path / "hit.png", styles)
    (ax,) = fig.axes
    ours, oracle = ax.collections
    np.testing.assert_array_equal(ours.get_offsets(), [[0.3, 2.0], [0.2, 1.0], [0.1, 3.0]])
    np.testing.assert_array_equal(ours.get_sizes(), [40])
    np.testing.assert_array_equal(oracle.get_offsets(), [[0.4, 0.5]])
    np.testing.assert_array_equal(oracle.get_facecolor()[0], to_rgba("k"))
    assert png_size(tmp_path / "hit.png") == (825, 550)


def test_eviction_study_three_panels_lines_sorted_by_fraction(tmp_path):
    rows = [
        {"policy": "lru", "cache_fraction": 0.5, "hit_ratio": 0.4, "prefill_saved_s": 20.0, "ttft_p99_s": 1.0},
        {"policy": "lru", "cache_fraction": 0.1, "hit_ratio": 0.1, "prefill_saved_s": 5.0, "ttft_p99_s": 3.0},
        {"policy": "gdsf", "cache_fraction": 0.1, "hit_ratio": 0.2, "prefill_saved_s": 6.0, "ttft_p99_s": 2.5},
    ]
    fig = plot_eviction_study(rows, tmp_path / "e.png", "study")
    hit, saved, p99 = fig.axes
    assert [ax.get_ylabel() for ax in fig.axes] == ["token hit ratio", "prefill saved (s)", "TTFT P99 (s)"]
    assert [line.get_label() for line in hit.lines] == ["lru", "gdsf"]
    np.testing.assert_array_equal(hit.lines[0].get_xydata(), [[0.1, 0.1], [0.5, 0.4]])
    np.testing.assert_array_equal(saved.lines[0].get_xydata(), [[0.1, 5.0], [0.5, 20.0]])
    np.testing.assert_array_equal(p99.lines[1].get_xydata(), [[0.1, 2.5]])
    assert fig.get_suptitle() == "study"
    assert png_size(tmp_path / "e.png") == (1800, 504)


def test_a_policy_without_a_style_is_a_key_error(tmp_path):
    with pytest.raises(KeyError, match="oracle"):
        plot_p99_vs_load(BENCH_ROWS, tmp_path / "p99.png", {"cost_aware": {}})
