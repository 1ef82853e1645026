"""Shared fixtures of the forecasting tests (also used by the Prophet/TFT/registry suites).

`grid_frame`: the `marts.grid_hourly`-shaped frame for CISO and DE, 2021-01-01 … 2021-04-30 (UTC), built from the
CSVs with `forecasting.data.grid_hourly_from_files`; the suite is skipped when the shared data is missing.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FORECAST_THREADS", "1")

import pandas as pd
import pytest

GRID_REGIONS = ("CISO", "DE")
GRID_START = "2021-01-01"
GRID_END = "2021-05-01"  # exclusive


@pytest.fixture(scope="session")
def grid_dir():
    from forecasting.data import default_grid_dir

    path = default_grid_dir()
    if not (path / "ensembleci").exists():
        pytest.skip(f"grid data not found under {path}")
    return path


@pytest.fixture(scope="session")
def grid_frame(grid_dir) -> pd.DataFrame:
    """CISO + DE, Jan–Apr 2021, shaped like marts.grid_hourly. Treat as read-only (copy before changing)."""
    from forecasting.data import grid_hourly_from_files

    return grid_hourly_from_files(grid_dir, GRID_REGIONS, start=GRID_START, end=GRID_END)


@pytest.fixture(scope="session")
def summer_frame(grid_dir) -> pd.DataFrame:
    """CISO + DE, 2021-05-01 … 2021-08-01 with the operators' published forecasts attached (they start on
    2021-07-01), for the tests of the published-forecast handling."""
    from forecasting.data import attach_published, grid_hourly_from_files, load_published_forecasts

    frame = grid_hourly_from_files(grid_dir, GRID_REGIONS, start="2021-05-01", end="2021-08-01")
    published = load_published_forecasts(GRID_REGIONS, source="files", data_dir=grid_dir)
    return attach_published(frame, published)
