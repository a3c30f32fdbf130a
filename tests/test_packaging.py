"""Every package folder of the repository is listed in pyproject.toml, so a wheel install has it all."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_packaged():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"kvcost"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and rel.parts[0] in {"tests", ".venv", "build", "runs"}:
            continue
        if rel.parts:
            found.add("kvcost." + ".".join(rel.parts))
    assert found == listed
