"""Shared fixtures: a temporary warehouse per test, the real DATA_DIR, single-threaded numerics."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tmp_warehouse(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "warehouse.duckdb"
    monkeypatch.setenv("WAREHOUSE_PATH", str(path))
    return path


@pytest.fixture(scope="session")
def data_dir() -> Path:
    from warehouse.config import data_dir as configured

    path = configured()
    if not (path / "openb").exists():
        pytest.skip(f"DATA_DIR {path} does not hold the shared data")
    return path
