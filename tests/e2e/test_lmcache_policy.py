"""kvcost's eviction policy inside a real LMCache ``LocalCPUBackend`` (LMCache 0.5.6 on CPU): ``make e2e``.

Each case runs ``tests/e2e/lmcache_backend.py`` with the LMCache venv's python (``make lmcache``); see
that script for the store/remove sequence. LMCache's LRU evicts the oldest chunk and keeps a chunk no
request can reach (its parent was removed); kvcost evicts that orphan first, then by its value.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LMCACHE_PYTHON = ROOT / ".venv-lmcache" / "bin" / "python"
SCRIPT = ROOT / "tests" / "e2e" / "lmcache_backend.py"


def run(policy: str, **env: str) -> dict:
    if not LMCACHE_PYTHON.exists():
        pytest.fail(f"{LMCACHE_PYTHON} missing: run `make lmcache` (make e2e does)")
    environ = {**os.environ, **env}
    done = subprocess.run(
        [str(LMCACHE_PYTHON), str(SCRIPT), policy], env=environ, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"[e2e] LMCache {policy} {env or ''}: {result}")
    return result


def test_lmcache_lru_keeps_the_orphan_and_evicts_the_oldest():
    assert run("LRU") == {
        "before": ["a0", "a2", "c0", "x0"],
        "after_d0": ["a0", "a2", "c0", "d0"],
        "after_e0_x0_pinned": ["a2", "c0", "d0", "e0"],
    }


def test_kvcost_policy_in_lmcache_evicts_the_orphan_first_then_the_lowest_value_unpinned_chunk():
    assert run("KVCOST") == {
        "before": ["a0", "a2", "c0", "x0"],
        "after_d0": ["a0", "c0", "d0", "x0"],
        "after_e0_x0_pinned": ["c0", "d0", "e0", "x0"],
    }


def test_kvcost_policy_takes_its_rule_from_the_environment():
    assert run("KVCOST", KVCOST_LMCACHE_EVICTION="gdsf")["after_d0"] == ["a0", "c0", "d0", "x0"]


def test_an_unknown_kvcost_rule_names_the_field_and_the_choices():
    error = run("KVCOST", KVCOST_LMCACHE_EVICTION="belady")["error"]
    assert error.startswith("eviction = 'belady', expected one of ['cost_aware', 'flop_aware', 'gdsf', 'lfu'")
