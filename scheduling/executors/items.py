"""What a dispatch carries: the plan's assignments that start now, joined with each job's payload.

    items = dispatch_items(plan, jobs)     # plan.dispatched() + the payload columns of `jobs` (by planner job_id)
    items = check_items(items)             # every column present and typed; errors name the job and field

Columns: those of `Plan.assignments` (job_id = the planner's id ``tenant/job_id``, cluster, region, node,
gpu_devices, gpu_milli, gpu_count, start_time, end_time, power_limit_w, expected_energy_kwh, expected_kgco2e,
priority, and extras such as cpu_milli, memory_mib) and `PAYLOAD_COLUMNS`: tenant, queue_job_id, image, command,
script, checkpoint_interval_min, max_retries, attempt, est_duration_h (the run-time estimate the plan used: of the
work still to do), work_done (the share of the job the plan takes as done at a checkpoint the run resumes from).

Defaults where the jobs frame has no value: tenant and queue_job_id split from the planner id (``tenant/job_id``;
an id without ``/`` has no tenant and is its own queue id), attempt 1, est_duration_h the planned duration
(end_time - start_time), work_done 0, the payload fields NULL.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scheduling.output.plan_store import normalize_assignments

PAYLOAD_COLUMNS = (
    "tenant",
    "queue_job_id",
    "image",
    "command",
    "script",
    "checkpoint_interval_min",
    "max_retries",
    "attempt",
    "est_duration_h",
    "work_done",
)
_TEXT = ("tenant", "queue_job_id", "image", "command", "script")
_INT = ("checkpoint_interval_min", "max_retries", "attempt")


def split_job_id(planner_job_id: str) -> tuple[str | None, str]:
    """(tenant, queue job id) of a planner id ``tenant/job_id``; (None, id) when it names no tenant."""
    tenant, sep, rest = str(planner_job_id).partition("/")
    return (tenant, rest) if sep and tenant and rest else (None, str(planner_job_id))


def _missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def dispatch_items(plan, jobs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The assignments of `plan` that start at its plan time, with the payload columns of `jobs` (a frame keyed by
    the planner's `job_id`; columns it lacks get the defaults of the module doc), checked."""
    items = plan.dispatched().copy()
    if jobs is not None and len(jobs):
        if "job_id" not in jobs.columns:
            raise ValueError("jobs frame: needs a job_id column (the planner's id, tenant/job_id)")
        payload = [c for c in PAYLOAD_COLUMNS if c in jobs.columns]
        extra = jobs[["job_id", *payload]].copy()
        extra["job_id"] = extra["job_id"].astype(str)
        dup = extra["job_id"].duplicated()
        if dup.any():
            raise ValueError(f"jobs frame: job_id {sorted(extra.loc[dup, 'job_id'])[:5]} appears more than once")
        items = items.drop(columns=[c for c in payload if c in items.columns]).merge(extra, on="job_id", how="left")
    return check_items(items)


def check_items(items: pd.DataFrame) -> pd.DataFrame:
    """`items` with every assignment and payload column, typed and sorted by job_id; ValueError naming the job and
    the field for a missing cluster or start/end time, an end before the start, or a bad payload value."""
    out = normalize_assignments(items)
    for col in PAYLOAD_COLUMNS:
        if col not in out.columns:
            out[col] = None
    missing = {f: out[f].map(_missing).to_numpy(dtype=bool) for f in ("cluster", "start_time", "end_time")}
    timed = ~missing["start_time"] & ~missing["end_time"]
    backwards = np.zeros(len(out), dtype=bool)
    backwards[timed] = (out.loc[timed, "end_time"] <= out.loc[timed, "start_time"]).to_numpy(dtype=bool)
    bad = np.flatnonzero(missing["cluster"] | missing["start_time"] | missing["end_time"] | backwards)
    if len(bad):  # the first bad row, its first bad field
        row = out.iloc[bad[0]]
        field = next((f for f in ("cluster", "start_time", "end_time") if missing[f][bad[0]]), None)
        if field is not None:
            raise ValueError(f"dispatch item {row['job_id']!r}: field {field!r} is empty")
        raise ValueError(f"dispatch item {row['job_id']!r}: field 'end_time' {row['end_time']} is not after start_time")
    tenants, queue_ids = zip(*map(split_job_id, out["job_id"])) if len(out) else ((), ())
    defaults = {
        "queue_job_id": pd.Series(queue_ids, index=out.index, dtype=object),
        "tenant": pd.Series(tenants, index=out.index, dtype=object),
        "attempt": pd.Series(1, index=out.index, dtype=object),
        "work_done": pd.Series(0.0, index=out.index, dtype=object),
        "est_duration_h": (pd.to_datetime(out["end_time"], utc=True) - pd.to_datetime(out["start_time"], utc=True))
        .dt.total_seconds()
        .div(3600.0)
        .astype(object),
    }
    for col, default in defaults.items():
        empty = out[col].map(_missing).to_numpy(dtype=bool)
        if empty.any():
            out[col] = out[col].astype(object).where(~empty, default)
    for col in _TEXT:
        out[col] = out[col].map(lambda v: None if _missing(v) else str(v)).astype(object)
    for col in _INT:
        out[col] = _numbers(out, col).round().astype("Int64")
    out["est_duration_h"] = _numbers(out, "est_duration_h").astype("float64")
    bad = out["est_duration_h"].isna() | ~(out["est_duration_h"] > 0) | out["est_duration_h"].map(math.isinf)
    if bad.any():
        row = out[bad].iloc[0]
        raise ValueError(
            f"dispatch item {row['job_id']!r}: field 'est_duration_h' must be a positive number of hours, "
            f"got {row['est_duration_h']}"
        )
    out["work_done"] = _numbers(out, "work_done").astype("float64")
    bad = ~((out["work_done"] >= 0) & (out["work_done"] < 1))
    if bad.any():
        row = out[bad].iloc[0]
        raise ValueError(
            f"dispatch item {row['job_id']!r}: field 'work_done' must be in [0, 1), got {row['work_done']}"
        )
    if (out["attempt"] < 0).any():
        row = out[out["attempt"] < 0].iloc[0]
        raise ValueError(f"dispatch item {row['job_id']!r}: field 'attempt' must be >= 0, got {row['attempt']}")
    return out


def _numbers(frame: pd.DataFrame, col: str) -> pd.Series:
    values = pd.to_numeric(frame[col], errors="coerce")
    bad = values.isna() & frame[col].map(lambda v: not _missing(v))
    if bad.any():
        row = frame[bad].iloc[0]
        raise ValueError(f"dispatch item {row['job_id']!r}: field {col!r} is not a number: {row[col]!r}")
    return values
