"""Exactly-once dispatch: the dispatch log `plan.dispatch_log`, keyed by (plan_id, job_id).

    result = dispatch(plan_id, items, executor)     # -> DispatchResult(sent, reconciled, skipped, failed)

Each job goes ``intent`` -> ``sent`` (with the executor's reference), or ``failed`` with the error:

1. One short transaction reads the plan's log rows and writes an ``intent`` row for every item not yet logged.
2. Rows left at ``intent`` (or ``failed``) by an earlier run are reconciled with ``executor.lookup``: a submission
   that reached the executor is marked ``sent``; one that did not is submitted now. A job already ``sent`` for this
   plan_id is skipped.
3. The remaining jobs go to ``executor.dispatch`` in chunks of `batch_size`; after each call one short transaction
   marks the chunk ``sent`` (or ``failed`` with the error).

Why this is exactly-once: a job is submitted only after its ``intent`` row is committed, and only when the log
holds no ``sent`` row and the executor's `lookup` finds no submission under the same key. A run killed anywhere
leaves each job at ``intent`` (the next run asks the executor) or ``sent`` (skipped): never two submissions of one
(plan_id, job_id), and no item without a log row. Two dispatchers racing on one log would both see an ``intent``
and both ask `lookup` before either had submitted, so one process at a time dispatches: an exclusive lock file
beside the warehouse (``<warehouse>.dispatch.lock``), held for the whole call and released by the kernel when a
process dies.

The warehouse writer is held only for those short transactions, never while an executor is called: a slow
executor does not block other warehouse writers, and `replay`, which writes the warehouse itself, needs the writer
free (a second writer in the same process would wait on its own lock).

Fail-open: the log is not needed for a dispatched job to start. Once ``sent``, the job is the executor's: it starts
at its planned time even if the planner never runs again (see replay.py and files.py).

`intent_at` and `sent_at` are processing times (wall clock, or `clock`): when this process wrote the row. The
dispatch's time on the executor's clock is its plan's time.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scheduling.executors.base import RECORD_COLUMNS, Executor, plan_time_of
from scheduling.executors.items import check_items
from warehouse.config import warehouse_path
from warehouse.db import LOCK_TIMEOUT_S, create_tables, reader, table_exists, writer

TABLE = "plan.dispatch_log"
STATUSES = ("intent", "sent", "failed")
DDL = """
CREATE SCHEMA IF NOT EXISTS plan;
CREATE TABLE IF NOT EXISTS plan.dispatch_log (
    plan_id VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    executor VARCHAR NOT NULL,
    cluster VARCHAR,
    status VARCHAR NOT NULL,
    executor_ref VARCHAR,
    attempt INTEGER,
    intent_at TIMESTAMPTZ NOT NULL,
    sent_at TIMESTAMPTZ,
    error VARCHAR,
    PRIMARY KEY (plan_id, job_id)
);
"""
LOG_COLUMNS = ("plan_id", "job_id", "executor", "cluster", "status", "executor_ref", "attempt", "intent_at", "sent_at")
# jobs marked sent per transaction: each mark opens the warehouse writer (~70 ms on a 100 MB file); a run killed
# mid-chunk leaves at most this many jobs for `lookup` to reconcile
DEFAULT_BATCH_SIZE = 200


class DispatchError(RuntimeError):
    """Some jobs could not be dispatched (their rows are `failed` with the error; a re-run retries them)."""

    def __init__(self, result: DispatchResult):
        self.result = result
        shown = ", ".join(f"{job}: {err}" for job, err in list(result.failed.items())[:5])
        more = f" (and {len(result.failed) - 5} more)" if len(result.failed) > 5 else ""
        super().__init__(
            f"plan {result.plan_id}: {len(result.failed)} job(s) not dispatched to {result.executor}: {shown}{more}"
        )


@dataclass
class DispatchResult:
    plan_id: str
    executor: str
    sent: list[str] = field(default_factory=list)  # submitted by this call
    reconciled: list[str] = field(default_factory=list)  # an earlier run's intent found at the executor
    skipped: list[str] = field(default_factory=list)  # already sent
    failed: dict[str, str] = field(default_factory=dict)  # job -> error

    def as_dict(self) -> dict:
        return {
            "plan_id": self.plan_id,
            "executor": self.executor,
            "sent": list(self.sent),
            "reconciled": list(self.reconciled),
            "skipped": list(self.skipped),
            "failed": dict(self.failed),
        }


def _noop(stage: str) -> None:
    return None


def wall_clock() -> pd.Timestamp:
    """Processing time of a log row (the audit columns; never a plan's time)."""
    return pd.Timestamp.now(tz="UTC")


def lock_path(db_path=None) -> Path:
    db = Path(db_path) if db_path else warehouse_path()
    return db.with_name(db.name + ".dispatch.lock")


@contextlib.contextmanager
def dispatch_lock(db_path=None, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """One dispatcher at a time per warehouse (an exclusive flock; the kernel releases it when a process dies)."""
    path = lock_path(db_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another dispatcher holds {path} for more than {timeout_s:.0f} s; dispatch not started"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def dispatch(
    plan_id: str,
    items: pd.DataFrame,
    executor: Executor,
    db_path=None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    clock: Callable[[], pd.Timestamp] = wall_clock,
    _fault: Callable[[str], None] = _noop,
) -> DispatchResult:
    """Dispatch `items` of `plan_id` to `executor` exactly once (see the module doc); raises DispatchError after
    processing every job when some failed. `_fault(stage)` is a test hook: "intent" (intent rows committed),
    "reconciled" (earlier intents settled), then per chunk "called" (executor returned, chunk not yet marked) and
    "marked" (chunk marked sent/failed)."""
    plan_time_of(plan_id)  # a real plan's key (a dry run is refused)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    items = check_items(items).set_index("job_id", drop=False)
    result = DispatchResult(plan_id=plan_id, executor=executor.name)
    with dispatch_lock(db_path):
        logged = _log_intents(plan_id, items, executor, db_path, clock)
        _fault("intent")
        to_send = [job for job in items.index if job not in logged]
        settled: list[dict] = []
        for job, row in sorted(logged.items()):
            if row["status"] == "sent":
                result.skipped.append(job)
                continue
            ref = executor.lookup(plan_id, job)
            if ref is not None:
                settled.append({"job_id": job, "status": "sent", "executor_ref": str(ref), "error": None})
                result.reconciled.append(job)
            elif job in items.index:
                to_send.append(job)
            else:
                error = "not among this dispatch's items and never reached the executor"
                settled.append({"job_id": job, "status": "failed", "executor_ref": None, "error": error})
                result.failed[job] = error
        _mark(plan_id, settled, db_path, clock)
        _fault("reconciled")
        to_send.sort()
        for start in range(0, len(to_send), batch_size):
            chunk = items.loc[to_send[start : start + batch_size]].reset_index(drop=True)
            marks = _submit(plan_id, chunk, executor)
            _fault("called")
            _mark(plan_id, marks, db_path, clock)
            for mark in marks:
                if mark["status"] == "sent":
                    result.sent.append(mark["job_id"])
                else:
                    result.failed[mark["job_id"]] = mark["error"]
            _fault("marked")
    if result.failed:
        raise DispatchError(result)
    return result


def _log_intents(plan_id: str, items: pd.DataFrame, executor: Executor, db_path, clock) -> dict[str, dict]:
    """In one transaction: the plan's existing log rows of this executor (job -> row), and an intent row for every
    new item; ValueError when an item is logged for another executor."""
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute(
                "SELECT job_id, executor, status FROM plan.dispatch_log WHERE plan_id = ?", [plan_id]
            ).fetchall()
            logged = {job: {"executor": ex, "status": status} for job, ex, status in rows}
            wanted = set(items["job_id"].astype(str))
            for job, row in logged.items():
                if job in wanted and row["executor"] != executor.name:
                    raise ValueError(
                        f"plan {plan_id}: job {job!r} is logged for executor {row['executor']!r}, not "
                        f"{executor.name!r}; a job is dispatched by one executor only"
                    )
            new = items[~items["job_id"].isin(list(logged))]
            if len(new):
                new = new.reset_index(drop=True)
                frame = pd.DataFrame(
                    {
                        "plan_id": plan_id,
                        "job_id": new["job_id"].astype(str),
                        "executor": executor.name,
                        "cluster": new["cluster"].astype(str),
                        "status": "intent",
                        "attempt": new["attempt"].astype("Int64"),
                        "intent_at": pd.to_datetime(clock(), utc=True),
                    }
                )
                con.register("_intents", frame)
                con.execute("INSERT INTO plan.dispatch_log BY NAME SELECT * FROM _intents")
                con.unregister("_intents")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    # the plan's other executors' rows are theirs to settle
    return {job: row for job, row in logged.items() if row["executor"] == executor.name}


def _submit(plan_id: str, chunk: pd.DataFrame, executor: Executor) -> list[dict]:
    """Call the executor for one chunk; one mark per job (sent with its ref, or failed with the error)."""
    jobs = list(chunk["job_id"])
    try:
        records = executor.dispatch(plan_id, chunk)
    except Exception as exc:  # the whole chunk failed; a re-run asks lookup before trying again
        error = f"{type(exc).__name__}: {exc}"
        return [{"job_id": job, "status": "failed", "executor_ref": None, "error": error} for job in jobs]
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise TypeError(f"executor {executor.name!r}: dispatch records lack columns {missing}")
    by_job = {str(r["job_id"]): r for r in records.to_dict(orient="records")}
    marks = []
    for job in jobs:
        record = by_job.get(job)
        if record is None:
            marks.append({"job_id": job, "status": "failed", "executor_ref": None, "error": "no record returned"})
        elif isinstance(record["error"], str) and record["error"]:
            marks.append({"job_id": job, "status": "failed", "executor_ref": None, "error": record["error"]})
        elif record["executor_ref"] is None or pd.isna(record["executor_ref"]):
            marks.append({"job_id": job, "status": "failed", "executor_ref": None, "error": "no executor_ref"})
        else:
            marks.append({"job_id": job, "status": "sent", "executor_ref": str(record["executor_ref"]), "error": None})
    return marks


def _mark(plan_id: str, marks: list[dict], db_path, clock) -> None:
    """Set status/executor_ref/error (and sent_at for sent rows) of the given jobs, in one transaction."""
    if not marks:
        return
    frame = pd.DataFrame(marks, columns=["job_id", "status", "executor_ref", "error"]).astype(object)
    frame["stamp"] = pd.to_datetime(clock(), utc=True)
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            con.register("_marks", frame)
            con.execute(
                "UPDATE plan.dispatch_log AS d SET status = m.status, executor_ref = m.executor_ref, "
                "error = m.error, sent_at = CASE WHEN m.status = 'sent' THEN m.stamp ELSE d.sent_at END "
                "FROM _marks AS m WHERE d.plan_id = ? AND d.job_id = m.job_id",
                [plan_id],
            )
            con.unregister("_marks")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


def read_log(plan_id: str | None = None, db_path=None) -> pd.DataFrame:
    """plan.dispatch_log rows (of one plan), ordered by plan and job; empty when there is no log yet."""
    columns = [*LOG_COLUMNS, "error"]
    try:
        with reader(db_path) as con:
            if not table_exists(con, TABLE):
                return pd.DataFrame(columns=columns)
            sql = f"SELECT {', '.join(columns)} FROM {TABLE}"
            params: list = []
            if plan_id is not None:
                sql += " WHERE plan_id = ?"
                params.append(plan_id)
            return con.execute(sql + " ORDER BY plan_id, job_id", params).df()
    except FileNotFoundError:
        return pd.DataFrame(columns=columns)
