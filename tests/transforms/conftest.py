"""A warehouse built from the real shared data, transformed by dbt once per test session."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def built_warehouse(tmp_path_factory, data_dir) -> dict:
    """Ingest every file source into a temporary warehouse, then `dbt build` it (transforms.runner.build).

    Yields {"path": the DuckDB file, "result": the DbtResult, "timings": seconds per step}. dbt's artifacts go to a
    temporary target folder, so the set-up manifest in transforms/target is left alone.
    """
    from transforms.runner import build
    from warehouse.ingest import ingest

    root = tmp_path_factory.mktemp("dbt_warehouse")
    path = root / "warehouse.duckdb"
    timings = {}
    start = time.monotonic()
    ingest(None, data_dir=data_dir, db_path=path, progress=False)
    timings["ingest_s"] = time.monotonic() - start
    start = time.monotonic()
    result = build(warehouse_path=path, target_path=root / "target", check=False)
    timings["dbt_build_s"] = time.monotonic() - start
    return {"path": path, "result": result, "timings": timings, "target": root / "target"}


@pytest.fixture
def query(built_warehouse):
    """Run a read-only query on the built warehouse; returns the rows."""
    from warehouse.db import reader

    def run(sql: str, params=None):
        with reader(built_warehouse["path"]) as con:
            return con.execute(sql, params or []).fetchall()

    return run


@pytest.fixture(scope="session")
def fresh_manifest() -> Path:
    """transforms/target/manifest.json regenerated once per session (what set-up does: `dbt parse`)."""
    from transforms import runner

    return runner.manifest()
