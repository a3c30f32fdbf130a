"""Importing kvcost, or drawing its plots, has no side effects on matplotlib: no ``pyplot``, no backend chosen."""

import importlib.util
import json
import os
import subprocess
import sys

from tests.test_layers import ROOT, source_files

#: A backend no kvcost module would pick: a module that calls ``matplotlib.use`` at import changes it.
SENTINEL_BACKEND = "svg"

_PROBE = """
import importlib, json, sys
import matplotlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"pyplot": "matplotlib.pyplot" in sys.modules, "backend": matplotlib.get_backend()}))
"""


_DRAW = """
import json, sys
import numpy as np
import matplotlib
from kvcost.core.plots import plot_ttft_cdf
plot_ttft_cdf({"a": np.array([2.0, 1.0])}, sys.argv[1], "probe")
print(json.dumps({"pyplot": "matplotlib.pyplot" in sys.modules, "backend": matplotlib.get_backend()}))
"""


def _probe(script: str, *args: str) -> dict:
    """Run ``script`` in a fresh interpreter with ``MPLBACKEND`` = the sentinel; its last stdout line, parsed."""
    env = {**os.environ, "MPLBACKEND": SENTINEL_BACKEND}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Modules that run inside another system's process and import it: left out where it is not installed.
ENGINE_SIDE: dict[str, str] = {"kvcost.eviction.lmcache_policy": "lmcache"}


def module_names() -> list[str]:
    """``kvcost.<dotted path>`` of every kvcost source file (packages by their ``__init__``; ``__main__`` scripts,
    which run a command when imported, are left out, and :data:`ENGINE_SIDE` modules where their host is
    missing)."""
    names = []
    for path in source_files():
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.append(".".join(("kvcost", *parts)))
    return [n for n in names if n not in ENGINE_SIDE or importlib.util.find_spec(ENGINE_SIDE[n]) is not None]


def test_module_names_cover_every_layer():
    names = set(module_names())
    assert {"kvcost", "kvcost.core.plots", "kvcost.replay.eviction_study", "kvcost.models.train_job"} <= names
    missing = sum(importlib.util.find_spec(host) is None for host in ENGINE_SIDE.values())
    assert len(names) == len([p for p in source_files() if p.stem != "__main__"]) - missing


def test_importing_every_module_leaves_matplotlib_alone():
    assert _probe(_PROBE, *module_names()) == {"pyplot": False, "backend": SENTINEL_BACKEND}


def test_drawing_a_plot_leaves_matplotlib_alone(tmp_path):
    state = _probe(_DRAW, str(tmp_path / "cdf.png"))
    assert state == {"pyplot": False, "backend": SENTINEL_BACKEND}
    assert (tmp_path / "cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_the_cli_starts_without_the_heavy_libraries():
    # every command, --help and each refusal included, imports kvcost.cli first: sklearn, matplotlib and
    # scipy.optimize took about 4 s of a start on this machine; they are imported where they are used
    probe = "import json, sys, kvcost.cli; print(json.dumps(sorted(m for m in sys.argv[1:] if m in sys.modules)))"
    heavy = ["sklearn", "matplotlib", "scipy.optimize", "scipy.stats", "lightgbm", "mlflow", "fastapi", "torch"]
    done = subprocess.run([sys.executable, "-c", probe, *heavy], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
