"""The plan store: a `Plan` (docs/data-contracts.md, "Planning") in the warehouse's `plan.*` tables.

    from scheduling.output.plan_store import write_plan, latest_plan, read_plan, plan_id_for

    plan_id = write_plan(plan, schedule_dir="var/schedules/2021-07-15T12-00Z", created_from="cli")
    plan = latest_plan(policy="priority")          # newest plan_time (optionally at or before `as_of`)
    plan = read_plan("priority@2021-07-15T12:00:00Z")

Tables (created on first write):

* `plan.plans(plan_id, plan_time, policy, created_from, forecast_version, n_jobs, n_assigned, expected_kgco2e,
  schedule_dir)`: one row per plan.
* `plan.assignments(plan_id, job_id, cluster, region, node, gpu_devices, gpu_milli, gpu_count, start_time, end_time,
  power_limit_w, expected_energy_kwh, expected_kgco2e, priority)`: the contract columns; further columns the planner
  puts in its assignments frame (gpu_model, cpu_milli, deadline, ...) are added to the table as they appear (never
  dropped), as `warehouse.db.load_batch` does for raw tables.
* `plan.explanations(plan_id, job_id, record JSON, text)`: the explanation record of every decision and its card
  text (from `scheduling.explain`).
* `plan.unplaced(plan_id, job_id, reason)`: jobs the plan could not place (not in the contract's list of tables;
  an addition, so that `n_jobs - n_assigned` can be looked up).

`plan_id` = policy + "@" + plan time (ISO, UTC, `Z`), e.g. ``priority@2021-07-15T12:00:00Z``; a dry run writes
its explanations under ``priority@2021-07-15T12:00:00Z#dry-run``. Every write goes
through `warehouse.db.writer` in ONE transaction that first deletes the plan_id's rows, so writing the same plan
again leaves the warehouse identical; a failure or kill before COMMIT leaves the previous rows untouched.
Nothing written depends on the wall clock.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from common.jsonutil import canonical_json, to_jsonable
from common.timeutil import iso_z, utc
from scheduling.domain.plan import Plan
from scheduling.explain.template import TemplateExplainer
from warehouse.db import create_tables, reader, table_exists, writer

SCHEMA = "plan"
ASSIGNMENT_COLUMNS: dict[str, str] = {
    "job_id": "VARCHAR",
    "cluster": "VARCHAR",
    "region": "VARCHAR",
    "node": "VARCHAR",
    "gpu_devices": "VARCHAR",
    "gpu_milli": "INTEGER",
    "gpu_count": "INTEGER",
    "start_time": "TIMESTAMPTZ",
    "end_time": "TIMESTAMPTZ",
    "power_limit_w": "DOUBLE",
    "expected_energy_kwh": "DOUBLE",
    "expected_kgco2e": "DOUBLE",
    "priority": "DOUBLE",
}
PLAN_COLUMNS = (
    "plan_id",
    "plan_time",
    "policy",
    "created_from",
    "forecast_version",
    "n_jobs",
    "n_assigned",
    "expected_kgco2e",
    "schedule_dir",
)
DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS plan.plans (
    plan_id VARCHAR NOT NULL PRIMARY KEY,
    plan_time TIMESTAMPTZ NOT NULL,
    policy VARCHAR NOT NULL,
    created_from VARCHAR,
    forecast_version VARCHAR,
    n_jobs INTEGER NOT NULL,
    n_assigned INTEGER NOT NULL,
    expected_kgco2e DOUBLE,
    schedule_dir VARCHAR
);
CREATE TABLE IF NOT EXISTS plan.assignments (
    plan_id VARCHAR NOT NULL,
    {", ".join(f"{name} {kind}" for name, kind in ASSIGNMENT_COLUMNS.items())}
);
CREATE TABLE IF NOT EXISTS plan.explanations (
    plan_id VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    record JSON,
    text VARCHAR
);
CREATE TABLE IF NOT EXISTS plan.unplaced (
    plan_id VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    reason VARCHAR
);
"""


# ------------------------------------------------------------------------------------------------ small helpers

DRY_RUN_SUFFIX = "#dry-run"


def plan_id_for(policy: str, plan_time, dry_run: bool = False) -> str:
    """The plan's key: policy + "@" + the plan time in ISO (UTC); a dry run's explanations are kept apart under
    the same key + "#dry-run", so a dry run never overwrites the explanations of a real plan."""
    if not policy or "@" in str(policy) or "#" in str(policy):
        raise ValueError(f"bad policy name {policy!r}")
    return f"{policy}@{iso_z(plan_time)}" + (DRY_RUN_SUFFIX if dry_run else "")


def parse_plan_id(plan_id: str) -> tuple[str, pd.Timestamp, bool]:
    """(policy, plan time, dry run) of a key made by `plan_id_for`; ValueError naming the key otherwise."""
    text = str(plan_id)
    dry_run = text.endswith(DRY_RUN_SUFFIX)
    body = text[: -len(DRY_RUN_SUFFIX)] if dry_run else text
    policy, sep, stamp = body.partition("@")
    try:
        if not sep or not policy:
            raise ValueError
        plan_time = utc(stamp)
    except ValueError:
        raise ValueError(
            f"bad plan_id {plan_id!r}: expected <policy>@<UTC time>, e.g. priority@2021-07-15T12:00:00Z"
        ) from None
    return policy, plan_time, dry_run


# ------------------------------------------------------------------------------------------------ the Plan object


@dataclass
class StoredPlan:
    """Stand-in with the contract's fields, used when `scheduling.domain.plan.Plan` cannot be built."""

    plan_time: pd.Timestamp
    policy: str
    forecast_version: str | None
    assignments: pd.DataFrame
    explanations: list[dict] = field(default_factory=list)
    unplaced: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["job_id", "reason"]))


def make_plan(**fields) -> Any:
    """A `scheduling.domain.plan.Plan` from the contract's fields, or a `StoredPlan` when that class is not
    available (or needs other arguments)."""
    try:
        return Plan(**fields)
    except Exception:  # noqa: BLE001 - fields the planner's class does not take: fall back to the stand-in
        return StoredPlan(**fields)


def plan_fields(plan: Any) -> dict:
    """The contract fields of any plan-like object, normalized (UTC plan_time, frames with the contract
    columns, explanations as plain JSON dicts)."""
    for name in ("plan_time", "policy", "assignments"):
        if not hasattr(plan, name):
            raise TypeError(f"not a Plan: missing attribute {name!r}")
    assignments = normalize_assignments(plan.assignments)
    unplaced = getattr(plan, "unplaced", None)
    if unplaced is None or len(unplaced) == 0:
        unplaced = pd.DataFrame({"job_id": pd.Series(dtype=str), "reason": pd.Series(dtype=str)})
    else:
        unplaced = pd.DataFrame(unplaced).copy()
        if "reason" not in unplaced.columns:
            unplaced["reason"] = None
        unplaced = unplaced[["job_id", "reason"]].copy()
        unplaced["job_id"] = unplaced["job_id"].astype(str)
        unplaced["reason"] = unplaced["reason"].map(
            lambda r: None if r is None or (isinstance(r, float) and math.isnan(r)) else str(r)
        )
        unplaced = unplaced.sort_values("job_id", kind="mergesort").reset_index(drop=True)
    explanations = [to_jsonable(dict(e)) for e in (getattr(plan, "explanations", None) or [])]
    explanations.sort(key=lambda e: str(e.get("job_id")))
    forecast_version = getattr(plan, "forecast_version", None)
    return {
        "plan_time": utc(plan.plan_time),
        "policy": str(plan.policy),
        "forecast_version": None if forecast_version is None else str(forecast_version),
        "assignments": assignments,
        "explanations": explanations,
        "unplaced": unplaced,
    }


def normalize_assignments(frame: pd.DataFrame | None) -> pd.DataFrame:
    """The assignments frame with every contract column (missing ones NULL), typed, sorted by job_id; extra
    columns kept after the contract's."""
    frame = pd.DataFrame() if frame is None else pd.DataFrame(frame).copy()
    for col in ASSIGNMENT_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    out = frame.reset_index(drop=True)
    for col in ("job_id", "cluster", "region", "node"):
        out[col] = out[col].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    out["gpu_devices"] = out["gpu_devices"].map(_devices_text)
    for col in ("gpu_milli", "gpu_count"):
        out[col] = pd.to_numeric(out[col], errors="coerce").round().astype("Int64")
    for col in ("start_time", "end_time"):
        out[col] = pd.to_datetime(out[col], utc=True).dt.as_unit("us")
    for col in ("power_limit_w", "expected_energy_kwh", "expected_kgco2e", "priority"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    extras = [c for c in out.columns if c not in ASSIGNMENT_COLUMNS]
    out = out[list(ASSIGNMENT_COLUMNS) + sorted(extras)]
    if out["job_id"].isna().any():
        raise ValueError("assignments: job_id must not be empty")
    if out["job_id"].duplicated().any():
        dup = sorted(out.loc[out["job_id"].duplicated(), "job_id"].unique())[:5]
        raise ValueError(f"assignments: job_id {dup} assigned more than once")
    return out.sort_values("job_id", kind="mergesort").reset_index(drop=True)


def _devices_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return ",".join(str(int(v)) for v in value)
    text = str(value).strip().replace("-", ",").replace(" ", "")
    return text or None


def summary_of(fields: dict) -> dict:
    a = fields["assignments"]
    n_assigned = int(len(a))
    n_jobs = n_assigned + int(len(fields["unplaced"]))
    kg = float(a["expected_kgco2e"].sum(min_count=1)) if n_assigned else 0.0
    return {"n_jobs": n_jobs, "n_assigned": n_assigned, "expected_kgco2e": None if math.isnan(kg) else kg}


# ------------------------------------------------------------------------------------------------ writing


def _fault_noop(stage: str) -> None:
    return None


def write_plan(
    plan: Any,
    *,
    schedule_dir: str | Path | None = None,
    created_from: str = "plan_service",
    texts: dict[str, str] | None = None,
    explainer=None,
    explanations_only: bool = False,
    db_path=None,
    _fault: Callable[[str], None] = _fault_noop,
) -> str:
    """Write `plan` to plan.* in one transaction (replacing the rows of its plan_id); returns the plan_id.

    `texts` maps job_id -> card text; missing texts are written by `explainer` (default: the template).
    `explanations_only` (dry run): only plan.explanations rows are written, under plan_id + "#dry-run" (so
    the real plan of that hour, if any, keeps its own); plan.plans, plan.assignments and plan.unplaced are left
    as they are. `_fault(stage)` is a test hook called between the steps inside the
    transaction ("deleted", "plans", "assignments", "explanations", "before_commit")."""
    fields = plan_fields(plan)
    plan_id = plan_id_for(fields["policy"], fields["plan_time"], dry_run=explanations_only)
    texts = dict(texts or {})
    missing = [e for e in fields["explanations"] if str(e.get("job_id")) not in texts]
    if missing:
        if explainer is None:
            explainer = TemplateExplainer()
        for record in missing:
            texts[str(record.get("job_id"))] = explainer.explain(record)
    explanations = pd.DataFrame(
        {
            "plan_id": plan_id,
            "job_id": [str(e.get("job_id")) for e in fields["explanations"]],
            "record": [canonical_json(e) for e in fields["explanations"]],
            "text": [texts[str(e.get("job_id"))] for e in fields["explanations"]],
        },
        columns=["plan_id", "job_id", "record", "text"],
    )
    summary = summary_of(fields)
    plans_row = pd.DataFrame(
        [
            {
                "plan_id": plan_id,
                "plan_time": fields["plan_time"],
                "policy": fields["policy"],
                "created_from": created_from,
                "forecast_version": fields["forecast_version"],
                "n_jobs": summary["n_jobs"],
                "n_assigned": summary["n_assigned"],
                "expected_kgco2e": summary["expected_kgco2e"],
                "schedule_dir": None if schedule_dir is None else str(schedule_dir),
            }
        ]
    )
    plans_row["plan_time"] = pd.to_datetime(plans_row["plan_time"], utc=True).dt.as_unit("us")
    assignments = fields["assignments"].copy()
    assignments.insert(0, "plan_id", plan_id)
    unplaced = fields["unplaced"].copy()
    unplaced.insert(0, "plan_id", plan_id)

    with writer(db_path) as con:
        create_tables(con, DDL)
        if not explanations_only:
            # before the transaction: DuckDB aborts a commit that alters a table and also deletes and re-inserts a
            # key of another (a re-run hour's plan.plans row), so a new column is added on its own
            _widen(con, "plan.assignments", assignments)
        con.execute("BEGIN TRANSACTION")
        try:
            tables = (
                ["plan.explanations"]
                if explanations_only
                else ["plan.plans", "plan.assignments", "plan.explanations", "plan.unplaced"]
            )
            for table in tables:
                con.execute(f"DELETE FROM {table} WHERE plan_id = ?", [plan_id])
            _fault("deleted")
            if not explanations_only:
                _insert(con, "plan.plans", plans_row)
                _fault("plans")
                _insert(con, "plan.assignments", assignments)
                _fault("assignments")
                _insert(con, "plan.unplaced", unplaced)
            if len(explanations):
                con.register("_expl", explanations)
                con.execute(
                    "INSERT INTO plan.explanations SELECT plan_id, job_id, record::JSON, text FROM _expl "
                    "ORDER BY job_id"
                )
                con.unregister("_expl")
            _fault("explanations")
            _fault("before_commit")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return plan_id


def _insert(con, table: str, frame: pd.DataFrame) -> None:
    if not len(frame):
        return
    if table == "plan.assignments":  # object columns the table has as VARCHAR: insert their text
        frame = frame.copy()
        for col in frame.columns:
            if frame[col].dtype == object and col not in ("job_id", "cluster", "region", "node", "gpu_devices"):
                frame[col] = frame[col].map(
                    lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                )
    con.register("_rows", frame)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
    finally:
        con.unregister("_rows")


def _sql_type(series: pd.Series) -> str:
    """The DuckDB column type for a pandas column (decided by dtype, so an empty frame cannot mistype it)."""
    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "BOOLEAN"
    if pd.api.types.is_integer_dtype(dtype):
        return "BIGINT"
    if pd.api.types.is_float_dtype(dtype):
        return "DOUBLE"
    if isinstance(dtype, pd.DatetimeTZDtype):
        return "TIMESTAMPTZ"
    if pd.api.types.is_datetime64_dtype(dtype):
        return "TIMESTAMP"
    if pd.api.types.is_timedelta64_dtype(dtype):
        return "INTERVAL"
    return "VARCHAR"


def _widen(con, table: str, frame: pd.DataFrame) -> None:
    """Add the columns of `frame` that `table` lacks (never drops any). Skipped for an empty frame."""
    if not len(frame):
        return
    schema, name = table.split(".")
    existing = {
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
            [schema, name],
        ).fetchall()
    }
    for col in frame.columns:
        if col not in existing:
            con.execute(f'ALTER TABLE {table} ADD COLUMN "{col}" {_sql_type(frame[col])}')


def delete_plan(plan_id: str, db_path=None) -> None:
    """Remove a plan's rows from every plan.* table (one transaction)."""
    with writer(db_path) as con:
        create_tables(con, DDL)
        con.execute("BEGIN TRANSACTION")
        try:
            for table in ("plan.plans", "plan.assignments", "plan.explanations", "plan.unplaced"):
                con.execute(f"DELETE FROM {table} WHERE plan_id = ?", [plan_id])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


# ------------------------------------------------------------------------------------------------ reading


def _has_plans(con) -> bool:
    return table_exists(con, "plan.plans")


def list_plans(policy: str | None = None, as_of=None, db_path=None) -> pd.DataFrame:
    """plan.plans rows (newest plan_time first), optionally of one policy and at or before `as_of`."""
    where, params = [], []
    if policy is not None:
        where.append("policy = ?")
        params.append(policy)
    if as_of is not None:
        where.append("plan_time <= ?")
        params.append(utc(as_of).to_pydatetime())
    sql = f"SELECT {', '.join(PLAN_COLUMNS)} FROM plan.plans"
    sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY plan_time DESC, plan_id"
    try:
        with reader(db_path) as con:
            if not _has_plans(con):
                return pd.DataFrame(columns=list(PLAN_COLUMNS))
            frame = con.execute(sql, params).df()
    except FileNotFoundError:
        return pd.DataFrame(columns=list(PLAN_COLUMNS))
    frame["plan_time"] = pd.to_datetime(frame["plan_time"], utc=True)
    return frame


def latest_plan(policy: str | None = None, as_of=None, db_path=None):
    """The plan with the newest plan_time (of `policy`, at or before `as_of`), or None when there is none."""
    plans = list_plans(policy, as_of, db_path)
    if plans.empty:
        return None
    return read_plan(str(plans.iloc[0]["plan_id"]), db_path=db_path)


def read_plan(plan_id: str, db_path=None, with_meta: bool = False):
    """The stored plan as a Plan (see `make_plan`). `with_meta=True` returns (plan, plans-row dict, texts)."""
    with reader(db_path) as con:
        if not _has_plans(con):
            raise KeyError(f"no plan {plan_id!r}: the warehouse has no plan tables yet")
        meta = con.execute(f"SELECT {', '.join(PLAN_COLUMNS)} FROM plan.plans WHERE plan_id = ?", [plan_id]).df()
        if meta.empty:
            raise KeyError(f"no plan {plan_id!r} in plan.plans")
        assignments = con.execute(
            "SELECT * EXCLUDE (plan_id) FROM plan.assignments WHERE plan_id = ? ORDER BY job_id", [plan_id]
        ).df()
        expl = con.execute(
            "SELECT job_id, record::VARCHAR AS record, text FROM plan.explanations WHERE plan_id = ? ORDER BY job_id",
            [plan_id],
        ).df()
        unplaced = con.execute(
            "SELECT job_id, reason FROM plan.unplaced WHERE plan_id = ? ORDER BY job_id", [plan_id]
        ).df()
    row = meta.iloc[0].to_dict()
    for col in ("start_time", "end_time"):
        assignments[col] = pd.to_datetime(assignments[col], utc=True)
    for col in assignments.columns:
        if col not in ASSIGNMENT_COLUMNS and str(assignments[col].dtype).startswith("datetime64"):
            assignments[col] = pd.to_datetime(assignments[col], utc=True)
    plan = make_plan(
        plan_time=utc(row["plan_time"]),
        policy=str(row["policy"]),
        forecast_version=row["forecast_version"],
        assignments=assignments,
        explanations=[json.loads(r) for r in expl["record"]],
        unplaced=unplaced,
    )
    if with_meta:
        return plan, to_jsonable(row), dict(zip(expl["job_id"], expl["text"]))
    return plan


def read_explanations(plan_id: str, db_path=None) -> pd.DataFrame:
    """plan.explanations rows of one plan (also those of a dry run, which has no plan.plans row)."""
    with reader(db_path) as con:
        if not _has_plans(con):
            return pd.DataFrame(columns=["job_id", "record", "text"])
        return con.execute(
            "SELECT job_id, record::VARCHAR AS record, text FROM plan.explanations WHERE plan_id = ? ORDER BY job_id",
            [plan_id],
        ).df()


def table_digest(db_path=None, plan_ids: Iterable[str] | None = None) -> dict[str, str]:
    """SHA-256 per plan.* table over its rows in a canonical order (for checking that re-runs are identical)."""
    out = {}
    with reader(db_path) as con:
        if not _has_plans(con):
            return out
        for table in ("plans", "assignments", "explanations", "unplaced"):
            sql = f"SELECT * FROM plan.{table}"
            params: list = []
            if plan_ids is not None:
                ids = list(plan_ids)
                sql += f" WHERE plan_id IN ({', '.join('?' for _ in ids)})"
                params = ids
            frame = con.execute(sql, params).df()
            frame = frame.astype(str).sort_values(list(frame.columns), kind="mergesort").reset_index(drop=True)
            digest = hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()
            out[f"plan.{table}"] = digest
    return out
