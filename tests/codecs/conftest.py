"""Shared data for the codec tests: seeded Gaussian rows and rows with outlier channels."""

from __future__ import annotations

import numpy as np
import pytest

# Eight of 1024 channels scaled x50: the "massive activation" pattern seen in real K/V.
OUTLIER_CHANNELS = (3, 100, 257, 511, 640, 777, 900, 1000)
OUTLIER_SCALE = 50.0


@pytest.fixture(scope="session")
def gaussian_rows() -> np.ndarray:
    """512 x 1024 seeded N(0, 1) fp32 rows."""
    return np.random.default_rng(20250419).standard_normal((512, 1024)).astype(np.float32)


@pytest.fixture(scope="session")
def outlier_channels() -> tuple[int, ...]:
    return OUTLIER_CHANNELS


@pytest.fixture(scope="session")
def outlier_rows(gaussian_rows: np.ndarray) -> np.ndarray:
    """The Gaussian rows with OUTLIER_CHANNELS multiplied by OUTLIER_SCALE."""
    x = gaussian_rows.copy()
    x[:, list(OUTLIER_CHANNELS)] *= OUTLIER_SCALE
    return x
