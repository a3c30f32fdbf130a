"""The import graph runs bottom-up: no kvcost package imports one above it (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

#: The layers, bottom first. A module may import its own package and any package listed before it.
LAYERS: tuple[str, ...] = (
    "core",
    "features",
    "data",
    "calibration",
    "models",
    "eviction",
    "routing",
    "serving",
    "replay",
    "cli",
)
ROOT = Path(__file__).resolve().parents[1]


def _package_of(path: Path) -> str:
    """Top-level package of a source file (``cli`` for the CLI module or package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0]


def kvcost_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every ``kvcost.*`` import in ``path``, lazy and TYPE_CHECKING ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "kvcost":
            names = [f"kvcost.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "kvcost" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def source_files() -> list[Path]:
    """Every kvcost source file outside tests, the virtual environments (``.venv``, the engine's ``.venv-engine``)
    and build outputs."""
    skip = {"tests", "build", "runs", "docs"}
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not skip & set(p.relative_to(ROOT).parts) and not p.relative_to(ROOT).parts[0].startswith(".venv")
    )


def test_every_package_has_a_layer():
    packages = {_package_of(p) for p in source_files()} - {"__init__"}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"


def test_no_import_runs_upward():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [
        f"{p.relative_to(ROOT)}:{line} imports kvcost.{target} ({_package_of(p)} is below {target})"
        for p in source_files()
        if _package_of(p) in rank
        for line, target in kvcost_imports(p)
        if rank.get(target, -1) > rank[_package_of(p)]
    ]
    assert upward == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from kvcost.routing.router import Router\n", [(1, "routing")]),
        ("def f():\n    import kvcost.serving.api as api\n", [(2, "serving")]),
        ("from kvcost import core\nimport numpy\n", [(1, "core")]),
        ("import numpy\nfrom kvcost.cli import app\n", [(2, "cli")]),
    ],
)
def test_kvcost_imports_finds_lazy_imports(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert kvcost_imports(path) == expected
