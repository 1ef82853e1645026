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


def operate_day(root: Path, data_dir: Path, day: str, n_jobs: int, hours: int) -> Path:
    """A warehouse under `root` on which the operating loop ran: the grid marts built, `n_jobs` trace jobs of `day`
    submitted, `hours` hours planned and dispatched to the replay executor from the day's midnight; returns its
    path. The ledger marts are not built (scheduling.tasks.build_ledger does that)."""
    from scheduling import loop
    from scheduling.executors.replay import ReplayExecutor
    from scheduling.queue.intake import submit_file
    from scheduling.queue.trace import write_trace_file
    from scheduling.service import plan_fleet
    from transforms.runner import build
    from warehouse.ingest import ingest

    db = root / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
    build(select="+grid_hourly", warehouse_path=db, target_path=root / "target")
    fleet = plan_fleet(None, data_dir).sampled()
    jobs = write_trace_file(root / "jobs.yaml", day, n_jobs, fleet, data_dir=data_dir)["path"]
    report = submit_file(jobs, db_path=db, data_dir=data_dir)
    assert not report.rejected, report.rejected[:3]
    executor = ReplayExecutor(db_path=db)
    loop.run_hours(
        f"{day}T00:00Z",
        hours,
        db_path=db,
        data_dir=data_dir,
        schedule_root=root / "schedules",
        fleet=fleet,
        executors=dict.fromkeys(fleet.names, executor),
    )
    return db
