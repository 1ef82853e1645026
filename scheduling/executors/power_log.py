"""Exactly-once power-limit changes of running jobs: `plan.power_changes`, keyed by (plan_id, job_id).

    record_decisions(plan_id, changes, executor_of)      # the plan's decisions, once per plan (status intent)
    apply_power_changes(plan_id, executor)               # -> {"sent": [...], "reconciled": [...], ...}

The plan's decisions (`scheduling.planning.recap`: the changed rows) are written once, as ``intent`` rows, before
any executor is called; a re-run of the hour keeps them (an hour decides once). Applying them, under the same
dispatcher lock as `dispatch_log`: a row not yet ``sent`` is first looked up (`Executor.power_change_ref`, the
change may have reached the executor before a crash), then sent (`Executor.set_power_limit` with the plan id as
its idempotency key); it ends ``sent`` with the executor's ref, ``no_run`` when the job no longer runs, or
``failed`` with the error (retried by a re-run). A run killed anywhere leaves rows at ``intent`` or ``sent``, so no
change is made twice. Fail-open: a job whose change failed keeps running at the limit it had.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from common.timeutil import utc
from scheduling.executors.base import Executor, plan_time_of
from scheduling.executors.dispatch_log import dispatch_lock, wall_clock
from warehouse.db import create_tables, reader, table_exists, writer

TABLE = "plan.power_changes"
COLUMNS: dict[str, str] = {
    "plan_id": "VARCHAR NOT NULL",  # the plan that decided the change
    "job_id": "VARCHAR NOT NULL",
    "run_plan_id": "VARCHAR",  # the run's dispatch plan
    "attempt": "INTEGER",
    "cluster": "VARCHAR",
    "executor": "VARCHAR NOT NULL",
    "changed_at": "TIMESTAMPTZ NOT NULL",  # the plan's time
    "from_limit_w": "DOUBLE",
    "to_limit_w": "DOUBLE NOT NULL",
    "time_factor": "DOUBLE",
    "draw_kw": "DOUBLE",  # the job's draw at to_limit_w, PUE included
    "reason": "VARCHAR",
    "quantile": "DOUBLE",
    "work_h": "DOUBLE",
    "work_done_h": "DOUBLE",
    "work_left_h": "DOUBLE",
    "deadline": "TIMESTAMPTZ",
    "projected_end": "TIMESTAMPTZ",
    "projected_end_kept": "TIMESTAMPTZ",
    "kgco2e": "DOUBLE",
    "kgco2e_kept": "DOUBLE",
    "status": "VARCHAR NOT NULL",  # intent | sent | no_run | failed
    "executor_ref": "VARCHAR",
    "error": "VARCHAR",
    "sent_at": "TIMESTAMPTZ",  # processing time of the mark
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS plan;
CREATE TABLE IF NOT EXISTS {TABLE} (
    {", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())},
    PRIMARY KEY (plan_id, job_id)
);
"""
DONE = ("sent", "no_run")


def record_decisions(plan_id: str, changes: pd.DataFrame, executor_of: dict[str, Executor], db_path=None) -> int:
    """Write the plan's power changes (rows of `recap_running` with `changed`) as intents, unless the plan has
    recorded its decisions already; returns the rows written."""
    at = plan_time_of(plan_id)
    if changes is None or changes.empty:
        return 0
    frame = changes.rename(columns={"plan_id": "run_plan_id"}).copy()
    frame["executor"] = [executor_of[c].name for c in frame["cluster"]]
    frame["plan_id"] = plan_id
    frame["changed_at"] = at
    frame["status"] = "intent"
    for name in COLUMNS:
        if name not in frame.columns:
            frame[name] = None
    frame = frame[list(COLUMNS)]
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            if con.execute(f"SELECT count(*) FROM {TABLE} WHERE plan_id = ?", [plan_id]).fetchone()[0]:
                con.execute("ROLLBACK")
                return 0
            con.register("_changes", frame)
            con.execute(f"INSERT INTO {TABLE} BY NAME SELECT * FROM _changes")
            con.unregister("_changes")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return int(len(frame))


def read_changes(plan_id: str | None = None, db_path=None, job_ids=None) -> pd.DataFrame:
    """plan.power_changes rows (of one plan, of some jobs), ordered by plan and job; empty without the table."""
    try:
        with reader(db_path) as con:
            if not table_exists(con, TABLE):
                return pd.DataFrame(columns=list(COLUMNS))
            sql, params = f"SELECT * FROM {TABLE} WHERE true", []
            if plan_id is not None:
                sql += " AND plan_id = ?"
                params.append(plan_id)
            frame = con.execute(sql + " ORDER BY plan_id, job_id", params).df()
    except FileNotFoundError:
        return pd.DataFrame(columns=list(COLUMNS))
    if job_ids is not None:
        frame = frame[frame["job_id"].isin(set(job_ids))].reset_index(drop=True)
    return frame


def apply_power_changes(
    plan_id: str,
    executor: Executor,
    db_path=None,
    *,
    clock: Callable[[], pd.Timestamp] = wall_clock,
    _fault: Callable[[str], None] = lambda stage: None,
) -> dict:
    """Carry out the plan's changes logged for `executor` (see the module doc); `_fault(stage)` is a test hook
    ("called": the executor changed a job's limit, its row not yet marked)."""
    out: dict = {"sent": [], "reconciled": [], "skipped": [], "no_run": [], "failed": {}}
    with dispatch_lock(db_path):
        rows = read_changes(plan_id, db_path)
        rows = rows[rows["executor"] == executor.name]
        for row in rows.to_dict(orient="records"):
            job = str(row["job_id"])
            if row["status"] in DONE:
                out["skipped"].append(job)
                continue
            ref = executor.power_change_ref(plan_id, job)
            if ref is not None:
                _mark(plan_id, job, "sent", ref, None, db_path, clock)
                out["reconciled"].append(job)
                continue
            try:
                ref = executor.set_power_limit(
                    job, float(row["to_limit_w"]), utc(row["changed_at"]), plan_id=plan_id,
                    time_factor=float(row["time_factor"]) if pd.notna(row["time_factor"]) else 1.0,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - fail open: the run keeps its limit; a re-run retries
                _mark(plan_id, job, "failed", None, f"{type(exc).__name__}: {exc}", db_path, clock)
                out["failed"][job] = f"{type(exc).__name__}: {exc}"
                continue
            _fault("called")
            status = "sent" if ref is not None else "no_run"
            _mark(plan_id, job, status, ref, None, db_path, clock)
            out[status].append(job)
    return out


def _mark(plan_id: str, job: str, status: str, ref, error, db_path, clock) -> None:
    with writer(db_path) as con:
        con.execute(
            f"UPDATE {TABLE} SET status = ?, executor_ref = ?, error = ?, sent_at = ? WHERE plan_id = ? AND job_id = ?",
            [status, ref, error, pd.to_datetime(clock(), utc=True).to_pydatetime(), plan_id, job],
        )
