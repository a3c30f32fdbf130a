"""Small helpers shared by every command's report: JSON with NaN as null, Markdown tables."""

from __future__ import annotations

import json
import math
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON with sorted keys; non-finite floats become ``null``."""
    path.write_text(json.dumps(_finite(data), indent=2, sort_keys=True) + "\n")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
