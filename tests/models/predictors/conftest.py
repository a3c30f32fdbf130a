"""Fixtures for the term-predictor tests."""

import numpy as np
import pytest

from .synthetic import synthetic_features


@pytest.fixture(scope="session")
def tiny_features() -> np.ndarray:
    """64 synthetic rows (read-only: tests must not modify it)."""
    x = synthetic_features(64, seed=0)
    x.flags.writeable = False
    return x
