"""What each step of the operating loop did, for monitoring: `ops.loop_steps`, one row per planning hour and step
(sync, plan, dispatch), written when the step ends -- also when it raises.

Its times are processing times (the wall clock when the step ran), the one thing an alert on a stalled planner
needs; the plan's own time stays `plan_time`. One row per (plan_time, step): the first run that completed is kept
(re-running an hour leaves the warehouse as it was), and a failed run's row is replaced by the next run's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from warehouse.db import create_tables, writer

log = logging.getLogger(__name__)
TABLE = "ops.loop_steps"
COLUMNS: dict[str, str] = {
    "plan_time": "TIMESTAMPTZ NOT NULL",
    "step": "VARCHAR NOT NULL",  # sync | plan | dispatch
    "started_at": "TIMESTAMPTZ NOT NULL",  # wall clock
    "finished_at": "TIMESTAMPTZ NOT NULL",  # wall clock
    "duration_s": "DOUBLE NOT NULL",
    "executors": "VARCHAR[]",  # the executors the step talked to
    "unreachable": "VARCHAR[]",  # those it could not reach
    "dispatch_failed": "INTEGER",  # jobs whose dispatch failed (dispatch step)
    "unconfirmed": "INTEGER",  # jobs an executor could not confirm (sync step)
    "fleet": "VARCHAR",  # JSON {cluster: {gpus, zone}} of the fleet the step planned on (plan step)
    "error": "VARCHAR",  # the exception the step raised; NULL when it completed
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS ops;
CREATE TABLE IF NOT EXISTS {TABLE} (
    {", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())},
    PRIMARY KEY (plan_time, step)
);
"""
STEPS = ("sync", "plan", "dispatch")


def record_step(row: dict, db_path=None) -> None:
    """Write one step's row (COLUMNS; missing ones NULL), unless a run of the same hour and step completed before."""
    values = [row.get(name) for name in COLUMNS]
    with writer(db_path) as con:
        create_tables(con, DDL)
        # delete-insert in one transaction: a shared catalog (DuckLake) has no key to replace on
        con.execute("BEGIN TRANSACTION")
        try:
            key = [row["plan_time"], row["step"]]
            done = con.execute(f"SELECT count(*) FROM {TABLE} WHERE plan_time = ? AND step = ? AND error IS NULL", key)
            if done.fetchone()[0]:  # a completed run is kept: re-running an hour leaves the warehouse as it was
                con.execute("COMMIT")
                return
            con.execute(f"DELETE FROM {TABLE} WHERE plan_time = ? AND step = ?", key)
            con.execute(f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", values)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


def logged_step(step: str, details: Callable[[object, object], dict]) -> Callable:
    """Decorate a loop step `fn(ctx, ...)`: time it and record its row; `details(ctx, result)` gives the step's
    own columns (unreachable, dispatch_failed, unconfirmed, fleet). A dry run (`dry_run=True`) records
    nothing. Applied inside the step's warehouse session (`loop.one_connection`), the row costs no connection of
    its own."""
    if step not in STEPS:
        raise ValueError(f"unknown loop step {step!r}; steps: {', '.join(STEPS)}")

    def decorate(fn):
        @functools.wraps(fn)
        def wrapped(ctx, *args, **kwargs):
            if kwargs.get("dry_run"):
                return fn(ctx, *args, **kwargs)
            started, t0 = datetime.now(UTC), time.perf_counter()  # processing time, never a plan's time
            row = {
                "plan_time": ctx.plan_time.to_pydatetime(),
                "step": step,
                "started_at": started,
                "executors": sorted(e.name for e in ctx.distinct_executors()),
            }
            try:
                result = fn(ctx, *args, **kwargs)
            except BaseException as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                try:
                    _finish(row, t0, ctx.db_path)
                except Exception as log_exc:  # noqa: BLE001 - the step's own error is the one to raise
                    log.warning("loop step %s: its row could not be written: %s", step, log_exc)
                raise
            row.update(details(ctx, result))
            _finish(row, t0, ctx.db_path)
            return result

        return wrapped

    return decorate


def _finish(row: dict, t0: float, db_path) -> None:
    duration = time.perf_counter() - t0
    row["duration_s"] = duration
    row["finished_at"] = row["started_at"] + timedelta(seconds=duration)
    record_step(row, db_path)
