"""Exactly-once actions on running jobs, one log table per kind (`power_log`: power limits, `preempt_log`:
preemptions), keyed by (plan_id, job_id): the plan that decided the action and the job.

The plan's decisions are written once, as ``intent`` rows, before any executor is called; a re-run of the hour
keeps them (an hour decides once). Carrying them out, under the dispatcher lock of `dispatch_log`: a row not yet
``sent`` is first looked up at the executor (the action may have reached it before a crash), then sent with the
plan id as its idempotency key; it ends ``sent`` with the executor's ref, ``no_run`` when the job no longer runs,
or ``failed`` with the error (retried by a re-run). A run killed anywhere leaves rows at ``intent`` or ``sent``, so
no action is taken twice. Fail-open: a job whose action failed runs on as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from scheduling.executors.base import Executor, plan_time_of
from scheduling.executors.dispatch_log import dispatch_lock, wall_clock
from warehouse.db import create_tables, reader, table_exists, writer

DONE = ("sent", "no_run")
STATUS_COLUMNS: dict[str, str] = {
    "status": "VARCHAR NOT NULL",  # intent | sent | no_run | failed
    "executor_ref": "VARCHAR",
    "error": "VARCHAR",
    "sent_at": "TIMESTAMPTZ",  # processing time of the mark
}


@dataclass(frozen=True)
class ActionLog:
    """One kind of action: its table, its columns (the decision's, then STATUS_COLUMNS), the column holding the
    plan's time, and the executor calls that look an action up and send it."""

    table: str
    columns: dict[str, str]
    time_column: str
    lookup: Callable[[Executor, str, str], str | None]  # (executor, plan_id, job_id) -> ref
    send: Callable[[Executor, dict], str | None]  # (executor, row) -> ref, None when the job has no live run

    @property
    def ddl(self) -> str:
        schema = self.table.split(".")[0]
        return f"""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {self.table} (
    {", ".join(f"{name} {kind}" for name, kind in self.columns.items())},
    PRIMARY KEY (plan_id, job_id)
);
"""

    def record(self, plan_id: str, decisions: pd.DataFrame, executor_of: dict[str, Executor], db_path=None) -> int:
        """Write the plan's decisions (one row per job, with its `cluster`; `plan_id`: the run's, its dispatch
        plan) as intents, unless the plan has recorded its decisions already; returns the rows written."""
        if decisions is None or decisions.empty:
            return 0
        frame = decisions.rename(columns={"plan_id": "run_plan_id"})
        frame["executor"] = [executor_of[c].name for c in frame["cluster"]]
        frame["plan_id"] = plan_id
        frame[self.time_column] = plan_time_of(plan_id)
        frame["status"] = "intent"
        for name in self.columns:
            if name not in frame.columns:
                frame[name] = None
        frame = frame[list(self.columns)]
        with writer(db_path) as con:
            create_tables(con, self.ddl)
            con.execute("BEGIN TRANSACTION")
            try:
                if con.execute(f"SELECT count(*) FROM {self.table} WHERE plan_id = ?", [plan_id]).fetchone()[0]:
                    con.execute("ROLLBACK")
                    return 0
                con.register("_decisions", frame)
                con.execute(f"INSERT INTO {self.table} BY NAME SELECT * FROM _decisions")
                con.unregister("_decisions")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return int(len(frame))

    def read(self, plan_id: str | None = None, db_path=None, job_ids=None) -> pd.DataFrame:
        """The log's rows (of one plan, of some jobs), ordered by plan and job; empty without the table."""
        try:
            with reader(db_path) as con:
                if not table_exists(con, self.table):
                    return pd.DataFrame(columns=list(self.columns))
                sql, params = f"SELECT * FROM {self.table} WHERE true", []
                if plan_id is not None:
                    sql += " AND plan_id = ?"
                    params.append(plan_id)
                frame = con.execute(sql + " ORDER BY plan_id, job_id", params).df()
        except FileNotFoundError:
            return pd.DataFrame(columns=list(self.columns))
        if job_ids is not None:
            frame = frame[frame["job_id"].isin(set(job_ids))].reset_index(drop=True)
        return frame

    def carry_out(
        self,
        plan_id: str,
        executor: Executor,
        db_path=None,
        *,
        clock: Callable[[], pd.Timestamp] = wall_clock,
        _fault: Callable[[str], None] = lambda stage: None,
    ) -> dict:
        """Carry out the plan's actions logged for `executor` (see the module doc); `_fault(stage)` is a test hook
        ("called": the executor took an action, its row not yet marked)."""
        out: dict = {"sent": [], "reconciled": [], "skipped": [], "no_run": [], "failed": {}}
        with dispatch_lock(db_path):
            rows = self.read(plan_id, db_path)
            rows = rows[rows["executor"] == executor.name]
            for row in rows.to_dict(orient="records"):
                job = str(row["job_id"])
                if row["status"] in DONE:
                    out["skipped"].append(job)
                    continue
                ref = self.lookup(executor, plan_id, job)
                if ref is not None:
                    self._mark(plan_id, job, "sent", ref, None, db_path, clock)
                    out["reconciled"].append(job)
                    continue
                try:
                    ref = self.send(executor, row)
                except Exception as exc:  # noqa: BLE001 - fail open: the run goes on as it was; a re-run retries
                    self._mark(plan_id, job, "failed", None, f"{type(exc).__name__}: {exc}", db_path, clock)
                    out["failed"][job] = f"{type(exc).__name__}: {exc}"
                    continue
                _fault("called")
                status = "sent" if ref is not None else "no_run"
                self._mark(plan_id, job, status, ref, None, db_path, clock)
                out[status].append(job)
        return out

    def _mark(self, plan_id: str, job: str, status: str, ref, error, db_path, clock) -> None:
        with writer(db_path) as con:
            con.execute(
                f"UPDATE {self.table} SET status = ?, executor_ref = ?, error = ?, sent_at = ? "
                "WHERE plan_id = ? AND job_id = ?",
                [status, ref, error, pd.to_datetime(clock(), utc=True).to_pydatetime(), plan_id, job],
            )
