"""Every package folder and bundled data file of the repository is declared in pyproject.toml: a wheel has it all."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_packaged():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"kvcost"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and (rel.parts[0] in {"tests", "build", "runs"} or rel.parts[0].startswith(".venv")):
            continue
        if rel.parts:
            found.add("kvcost." + ".".join(rel.parts))
    assert found == listed


def test_every_bundled_file_is_package_data():
    # the traces and profiles ship as package data of kvcost.data (folders under data/bundled are not packages)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["kvcost.data"]
    shipped = {path for pattern in patterns for path in (ROOT / "data").glob(pattern) if path.is_file()}
    bundled = {path for path in (ROOT / "data" / "bundled").rglob("*") if path.is_file()}
    assert bundled and shipped == bundled
