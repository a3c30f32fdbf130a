"""Tests of kvcost.core.reporting: JSON-safe values and the report writer."""

import json
import math

import numpy as np

from kvcost.core.reporting import json_safe, markdown_table, write_json


def test_json_safe_nulls_non_finite_floats_and_unwraps_numpy():
    value = {1: (float("nan"), np.float32(0.5), np.int64(2)), "x": [math.inf, -math.inf, 1.5, "s", None, True]}
    assert json_safe(value) == {"1": [None, 0.5, 2], "x": [None, None, 1.5, "s", None, True]}
    assert type(json_safe(np.float64(0.25))) is float and type(json_safe(np.int32(3))) is int


def test_write_json_sorts_keys_and_writes_null_for_nan(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"b": float("nan"), "a": [np.float64(1.0)]})
    assert path.read_text() == '{\n  "a": [\n    1.0\n  ],\n  "b": null\n}\n'
    assert json.loads(path.read_text()) == {"a": [1.0], "b": None}


def test_markdown_table():
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
