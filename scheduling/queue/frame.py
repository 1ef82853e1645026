"""Queued jobs -> the planner's job frame (the columns of `scheduling.domain.jobs.JOB_COLUMNS`), plus the columns
executors need and the planner does not read.

    frame = pending_job_frame(as_of, fleet)          # queued + planned jobs submitted at or before as_of
    frame = job_frame(specs, fleet)                   # any JobSpecs (e.g. store.load_specs(...))

Planner columns, per job (derivations in `scheduling.queue.estimate`):

* `job_id` = `tenant/job_id`; `source_pod` = "" (no trace pod); `submit_time` = submitted_at floored to its hour
  (the planner runs hourly and sees what arrived before it, as the trace generator's jobs do).
* `deadline`, `flexibility`, `duration_h_ref`, `duration_h_home`, `home_cluster`: as `estimate` derives them.
* `num_gpu` = gpus, `gpu_milli`, `cpu_milli`, `memory_mib`; `gpu_spec` = gpu_models joined by '|' ("" = any);
  `qos` = priority_class; `workload_class`; `job_type` = the planner job type (the submitted one, or the class
  profile for an unknown type); `checkpointing` = checkpoint_interval_min is set; `home_region`; `data_gb` =
  input_gb.
* `allowed_regions` ('|'-joined, "" = any): the planner's `hostable` keeps every cluster outside them out.

Executor columns: `tenant`, `queue_job_id`, `submitted_at` (exact), `job_type_submitted`, `priority_class`,
`max_retries`, `attempts`, `state`, `checkpoint_interval_min`, `checkpoint_overhead_min` (NaN: the default),
`max_preemptions` (NA: the planner's), `image`, `command` (JSON text, as submitted),
`script`, `flags` ('|'-joined), `work_done` (the share of the job its latest checkpoint keeps: a preempted job
resumes from it) and `preemptions` (its checkpoints so far).

A job no cluster of `fleet` can host (the service may plan on part of the fleet) is listed in
`frame.attrs["unhostable"]`; the planner reports it unplaced (`no_hostable_cluster`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from scheduling.domain.jobs import JOB_COLUMNS, SpeedModel
from scheduling.queue import store
from scheduling.queue.estimate import DurationProfile, derive, workload_class_of
from scheduling.queue.spec import JobSpec

PENDING_STATES = ("queued", "planned")
EXECUTOR_COLUMNS = (
    "allowed_regions",
    "tenant",
    "queue_job_id",
    "submitted_at",
    "job_type_submitted",
    "priority_class",
    "max_retries",
    "attempts",
    "state",
    "checkpoint_interval_min",
    "checkpoint_overhead_min",
    "max_preemptions",
    "image",
    "command",
    "script",
    "flags",
    "work_done",
    "preemptions",
)
FRAME_COLUMNS = tuple(JOB_COLUMNS) + EXECUTOR_COLUMNS


def job_frame(
    specs: Sequence[JobSpec],
    fleet,
    *,
    rows: Sequence[dict] | None = None,
    speed_model: SpeedModel | None = None,
    profile: DurationProfile | None = None,
    data_dir=None,
) -> pd.DataFrame:
    """The planner's job frame of `specs` on `fleet` (see the module doc); `rows` (the stored queue.jobs rows of
    the specs, same order) supply state and attempts (default: queued, 0)."""
    if not len(specs):
        frame = pd.DataFrame({c: pd.Series(dtype=object) for c in FRAME_COLUMNS})
        frame.attrs["unhostable"] = []
        return frame
    rows = list(rows) if rows is not None else [{} for _ in specs]
    derived, _ = derive(specs, fleet, speed_model, profile, data_dir)
    submitted = pd.to_datetime(pd.Series([s.submitted_at for s in specs], dtype=object), utc=True)
    frame = pd.DataFrame(
        {
            "job_id": [s.planner_id for s in specs],
            "source_pod": "",
            "submit_time": submitted.dt.floor("h"),
            "deadline": derived["deadline"],
            "duration_h_ref": derived["duration_h_ref"].to_numpy(float),
            "duration_h_home": derived["duration_h_home"].to_numpy(float),
            "num_gpu": np.array([s.gpus for s in specs], dtype=np.int64),
            "gpu_milli": np.array([s.gpu_milli for s in specs], dtype=np.int64),
            "cpu_milli": np.array([s.cpu_milli for s in specs], dtype=np.int64),
            "memory_mib": np.array([s.memory_mib for s in specs], dtype=np.int64),
            "gpu_spec": ["|".join(s.gpu_models) for s in specs],
            "qos": [s.priority_class for s in specs],
            "workload_class": [workload_class_of(s) for s in specs],
            "job_type": derived["planner_job_type"].to_numpy(object),
            "flexibility": derived["flexibility"].to_numpy(float),
            "checkpointing": np.array([s.checkpoint_interval_min is not None for s in specs], dtype=bool),
            "home_region": [s.home_region for s in specs],
            "home_cluster": derived["home_cluster"].to_numpy(object),
            "data_gb": np.array([s.input_gb for s in specs], dtype=float),
            "allowed_regions": ["|".join(s.allowed_regions) for s in specs],
            "tenant": [s.tenant for s in specs],
            "queue_job_id": [s.job_id for s in specs],
            "submitted_at": submitted,
            "job_type_submitted": [s.job_type for s in specs],
            "priority_class": [s.priority_class for s in specs],
            "max_retries": np.array([s.max_retries for s in specs], dtype=np.int64),
            "attempts": np.array([int(r.get("attempts", 0) or 0) for r in rows], dtype=np.int64),
            "state": [r.get("state", "queued") for r in rows],
            "checkpoint_interval_min": pd.array([s.checkpoint_interval_min for s in specs], dtype="Int64"),
            "checkpoint_overhead_min": np.array(
                [np.nan if s.checkpoint_overhead_min is None else s.checkpoint_overhead_min for s in specs], dtype=float
            ),
            "max_preemptions": pd.array([s.max_preemptions for s in specs], dtype="Int64"),
            "image": [s.image for s in specs],
            "command": [_command_json(s.command) for s in specs],
            "script": [s.script for s in specs],
            "flags": ["|".join(s.flags) for s in specs],
            "work_done": np.array([float(r.get("work_done", 0.0) or 0.0) for r in rows], dtype=float),
            "preemptions": np.array([int(r.get("preemptions", 0) or 0) for r in rows], dtype=np.int64),
        }
    )
    frame.attrs["unhostable"] = [s.planner_id for s, ok in zip(specs, derived["hostable_any"]) if not ok]
    return frame


def _command_json(command) -> str | None:
    if command is None:
        return None
    return json.dumps(list(command) if isinstance(command, tuple) else command, ensure_ascii=False)


def pending_job_frame(
    as_of,
    fleet,
    *,
    states: Sequence[str] = PENDING_STATES,
    db_path=None,
    speed_model: SpeedModel | None = None,
    data_dir=None,
) -> pd.DataFrame:
    """The planner's job frame of the jobs in `states` (default queued and planned: a planned job is planned again
    every hour until it is dispatched) submitted at or before `as_of`, oldest first. Empty (with the columns) when
    the queue is empty or does not exist yet."""
    loaded = store.load_specs(states, as_of=as_of, db_path=db_path)
    return job_frame(
        [s for s, _ in loaded], fleet, rows=[r for _, r in loaded], speed_model=speed_model, data_dir=data_dir
    )
