"""Job events into the warehouse: `raw.job_events`, what executors report (`Executor.sync`), loaded like every
raw table (`warehouse.db.load_batch`: `_source`, `_batch_id`, `_loaded_at`; bad rows to quarantine).

    load_events(executor.sync(now, since), executor, since, now)     # or: sync_events(executor, since, now)

A batch is one executor's window [since, now): batch id ``<executor>:<since>/<now>`` (``-`` for no lower bound),
source ``executor:<executor>``. Loading the same window again replaces its own rows (identical events leave the
table byte-identical); a window that overlaps another loaded window of the same executor without being equal to it
is refused, so no event is counted twice. Rows rejected to `quarantine.rejected_rows`, with the field and reason:
an unknown event type, a missing job id, a time that is missing, not a time, not in UTC (no zone, or another
offset), or outside the window, a number that is not one, another executor's name, a duplicate event.
"""

from __future__ import annotations

import math

import pandas as pd

from common.timeutil import HOUR, iso_z, utc
from scheduling.executors.base import EVENT_COLUMNS, EVENT_TYPES, Executor, check_window, typed_frame
from warehouse.db import Batch, LoadResult, Rejection, load_batch, reader, table_exists, writer

TABLE = "raw.job_events"
# how far back a sync catches up on windows missed while an executor could not be reached
MAX_CATCH_UP = pd.Timedelta(hours=24)
DDL = f"""
CREATE SCHEMA IF NOT EXISTS raw;
CREATE TABLE IF NOT EXISTS {TABLE} (
    {", ".join(f'"{name}" {kind}' for name, kind in EVENT_COLUMNS.items())},
    _source VARCHAR,
    _batch_id VARCHAR,
    _loaded_at TIMESTAMPTZ
);
"""
_NUMBERS = ("attempt", "gpu_count", "gpu_milli", "power_limit_w", "energy_kwh")


def batch_id_for(executor: str, since, now) -> str:
    return f"{executor}:{'-' if since is None else iso_z(since)}/{iso_z(now)}"


def _window_of(batch_id: str, executor: str) -> tuple[pd.Timestamp | None, pd.Timestamp] | None:
    prefix = f"{executor}:"
    if not batch_id.startswith(prefix):
        return None
    since, sep, now = batch_id[len(prefix) :].rpartition("/")
    if not sep:
        return None
    try:
        return (None if since == "-" else pd.Timestamp(since)), pd.Timestamp(now)
    except ValueError:
        return None


def _missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _utc_time(value) -> tuple[pd.Timestamp | None, str | None]:
    """(timestamp, None) for a UTC time, else (None, reason)."""
    if _missing(value):
        return None, "missing time"
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError):
        return None, "not a time"
    if ts is pd.NaT:
        return None, "missing time"
    if ts.tzinfo is None:
        return None, "time not UTC: it has no time zone"
    if ts.utcoffset() != pd.Timedelta(0):
        return None, f"time not UTC: offset {ts.strftime('%z')}"
    return ts.tz_convert("UTC"), None


def check_events(events: pd.DataFrame, executor: str, since, now) -> tuple[pd.DataFrame, list[Rejection]]:
    """Split `events` into the good rows (typed EVENT_COLUMNS, `executor` filled in) and rejections."""
    since, now = check_window(since, now)
    frame = pd.DataFrame(events).reset_index(drop=True)
    good, rejections, seen = [], [], set()
    source = f"executor {executor}"
    for i, row in enumerate(frame.to_dict(orient="records")):

        def reject(field: str, reason: str, value=None, row=row, i=i) -> None:
            rejections.append(
                Rejection(reason=reason, file=source, row_number=i + 1, field=field, value=value, record=row)
            )

        event = row.get("event")
        if _missing(event) or str(event) not in EVENT_TYPES:
            reject("event", f"unknown event type (known: {', '.join(EVENT_TYPES)})", event)
            continue
        job = row.get("job_id")
        if _missing(job):
            reject("job_id", "missing job id", job)
            continue
        if not _missing(row.get("executor")) and str(row["executor"]) != executor:
            reject("executor", f"event of executor {row['executor']!r} loaded as {executor!r}", row["executor"])
            continue
        at, problem = _utc_time(row.get("event_time"))
        if problem:
            reject("event_time", problem, row.get("event_time"))
            continue
        if at >= now or (since is not None and at < since):
            reject(
                "event_time", f"outside the window [{'-' if since is None else iso_z(since)}, {iso_z(now)})", iso_z(at)
            )
            continue
        bad_number = next(
            (c for c in _NUMBERS if not _missing(row.get(c)) and pd.isna(pd.to_numeric(row.get(c), errors="coerce"))),
            None,
        )
        if bad_number:
            reject(bad_number, "not a number", row.get(bad_number))
            continue
        planner = row.get("planner_job_id")
        if _missing(planner):
            tenant = row.get("tenant")
            planner = str(job) if _missing(tenant) else f"{tenant}/{job}"
        key = (str(planner), row.get("plan_id"), str(event), at)
        if key in seen:
            reject("event", "duplicate event (same job, plan, event and time)", event)
            continue
        seen.add(key)
        good.append({**row, "planner_job_id": planner, "event_time": at, "executor": executor})
    return typed_frame(good, EVENT_COLUMNS), rejections


def load_events(events: pd.DataFrame, executor: str | Executor, since, now, db_path=None, loaded_at=None) -> LoadResult:
    """Load `executor`'s events of the window [since, now) into raw.job_events as one idempotent batch."""
    name = executor.name if isinstance(executor, Executor) else str(executor)
    since, now = check_window(since, now)
    good, rejections = check_events(events, name, since, now)
    batch = Batch(
        table=TABLE,
        batch_id=batch_id_for(name, since, now),
        source=f"executor:{name}",
        frame=good,
        rejections=rejections,
    )
    with writer(db_path) as con:
        con.execute(DDL)
        _check_overlap(con, name, since, now)
        return load_batch(con, batch, loaded_at=loaded_at)


def _check_overlap(con, executor: str, since, now) -> None:
    rows = con.execute(
        "SELECT batch_id FROM raw._batches WHERE table_name = ? AND starts_with(batch_id, ?)", [TABLE, f"{executor}:"]
    ).fetchall()
    for (batch_id,) in rows:
        window = _window_of(batch_id, executor)
        if window is None or window == (since, now):
            continue
        lo, hi = window
        if (lo is None or lo < now) and (since is None or since < hi):
            raise ValueError(
                f"window {batch_id_for(executor, since, now)} overlaps the loaded window {batch_id} of executor "
                f"{executor!r}: load windows that partition time (each event once)"
            )


def window_start(executor: str | Executor, now, db_path=None, *, step=HOUR, max_catch_up=MAX_CATCH_UP) -> pd.Timestamp:
    """Where `executor`'s next window up to `now` starts: the end of its latest loaded window that ends before
    `now` (so a window missed while the executor was unreachable is caught up, at most `max_catch_up` back), else
    `now - step`. Depends only on windows ending before `now`, so re-running an hour syncs the same window."""
    name = executor.name if isinstance(executor, Executor) else str(executor)
    now = utc(now)
    try:
        with reader(db_path) as con:
            if not table_exists(con, "raw._batches"):
                return now - step
            rows = con.execute(
                "SELECT batch_id FROM raw._batches WHERE table_name = ? AND starts_with(batch_id, ?)",
                [TABLE, f"{name}:"],
            ).fetchall()
    except FileNotFoundError:  # no warehouse yet: nothing loaded
        return now - step
    ends = [w[1] for w in (_window_of(b, name) for (b,) in rows) if w is not None and w[1] < now]
    if not ends:
        return now - step
    return max(max(ends), now - max_catch_up)


def sync_events(executor: Executor, since, now, db_path=None) -> LoadResult:
    """`executor.sync(now, since)` loaded as the window's batch (run after the hour's dispatches and cancels)."""
    return load_events(executor.sync(now, since=since), executor, since, now, db_path=db_path)
