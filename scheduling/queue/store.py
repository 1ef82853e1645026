"""The job queue in the warehouse: `queue.jobs` (one row per (tenant, job_id)), its state history
`queue.job_history`, and the staging table `queue.submissions` that plain SQL may insert into.

    from scheduling.queue import store
    store.set_state("demo/job-00001", "planned", at=plan_time, reason="rolling-lp@2021-07-15T12:00:00Z")
    store.set_states(["demo/a", "demo/b"], "dispatched", at=plan_time)   # one transaction, all or nothing
    store.apply_changes([("demo/a", "running", t1, "started"), ("demo/a", "finished", t2, None)])  # in order
    store.list_jobs(state="queued")                                       # DataFrame
    store.show_job("job-00001", tenant="demo")                           # spec, history, plan decisions
    store.cancel_job("job-00001", tenant="demo", at=now)

States (the system owns them): queued -> planned -> dispatched -> running -> finished | failed | cancelled; a run
stopped at a checkpoint goes running -> preempted -> queued at once, and `queue.checkpoints` keeps the share of the
job done (`record_checkpoints`; the planner's job frame reads it back as `work_done`, `preemptions`).
`ALLOWED_TRANSITIONS` lists every move; anything else raises `InvalidTransition`. A move to the state a job is
already in is a no-op (an hourly re-plan of a planned job writes nothing). A queued or planned job goes straight
to `running` only when an executor started an adopted import itself (its attempt 0). Entering `dispatched` counts
an attempt; a dispatched or running job goes back to `queued` (a retry) only while attempts <= max_retries. Every change
appends a row to `queue.job_history` (seq 1 = the submission). Cancelling a queued or planned job cancels it at
once; a dispatched or running one only gets `cancel_requested_at`: its executor stops it and then confirms with
`set_state(..., "cancelled")` (or reports how it ended).

Writes go through `warehouse.db.writer` in one transaction each; pass `con=` to take part in the caller's
transaction (the operating loop writes its plan and the state changes together). Nothing here reads the wall
clock: every time is given by the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from datetime import datetime

import duckdb
import pandas as pd

from common.timeutil import utc
from scheduling.queue.spec import (
    STATES,
    SYSTEM_COLUMNS,
    TERMINAL_STATES,
    USER_FIELDS,
    JobSpec,
    parse_job,
)
from warehouse.db import create_tables, reader, table_exists, writer

SCHEMA = "queue"
JOBS = "queue.jobs"
HISTORY = "queue.job_history"
SUBMISSIONS = "queue.submissions"
CHECKPOINTS = "queue.checkpoints"  # one row per preempted attempt: the share of the job its checkpoint keeps

# user columns: the DuckDB type in queue.jobs (NOT NULL where the spec always has a value) and in the staging table
USER_COLUMNS: dict[str, str] = {
    "tenant": "VARCHAR NOT NULL",
    "job_id": "VARCHAR NOT NULL",
    "submitted_at": "TIMESTAMPTZ NOT NULL",
    "gpus": "INTEGER NOT NULL",
    "gpu_milli": "INTEGER NOT NULL",
    "gpu_models": "VARCHAR[] NOT NULL",
    "cpu_milli": "BIGINT NOT NULL",
    "memory_mib": "BIGINT NOT NULL",
    "workload_class": "VARCHAR NOT NULL",
    "job_type": "VARCHAR NOT NULL",
    "est_duration_h": "DOUBLE",
    "deadline": "TIMESTAMPTZ",
    "flexibility": "DOUBLE",
    "checkpoint_interval_min": "INTEGER",
    "checkpoint_overhead_min": "DOUBLE",
    "max_preemptions": "INTEGER",
    "home_region": "VARCHAR NOT NULL",
    "input_gb": "DOUBLE NOT NULL",
    "allowed_regions": "VARCHAR[] NOT NULL",
    "priority_class": "VARCHAR NOT NULL",
    "max_retries": "INTEGER NOT NULL",
    "image": "VARCHAR",
    "command": "JSON",
    "script": "VARCHAR",
}
SYSTEM_COLUMN_TYPES: dict[str, str] = {
    "state": "VARCHAR NOT NULL",
    "state_changed_at": "TIMESTAMPTZ NOT NULL",
    "attempts": "INTEGER NOT NULL",
    "flags": "VARCHAR[] NOT NULL",
    "spec_hash": "VARCHAR NOT NULL",
    "created_from": "VARCHAR NOT NULL",
    "cancel_requested_at": "TIMESTAMPTZ",
}
COLUMNS = tuple(USER_COLUMNS) + tuple(SYSTEM_COLUMN_TYPES)
_states = ", ".join(f"'{s}'" for s in STATES)
DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {JOBS} (
    {", ".join(f"{c} {t}" for c, t in {**USER_COLUMNS, **SYSTEM_COLUMN_TYPES}.items())},
    PRIMARY KEY (tenant, job_id),
    CHECK (state IN ({_states}))
);
CREATE TABLE IF NOT EXISTS {HISTORY} (
    tenant VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,
    changed_at TIMESTAMPTZ NOT NULL,
    event VARCHAR NOT NULL,
    from_state VARCHAR,
    to_state VARCHAR NOT NULL,
    reason VARCHAR,
    source VARCHAR,
    PRIMARY KEY (tenant, job_id, seq)
);
CREATE TABLE IF NOT EXISTS {CHECKPOINTS} (
    tenant VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    preempted_at TIMESTAMPTZ NOT NULL,
    work_done DOUBLE NOT NULL,
    plan_id VARCHAR,
    executor VARCHAR,
    PRIMARY KEY (tenant, job_id, attempt)
);
CREATE TABLE IF NOT EXISTS {SUBMISSIONS} (
    {", ".join(f"{c} {t.replace(' NOT NULL', '')}" for c, t in USER_COLUMNS.items())}
);
"""

ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # queued/planned -> running: an adopted import its executor started itself (attempt 0, no dispatch)
    "queued": frozenset({"planned", "dispatched", "running", "cancelled", "failed"}),
    "planned": frozenset({"queued", "dispatched", "running", "cancelled", "failed"}),
    "dispatched": frozenset({"running", "finished", "failed", "cancelled", "queued"}),
    "running": frozenset({"finished", "failed", "cancelled", "queued", "preempted"}),
    # stopped at a checkpoint: queued again at once (`queue.checkpoints` keeps the work done), never a retry
    "preempted": frozenset({"queued", "cancelled", "failed"}),
    **{s: frozenset() for s in TERMINAL_STATES},
}


class InvalidTransition(ValueError):
    """A state change the queue does not allow; the message names the job, both states and what is allowed."""


class UnknownJob(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    """Create the queue tables (idempotent); tables from a queue without the optional spec fields get them."""
    create_tables(con, DDL)
    for table in (JOBS, SUBMISSIONS):
        for name in ADDED_COLUMNS:
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {USER_COLUMNS[name]}")


ADDED_COLUMNS = ("checkpoint_overhead_min", "max_preemptions")  # nullable user columns added to existing queues


def split_id(job: str | tuple[str, str], tenant: str | None = None) -> tuple[str | None, str]:
    """(tenant, job_id) of a planner id `tenant/job_id`, a (tenant, job_id) pair, or a bare job_id (+ tenant)."""
    if isinstance(job, tuple):
        return job
    text = str(job)
    if "/" in text:
        t, j = text.split("/", 1)
        if tenant is not None and tenant != t:
            raise ValueError(f"job {text!r} names tenant {t!r}, not {tenant!r}")
        return t, j
    return tenant, text


# ------------------------------------------------------------------------------------------------ rows <-> specs
def _records(cursor) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def spec_of(row: dict) -> JobSpec:
    """The JobSpec of a stored queue.jobs row (its user columns parsed again, its flags kept)."""
    values = {k: row[k] for k in USER_FIELDS}
    values["command"] = None if row["command"] is None else json.loads(row["command"])
    spec = parse_job(values, where=f"{JOBS} row {row['tenant']}/{row['job_id']}")
    return spec.with_flags(*(row.get("flags") or ()))


def fetch(con: duckdb.DuckDBPyConnection, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """The stored rows of `keys` ((tenant, job_id) pairs) that exist."""
    keys = list(dict.fromkeys(keys))
    if not keys or not table_exists(con, JOBS):
        return {}
    frame = pd.DataFrame(keys, columns=["tenant", "job_id"]).astype(object)
    con.register("_queue_keys", frame)
    try:
        rows = _records(con.execute(f"SELECT j.* FROM {JOBS} j JOIN _queue_keys k USING (tenant, job_id)"))
    finally:
        con.unregister("_queue_keys")
    return {(r["tenant"], r["job_id"]): r for r in rows}


def _history_row(con, tenant, job_id, at, event, from_state, to_state, reason, source) -> None:
    seq = con.execute(
        f"SELECT coalesce(max(seq), 0) + 1 FROM {HISTORY} WHERE tenant = ? AND job_id = ?", [tenant, job_id]
    ).fetchone()[0]
    con.execute(
        f"INSERT INTO {HISTORY} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [tenant, job_id, seq, at, event, from_state, to_state, reason, source],
    )


def insert_job(con, spec: JobSpec, created_from: str) -> None:
    """A new queued job (and its `submitted` history row at submitted_at)."""
    values = spec.user_values()
    system = {
        "state": "queued",
        "state_changed_at": spec.submitted_at,
        "attempts": 0,
        "flags": list(spec.flags),
        "spec_hash": spec.spec_hash(),
        "created_from": created_from,
        "cancel_requested_at": None,
    }
    row = {**values, **system}
    con.execute(
        f"INSERT INTO {JOBS} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})",
        [row[c] for c in COLUMNS],
    )
    _history_row(con, spec.tenant, spec.job_id, spec.submitted_at, "submitted", None, "queued", None, created_from)


def replace_job(con, spec: JobSpec, at: datetime, created_from: str) -> None:
    """Replace the spec of a queued job (the caller checked it is queued); history event `replaced`."""
    values = {**spec.user_values(), "flags": list(spec.flags), "spec_hash": spec.spec_hash()}
    values.update(created_from=created_from, state_changed_at=at)
    cols = [c for c in values if c not in ("tenant", "job_id")]
    con.execute(
        f"UPDATE {JOBS} SET {', '.join(f'{c} = ?' for c in cols)} WHERE tenant = ? AND job_id = ?",
        [values[c] for c in cols] + [spec.tenant, spec.job_id],
    )
    _history_row(con, spec.tenant, spec.job_id, at, "replaced", "queued", "queued", None, created_from)


# ------------------------------------------------------------------------------------------------ state changes
def _moved(row: dict, state: str) -> int | None:
    """The job's attempts after moving `row` to `state`, or None when it is in `state` already (a no-op);
    InvalidTransition when the queue does not allow the move."""
    key = f"{row['tenant']}/{row['job_id']}"
    current = row["state"]
    if state not in STATES:
        raise InvalidTransition(f"job {key}: unknown state {state!r}; states: {', '.join(STATES)}")
    if state == current:
        return None
    allowed = ALLOWED_TRANSITIONS[current]
    if state not in allowed:
        can = ", ".join(sorted(allowed)) or "none (final state)"
        raise InvalidTransition(f"job {key}: cannot go from {current} to {state} (allowed: {can})")
    attempts = int(row["attempts"])
    if state == "queued" and current in ("dispatched", "running") and attempts > int(row["max_retries"]):
        raise InvalidTransition(
            f"job {key}: no retry left (attempts {attempts}, max_retries {row['max_retries']}); set it failed"
        )
    return attempts + 1 if state == "dispatched" else attempts


def _transition(con, row: dict, state: str, at, reason: str | None, source: str | None) -> bool:
    attempts = _moved(row, state)
    if attempts is None:
        return False
    con.execute(
        f"UPDATE {JOBS} SET state = ?, state_changed_at = ?, attempts = ? WHERE tenant = ? AND job_id = ?",
        [state, at, attempts, row["tenant"], row["job_id"]],
    )
    _history_row(con, row["tenant"], row["job_id"], at, "state", row["state"], state, reason, source)
    return True


def _writing(con, db_path):
    """The caller's connection as is (the caller owns it and its transaction), or a new writer."""
    return contextlib.nullcontext(con) if con is not None else writer(db_path)


def _next_seqs(con, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The next history seq of each of `keys`."""
    frame = pd.DataFrame(list(dict.fromkeys(keys)), columns=["tenant", "job_id"]).astype(object)
    con.register("_queue_keys", frame)
    try:
        rows = con.execute(
            f"SELECT h.tenant, h.job_id, max(h.seq) FROM {HISTORY} h JOIN _queue_keys k USING (tenant, job_id) "
            "GROUP BY h.tenant, h.job_id"
        ).fetchall()
    finally:
        con.unregister("_queue_keys")
    return {(t, j): int(m) + 1 for t, j, m in rows}


def apply_changes(
    changes: Iterable[tuple[str | tuple[str, str], str, object, str | None]],
    *,
    source: str | None = None,
    db_path=None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> list[str]:
    """Apply state changes `(job, state, at, reason)` in their order, all or nothing: each is checked as
    `set_states` checks it (a job already in the state is left as is) and gets its history row, and the whole lot
    is written with a handful of statements (the hourly sync applies an executor's window of events at once).
    Returns the planner ids of the changes made, in order. With `con`, runs inside the caller's transaction."""
    changes = [(split_id(job), state, utc(at).to_pydatetime(), reason) for job, state, at, reason in changes]
    missing_tenant = [j for (t, j), *_ in changes if t is None]
    if missing_tenant:
        raise ValueError(f"job ids need their tenant (tenant/job_id): {missing_tenant[:5]}")
    made: list[str] = []
    if not changes:
        return made
    with _writing(con, db_path) as c:
        ensure(c)
        own = con is None
        if own:
            c.execute("BEGIN TRANSACTION")
        try:
            keys = [key for key, *_ in changes]
            rows = fetch(c, keys)
            history = []
            for key, state, at, reason in changes:
                if key not in rows:
                    raise UnknownJob(f"no job {key[0]}/{key[1]} in {JOBS}")
                row = rows[key]
                attempts = _moved(row, state)
                if attempts is None:
                    continue
                history.append((key, at, row["state"], state, reason))
                rows[key] = {**row, "state": state, "state_changed_at": at, "attempts": attempts}
                made.append(f"{key[0]}/{key[1]}")
            if history:
                _write_changes(c, history, rows, source)
            if own:
                c.execute("COMMIT")
        except BaseException:
            if own:
                c.execute("ROLLBACK")
            raise
    return made


def _write_changes(con, history: list[tuple], rows: dict, source: str | None) -> None:
    """The final state of every changed job (one UPDATE) and a history row per change (one INSERT)."""
    changed = list(dict.fromkeys(key for key, *_ in history))
    seqs = _next_seqs(con, changed)
    records = []
    for (tenant, job_id), at, from_state, to_state, reason in history:
        seq = seqs.get((tenant, job_id), 1)
        seqs[(tenant, job_id)] = seq + 1
        records.append((tenant, job_id, seq, at, "state", from_state, to_state, reason, source))
    final = pd.DataFrame(
        [(t, j, rows[(t, j)]["state"], rows[(t, j)]["state_changed_at"], rows[(t, j)]["attempts"]) for t, j in changed],
        columns=["tenant", "job_id", "state", "changed_at", "attempts"],
    )
    log = pd.DataFrame(
        records,
        columns=["tenant", "job_id", "seq", "changed_at", "event", "from_state", "to_state", "reason", "source"],
    )
    con.register("_queue_final", final)
    con.register("_queue_log", log)
    try:
        con.execute(
            f"UPDATE {JOBS} SET state = f.state, state_changed_at = CAST(f.changed_at AS TIMESTAMPTZ), "
            "attempts = CAST(f.attempts AS INTEGER) FROM _queue_final AS f "
            f"WHERE {JOBS}.tenant = f.tenant AND {JOBS}.job_id = f.job_id"
        )
        con.execute(
            f"INSERT INTO {HISTORY} SELECT tenant, job_id, CAST(seq AS INTEGER), CAST(changed_at AS TIMESTAMPTZ), "
            "event, CAST(from_state AS VARCHAR), to_state, CAST(reason AS VARCHAR), CAST(source AS VARCHAR) "
            "FROM _queue_log ORDER BY tenant, job_id, seq"
        )
    finally:
        con.unregister("_queue_final")
        con.unregister("_queue_log")


def set_states(
    jobs: Iterable[str | tuple[str, str]],
    state: str,
    *,
    at,
    reason: str | None = None,
    source: str | None = None,
    db_path=None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> list[str]:
    """Move every job of `jobs` (planner ids `tenant/job_id` or (tenant, job_id)) to `state` at time `at`, all or
    nothing: an unknown job or a transition `ALLOWED_TRANSITIONS` does not list raises before anything is kept.
    Returns the planner ids that changed (a job already in `state` is left as is). With `con`, runs inside the
    caller's transaction; else in one of its own."""
    return apply_changes([(job, state, at, reason) for job in jobs], source=source, db_path=db_path, con=con)


def set_state(job: str | tuple[str, str], state: str, *, at, reason=None, source=None, db_path=None, con=None) -> bool:
    """`set_states` for one job; True when its state changed."""
    return bool(set_states([job], state, at=at, reason=reason, source=source, db_path=db_path, con=con))


def cancel_job(job: str, tenant: str | None = None, *, at, source: str = "cli", db_path=None) -> dict:
    """Cancel a job: queued or planned -> cancelled now; dispatched or running -> `cancel_requested_at` set (the
    executor stops it and confirms); a finished, failed or cancelled job raises InvalidTransition. Returns
    {job, state, cancel_requested_at, changed}."""
    at = utc(at).to_pydatetime()
    with writer(db_path) as con:
        ensure(con)
        con.execute("BEGIN TRANSACTION")
        try:
            row = _one(con, job, tenant)
            key = f"{row['tenant']}/{row['job_id']}"
            state, requested, changed = row["state"], row["cancel_requested_at"], False
            if state in ("queued", "planned"):
                changed = _transition(con, row, "cancelled", at, "cancelled by the operator", source)
                state = "cancelled"
            elif state in ("dispatched", "running"):
                if requested is None:
                    con.execute(
                        f"UPDATE {JOBS} SET cancel_requested_at = ? WHERE tenant = ? AND job_id = ?",
                        [at, row["tenant"], row["job_id"]],
                    )
                    _history_row(con, row["tenant"], row["job_id"], at, "cancel_requested", state, state, None, source)
                    requested, changed = at, True
            else:
                raise InvalidTransition(f"job {key} is {state}: nothing to cancel")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return {"job": key, "state": state, "cancel_requested_at": requested, "changed": changed}


# ------------------------------------------------------------------------------------------------ reading
def _one(con, job: str, tenant: str | None) -> dict:
    t, j = split_id(job, tenant)
    if not table_exists(con, JOBS):
        raise UnknownJob(f"no job {job!r}: the queue is empty")
    if t is None:
        rows = _records(con.execute(f"SELECT * FROM {JOBS} WHERE job_id = ? ORDER BY tenant", [j]))
        if len(rows) > 1:
            tenants = ", ".join(r["tenant"] for r in rows)
            raise ValueError(f"job id {j!r} exists for several tenants ({tenants}); name the tenant")
    else:
        rows = _records(con.execute(f"SELECT * FROM {JOBS} WHERE tenant = ? AND job_id = ?", [t, j]))
    if not rows:
        raise UnknownJob(f"no job {job!r}" + (f" of tenant {t!r}" if t else "") + f" in {JOBS}")
    return rows[0]


def list_jobs(state: str | None = None, tenant: str | None = None, db_path=None) -> pd.DataFrame:
    """queue.jobs (optionally of one state / tenant), oldest submission first; empty when there is no queue."""
    if state is not None and state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    where, params = [], []
    if state:
        where.append("state = ?")
        params.append(state)
    if tenant:
        where.append("tenant = ?")
        params.append(tenant)
    sql = f"SELECT * FROM {JOBS}" + (f" WHERE {' AND '.join(where)}" if where else "")
    sql += " ORDER BY submitted_at, tenant, job_id"
    try:
        with reader(db_path) as con:
            if not table_exists(con, JOBS):
                return pd.DataFrame(columns=list(COLUMNS))
            return pd.DataFrame(_records(con.execute(sql, params)), columns=list(COLUMNS))
    except FileNotFoundError:
        return pd.DataFrame(columns=list(COLUMNS))


def load_specs(
    states: Iterable[str], as_of=None, db_path=None, *, since=None, or_ids: Iterable[str] = ()
) -> list[tuple[JobSpec, dict]]:
    """(spec, stored row with `work_done` and `preemptions` from its checkpoints) of every job in `states`,
    submitted at or before `as_of` when given, and at or after
    `since` when given unless its planner id is one of `or_ids`; a stored row that no longer parses raises
    JobSpecError naming it (the intake never stores one). `since` keeps an hourly caller from parsing every job
    the queue ever finished."""
    states = list(states)
    bad = [s for s in states if s not in STATES]
    if bad:
        raise ValueError(f"unknown state(s) {bad}; states: {', '.join(STATES)}")
    where = f"state IN ({', '.join('?' for _ in states)})"
    params: list = list(states)
    if as_of is not None:
        where += " AND submitted_at <= ?"
        params.append(utc(as_of).to_pydatetime())
    if since is not None:
        ids = sorted(set(or_ids))
        named = f" OR tenant || '/' || job_id IN ({', '.join('?' for _ in ids)})" if ids else ""
        where += f" AND (submitted_at >= ?{named})"
        params += [utc(since).to_pydatetime(), *ids]
    try:
        with reader(db_path) as con:
            if not table_exists(con, JOBS):
                return []
            rows = _records(con.execute(f"{_with_checkpoints(con)} WHERE {where} "
                                        "ORDER BY submitted_at, tenant, job_id", params))  # fmt: skip
    except FileNotFoundError:
        return []
    return [(spec_of(r), r) for r in rows]


def show_job(job: str, tenant: str | None = None, db_path=None) -> dict:
    """Everything about one job: `spec` (user columns), `system` (state, attempts, flags, ...), `history` (its
    queue.job_history rows), and its plan decisions under planner id `tenant/job_id`: `assignments`,
    `unplaced` and `explanations` (record and text) of every stored plan."""
    with reader(db_path) as con:
        return job_document(con, job, tenant)


def job_document(con, job: str, tenant: str | None = None) -> dict:
    """`show_job` on an open connection; the job and tenant are query parameters, never SQL text."""
    row = _one(con, job, tenant)
    key = f"{row['tenant']}/{row['job_id']}"
    history = _records(
        con.execute(
            f"SELECT seq, changed_at, event, from_state, to_state, reason, source FROM {HISTORY} "
            "WHERE tenant = ? AND job_id = ? ORDER BY seq",
            [row["tenant"], row["job_id"]],
        )
    )
    decisions = {}
    for table in ("assignments", "unplaced", "explanations"):
        if not table_exists(con, f"plan.{table}"):
            decisions[table] = []
            continue
        decisions[table] = _records(con.execute(f"SELECT * FROM plan.{table} WHERE job_id = ? ORDER BY plan_id", [key]))
    spec = {k: row[k] for k in USER_FIELDS}
    spec["command"] = None if row["command"] is None else json.loads(row["command"])
    for rec in decisions["explanations"]:
        if isinstance(rec.get("record"), str):
            rec["record"] = json.loads(rec["record"])
    return {
        "job": key,
        "spec": spec,
        "system": {k: row[k] for k in SYSTEM_COLUMNS},
        "history": history,
        **decisions,
    }


# ------------------------------------------------------------------------------------------------ staging
def _with_checkpoints(con) -> str:
    """SELECT of queue.jobs rows with `work_done` (the share the latest checkpoint keeps, 0 without one) and
    `preemptions` (the checkpoints so far)."""
    if not table_exists(con, CHECKPOINTS):  # a warehouse no run was preempted in yet
        return f"SELECT *, 0.0 AS work_done, 0 AS preemptions FROM {JOBS}"
    return (
        f"SELECT j.*, coalesce(c.work_done, 0.0) AS work_done, coalesce(c.preemptions, 0) AS preemptions "
        f"FROM {JOBS} AS j LEFT JOIN (SELECT tenant, job_id, arg_max(work_done, preempted_at) AS work_done, "
        f"count(*) AS preemptions FROM {CHECKPOINTS} GROUP BY tenant, job_id) AS c USING (tenant, job_id)"
    )


def checkpoint_shares(con, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, int]]:
    """(tenant, job_id) -> (the share of the job its latest checkpoint keeps, its checkpoints so far), for the
    jobs of `keys` that have one."""
    keys = list(dict.fromkeys(keys))
    if not keys or not table_exists(con, CHECKPOINTS):
        return {}
    con.register("_checkpoint_keys", pd.DataFrame(keys, columns=["tenant", "job_id"]).astype(object))
    try:
        rows = con.execute(
            f"SELECT c.tenant, c.job_id, arg_max(c.work_done, c.preempted_at), count(*) FROM {CHECKPOINTS} AS c "
            "JOIN _checkpoint_keys USING (tenant, job_id) GROUP BY c.tenant, c.job_id"
        ).fetchall()
    finally:
        con.unregister("_checkpoint_keys")
    return {(t, j): (float(w), int(n)) for t, j, w, n in rows}


def record_checkpoints(con, rows: list[tuple]) -> None:
    """Checkpoints of preempted attempts, (tenant, job_id, attempt, preempted_at, work_done, plan_id, executor)
    each; an attempt recorded already keeps its row (a re-run of the hour writes nothing new)."""
    if not rows:
        return
    ensure(con)
    frame = pd.DataFrame(
        rows, columns=["tenant", "job_id", "attempt", "preempted_at", "work_done", "plan_id", "executor"]
    )
    con.register("_checkpoints", frame)
    try:
        con.execute(f"INSERT OR IGNORE INTO {CHECKPOINTS} SELECT * FROM _checkpoints")
    finally:
        con.unregister("_checkpoints")


def read_submissions(con) -> list[tuple[int, dict]]:
    """(rowid, user values) of every queue.submissions row, in insertion order; `command` decoded from JSON."""
    if not table_exists(con, SUBMISSIONS):
        return []
    rows = _records(con.execute(f"SELECT rowid AS _rowid, * FROM {SUBMISSIONS} ORDER BY rowid"))
    out = []
    for r in rows:
        rowid = int(r.pop("_rowid"))
        if r.get("command") is not None:
            r["command"] = json.loads(r["command"])
        out.append((rowid, {k: v for k, v in r.items() if v is not None}))
    return out


def delete_submissions(con, rowids: list[int]) -> None:
    if rowids:
        con.execute(f"DELETE FROM {SUBMISSIONS} WHERE rowid IN ({', '.join(str(int(r)) for r in rowids)})")


# ------------------------------------------------------------------------------------------------ digests
def table_digest(db_path=None) -> dict[str, str]:
    """SHA-256 per queue table and of the queue's quarantined rows, over the rows in a canonical order (re-running an
    intake must leave these unchanged)."""
    out = {}
    with reader(db_path) as con:
        for table, where in (
            (JOBS, ""),
            (HISTORY, ""),
            (SUBMISSIONS, ""),
            ("quarantine.rejected_rows", f" WHERE table_name = '{JOBS}'"),
        ):
            if not table_exists(con, table):
                continue
            frame = con.execute(f"SELECT * FROM {table}{where}").df()
            frame = frame.astype(str).sort_values(list(frame.columns), kind="mergesort").reset_index(drop=True)
            out[table] = hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()
    return out
