"""Small helpers shared by every command's report: JSON with NaN as null, Markdown tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON with sorted keys; non-finite floats become ``null``."""
    path.write_text(json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


def read_json(path: Path, what: str, expected: str) -> Any:
    """The parsed JSON of file ``path``.

    Raises:
        FileNotFoundError: no such file (the message names ``what``, the path and ``expected``).
        ValueError: not JSON (the message names ``what``, the path and the parser's reason).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r}: no such file, expected {expected}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {str(path)!r}: not JSON ({err})") from err


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: non-finite floats become None (JSON has no NaN), recursively.

    Dicts get string keys, tuples become lists, numpy floats and ints become
    Python ``float`` and ``int``; anything else is returned unchanged.

    Example:
        >>> json_safe({1: (float("nan"), np.int64(2))})
        {'1': [None, 2]}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
