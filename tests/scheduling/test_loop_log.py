"""`ops.loop_steps`: one row per planning hour and step; a completed run's row is kept (re-running an hour leaves
the warehouse as it was), a failed run's row gives way to the next run's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduling.output.loop_log import TABLE, record_step
from warehouse.db import reader

T = datetime(2021, 7, 15, 12, tzinfo=UTC)


def _row(started: datetime, error: str | None = None) -> dict:
    return {"plan_time": T, "step": "plan", "started_at": started, "finished_at": started + timedelta(seconds=2),
            "duration_s": 2.0, "executors": ["replay"], "unreachable": [], "error": error}  # fmt: skip


def _rows(db) -> list[tuple]:
    with reader(db) as con:
        return con.execute(f"SELECT started_at, error FROM {TABLE} ORDER BY started_at").fetchall()


def test_a_completed_step_is_kept_and_a_failed_one_gives_way(tmp_path):
    db = tmp_path / "warehouse.duckdb"
    first = datetime(2026, 1, 1, tzinfo=UTC)
    record_step(_row(first, error="RuntimeError: executor down"), db)
    assert [e for _, e in _rows(db)] == ["RuntimeError: executor down"]
    record_step(_row(first + timedelta(hours=1)), db)  # the retry completes: it replaces the failure
    assert _rows(db) == [(first + timedelta(hours=1), None)]
    record_step(_row(first + timedelta(hours=2)), db)  # a re-run of a completed hour changes nothing
    record_step(_row(first + timedelta(hours=3), error="ValueError: late"), db)
    assert _rows(db) == [(first + timedelta(hours=1), None)]
