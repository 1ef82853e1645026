"""raw.job_events: an executor's window loads idempotently (same window twice -> identical table), bad events go to
quarantine with field and reason, overlapping windows are refused."""

from __future__ import annotations

import hashlib

import duckdb
import pandas as pd
import pytest

from scheduling.executors.base import EVENT_COLUMNS
from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.events import load_events, sync_events
from scheduling.executors.replay import ReplayExecutor
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

H = pd.Timedelta(hours=1)


def _digest(db, table: str) -> str:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.execute(f"SELECT * FROM {table}").df()
    finally:
        con.close()
    frame = frame.astype(str).sort_values(list(frame.columns), kind="mergesort").reset_index(drop=True)
    return hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()


def _query(db, sql: str) -> pd.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).df()
    finally:
        con.close()


def _replay(db) -> ReplayExecutor:
    executor = ReplayExecutor(db_path=db, failure_rate=0.2)
    dispatch(plan_id_at(), sample_items(10), executor, db_path=db)
    return executor


def test_same_window_twice_leaves_the_table_identical(tmp_warehouse):
    executor = _replay(tmp_warehouse)
    first = sync_events(executor, PLAN_TIME - H, PLAN_TIME + 2 * H, db_path=tmp_warehouse)
    assert first.batch_id == "replay:2021-07-15T11:00:00Z/2021-07-15T14:00:00Z" and first.rows > 10
    before = _digest(tmp_warehouse, "raw.job_events"), _digest(tmp_warehouse, "raw._batches")
    again = sync_events(executor, PLAN_TIME - H, PLAN_TIME + 2 * H, db_path=tmp_warehouse)
    assert again.skipped_unchanged
    assert (_digest(tmp_warehouse, "raw.job_events"), _digest(tmp_warehouse, "raw._batches")) == before
    sync_events(executor, PLAN_TIME + 2 * H, PLAN_TIME + 24 * H, db_path=tmp_warehouse)  # the next window
    stored = _query(tmp_warehouse, "SELECT * FROM raw.job_events ORDER BY event_time, planner_job_id, event")
    assert list(stored.columns) == [*EVENT_COLUMNS, "_source", "_batch_id", "_loaded_at"]
    assert (stored["_source"] == "executor:replay").all()
    counts = stored.groupby("planner_job_id").size()
    assert len(counts) == 10 and (counts == 3).all()  # dispatched, started, finished|failed: each once
    types = _query(
        tmp_warehouse,
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'raw' AND table_name = 'job_events'",
    ).set_index("column_name")["data_type"]
    assert types["event_time"] == "TIMESTAMP WITH TIME ZONE" and types["gpu_count"] == "INTEGER"
    assert types["energy_kwh"] == "DOUBLE"


def test_a_rerun_window_replaces_its_own_rows(tmp_warehouse):
    executor = _replay(tmp_warehouse)
    window = (PLAN_TIME - H, PLAN_TIME + 24 * H)
    sync_events(executor, *window, db_path=tmp_warehouse)
    executor.cancel("acme/job-0004", PLAN_TIME + 0.5 * H)  # a late cancel changes what that window holds
    sync_events(executor, *window, db_path=tmp_warehouse)
    rows = _query(tmp_warehouse, "SELECT event FROM raw.job_events WHERE planner_job_id = 'acme/job-0004' ORDER BY 1")
    assert rows["event"].tolist() == ["cancelled", "dispatched", "started"]


def test_overlapping_windows_are_refused(tmp_warehouse):
    executor = _replay(tmp_warehouse)
    sync_events(executor, PLAN_TIME - H, PLAN_TIME + H, db_path=tmp_warehouse)
    with pytest.raises(ValueError, match="overlaps the loaded window replay:2021-07-15T11:00:00Z/2021-07-15T13"):
        sync_events(executor, PLAN_TIME, PLAN_TIME + 2 * H, db_path=tmp_warehouse)
    with pytest.raises(ValueError, match="overlaps"):
        sync_events(executor, None, PLAN_TIME + 3 * H, db_path=tmp_warehouse)
    sync_events(executor, PLAN_TIME + H, PLAN_TIME + 2 * H, db_path=tmp_warehouse)  # adjacent: fine
    other = ReplayExecutor(db_path=tmp_warehouse, name="replay-eu")
    sync_events(other, PLAN_TIME, PLAN_TIME + 2 * H, db_path=tmp_warehouse)  # another executor's windows
    with pytest.raises(ValueError, match="since must be before now"):
        load_events(pd.DataFrame(), executor, PLAN_TIME, PLAN_TIME, db_path=tmp_warehouse)


def test_bad_events_are_quarantined_with_the_reason(tmp_warehouse):
    good = {
        "tenant": "acme",
        "job_id": "job-1",
        "planner_job_id": "acme/job-1",
        "event": "started",
        "event_time": pd.Timestamp("2021-07-15T12:30Z"),
        "plan_id": plan_id_at(),
        "attempt": 1,
        "cluster": "usw-t4",
        "gpu_count": 1,
        "energy_kwh": 0.4,
    }
    rows = [
        good,
        {**good, "event": "exploded"},
        {**good, "job_id": None},
        {**good, "job_id": "  "},
        {**good, "event_time": "2021-07-15 12:30"},  # no zone
        {**good, "event_time": pd.Timestamp("2021-07-15T14:30+02:00")},  # the same instant, not in UTC
        {**good, "event_time": "yesterday-ish"},
        {**good, "event_time": pd.Timestamp("2021-07-15T15:00Z")},  # after the window
        {**good, "gpu_count": "two"},
        {**good, "executor": "slurm"},
        dict(good),  # a duplicate of the first
        {**good, "job_id": "job-2", "planner_job_id": None, "event_time": "2021-07-15T12:45:00Z"},  # string UTC: fine
    ]
    result = load_events(pd.DataFrame(rows), "replay", PLAN_TIME, PLAN_TIME + H, db_path=tmp_warehouse)
    assert (result.rows, result.rejected) == (2, 10)
    stored = _query(tmp_warehouse, "SELECT * FROM raw.job_events ORDER BY job_id")
    assert stored["planner_job_id"].tolist() == ["acme/job-1", "acme/job-2"]  # filled from tenant + job_id
    assert (stored["executor"] == "replay").all() and stored["energy_kwh"].tolist() == [0.4, 0.4]
    rejected = _query(
        tmp_warehouse, "SELECT row_number, field, reason FROM quarantine.rejected_rows ORDER BY row_number"
    )
    assert rejected["row_number"].tolist() == list(range(2, 12))
    fields = [
        "event",
        "job_id",
        "job_id",
        "event_time",
        "event_time",
        "event_time",
        "event_time",
        "gpu_count",
        "executor",
        "event",
    ]
    assert rejected["field"].tolist() == fields
    reasons = rejected["reason"].tolist()
    assert reasons[0].startswith("unknown event type") and reasons[1] == reasons[2] == "missing job id"
    assert reasons[3] == "time not UTC: it has no time zone" and reasons[4] == "time not UTC: offset +0200"
    assert reasons[5] == "not a time" and reasons[6].startswith("outside the window [2021-07-15T12:00:00Z")
    assert reasons[7] == "not a number" and "executor 'slurm'" in reasons[8] and reasons[9].startswith("duplicate")


def test_typed_values_match_typed_frame_for_one_row():
    """A single-row INSERT's values are typed as the frame path types them: NaN and missing are NULL, integers
    rounded, times in UTC, text as str."""
    import duckdb

    from scheduling.executors.base import typed_frame, typed_values

    columns = {"at_time": "TIMESTAMPTZ NOT NULL", "n": "INTEGER NOT NULL", "x": "DOUBLE", "ok": "BOOLEAN",
               "name": "VARCHAR", "gone": "VARCHAR"}  # fmt: skip
    row = {"at_time": "2021-07-01T02:00:00+02:00", "n": 3.0000001, "x": float("nan"), "ok": True, "name": 7}
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE TABLE t ({', '.join(f'{k} {v}' for k, v in columns.items())})")
    con.execute(f"INSERT INTO t VALUES ({', '.join('?' * len(columns))})", typed_values(row, columns))
    frame = typed_frame([row], columns)
    con.register("f", frame)
    con.execute("INSERT INTO t BY NAME SELECT * FROM f")
    first, second = con.execute("SELECT * FROM t").fetchall()
    assert first == second
    assert first[1] == 3 and first[2] is None and first[5] is None and first[4] == "7"
    assert str(first[0]).startswith("2021-07-01 00:00:00")
