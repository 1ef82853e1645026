"""The one executor interface (DESIGN.md, "Operating loop"): what every executor does and the frames it speaks.

An executor runs what a plan dispatched and reports what happened. The planner never asks a plan what is running;
it asks the executor (`running`), and what happened becomes data through `sync` -> `raw.job_events`.

* ``dispatch(plan_id, items) -> records``: hand over the plan's assignments that start now (`items`, see
  `scheduling.executors.items`). Returns one record per job (`RECORD_COLUMNS`): the executor's reference for the
  submission, or the error that kept it out. Exactly-once is the dispatch log's job
  (`scheduling.executors.dispatch_log`); an executor only has to make one call atomic per job and answer `lookup`.
* ``lookup(plan_id, job_id) -> executor_ref | None``: did a submission with this idempotency key reach the
  executor? The dispatch log asks after a crash left an `intent` row behind.
* ``sync(now, since=None) -> events``: the events (`EVENT_COLUMNS`) whose time is in ``[since, now)`` (all up to
  `now` when `since` is None). A pure function of what the executor holds and the window, so consecutive windows
  partition the events and re-running an hour returns the same events.
* ``cancel(job_id, now) -> bool``: end the job's live run at `now` (True when there was one to end).
* ``running(now) -> frame``: the jobs the executor reports as running at `now` (`RUNNING_COLUMNS`), with their
  node, devices, power limit in force and expected end so that the planner keeps those GPUs bound.
* ``set_power_limit(job_id, watts, at, plan_id=, time_factor=) -> ref | None`` (optional): change the GPU power
  limit of the job's live run from `at` on, as decided by plan `plan_id` (its idempotency key: a second call with
  the same key changes nothing and returns the same ref); a ``power_changed`` event at `at` reports it. None when
  the job has no live run at `at`. `time_factor` is the planner's run time at `watts` relative to the run's
  dispatch limit: what `replay` advances the run at; a real executor lets the GPU decide.
  ``power_change_ref(plan_id, job_id)`` answers whether that change reached the executor (the action log asks
  after a crash).
* ``preempt(job_id, at, plan_id=, save_h=) -> ref | None`` (optional, `preempts`): stop the job's live run at
  `at` at a checkpoint: the job is told `save_h` hours before and writes its checkpoint meanwhile
  (`scheduling.domain.execution`); a ``preempted`` event at `at` reports it, the plan id is the idempotency key,
  None when the job has no live run at `at`. A later dispatch of the job (its `work_done` > 0) resumes from the
  checkpoint and reports ``resumed`` where a first run reports ``started``. ``preemption_ref(plan_id, job_id)``
  answers whether that preemption reached the executor.
* ``imports(now)`` / ``adopt(latest_starts, now, plan_id=, cluster=)`` / ``drop_import(job_id, now)`` (optional):
  jobs users submitted to the executor itself for carbon-aware planning, handed to the queue, then started by their
  latest timely start unless a plan moves them (such a run is attempt 0 of the adopting plan: no ``dispatched``
  event); dropped here when a plan sends them to another executor's cluster or the queue cancels them, never once
  they run.
* ``scale_service(key, at, *, plan_id, provision) -> ref`` (optional, `serves`): from `at` on, run the
  inference service's replicas in one cluster as `provision` says (`SERVICE_PROVISION_FIELDS`: replicas, GPUs per
  replica, batch cap, the served model and its rate source; 0 replicas stops it there); `key` is
  ``tenant/service@cluster``, the plan id its idempotency key. ``service_scaling_ref(plan_id, key)`` answers whether
  that scaling reached the executor. ``service_usage(now, since) -> frame`` (`SERVICE_USAGE_COLUMNS`): per service,
  cluster and whole hour in [since, now), what its replicas served (requests, output tokens, energy, the latency at
  their load), a pure function of the window like `sync`.
* ``drained_nodes(now) -> {node: why}`` (optional): the nodes the resource manager itself drains (Slurm's DRAIN);
  their running jobs end there and no new job starts there.

Clock: every time is a UTC timestamp on the executor's clock, and plan time maps onto it explicitly. A dispatch
happens at its plan's time (`plan_time_of(plan_id)`), which for `replay` is the executor's clock itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import pandas as pd

from common.timeutil import utc
from scheduling.output.plan_store import parse_plan_id

# Event types of raw.job_events. `unconfirmed`: the planned start passed and the executor cannot say whether the
# job started (an executor that went silent is reported, not assumed).
# `power_changed`: the run's GPU power limit (`power_limit_w`) changed at `event_time`. `preempted`: the run stopped
# at a checkpoint; `resumed`: a run that goes on from the job's checkpoint started.
EVENT_TYPES = (
    "dispatched", "started", "finished", "failed", "cancelled", "unconfirmed", "power_changed", "preempted", "resumed",
)  # fmt: skip
# Order of events at the same instant (a run is dispatched before it starts, and starts before it ends).
EVENT_RANK = {
    "dispatched": 0,
    "started": 1,
    "resumed": 1,
    "unconfirmed": 1,
    "power_changed": 2,
    "finished": 3,
    "failed": 3,
    "cancelled": 3,
    "preempted": 3,
}

# Events as executors return them (raw.job_events without the loader's _source/_batch_id/_loaded_at).
EVENT_COLUMNS: dict[str, str] = {
    "tenant": "VARCHAR",
    "job_id": "VARCHAR",  # the queue's id, unique within its tenant
    "planner_job_id": "VARCHAR",  # tenant/job_id, the planner's id
    "event": "VARCHAR",
    "event_time": "TIMESTAMPTZ",
    "executor": "VARCHAR",
    "executor_ref": "VARCHAR",
    "plan_id": "VARCHAR",
    "attempt": "INTEGER",
    "cluster": "VARCHAR",
    "node": "VARCHAR",
    "gpu_devices": "VARCHAR",
    "gpu_count": "INTEGER",
    "gpu_milli": "INTEGER",
    "power_limit_w": "DOUBLE",
    "energy_kwh": "DOUBLE",  # measured by the executor; NULL where it measures none
}

# What a service's scaling carries (`scale_service`): where and how its replicas run, and what the executor needs to
# serve them (the replay executor serves the rate source's requests with the serving model).
SERVICE_PROVISION_COLUMNS: dict[str, str] = {
    "tenant": "VARCHAR",
    "service_id": "VARCHAR",
    "cluster": "VARCHAR",
    "replicas": "INTEGER NOT NULL",
    "num_gpus": "INTEGER",  # per replica
    "tensor_parallel": "INTEGER",
    "batch_cap": "INTEGER",
    "model": "VARCHAR",
    "gpu": "VARCHAR",
    "task": "VARCHAR",
    "curve": "VARCHAR",  # the serving data's curve (`scheduling.models.serving.curve_id`)
    "latency_slo_ms": "DOUBLE",
    "rate_source": "VARCHAR",
    "rate_scale": "DOUBLE",
    "nodes": "VARCHAR",  # the nodes the plan bound the replicas to (comma-separated)
}
SERVICE_PROVISION_FIELDS = tuple(SERVICE_PROVISION_COLUMNS)
# What `service_usage` returns: one row per service, cluster and hour it ran in.
SERVICE_USAGE_COLUMNS: dict[str, str] = {
    "service": "VARCHAR",  # tenant/service_id
    "tenant": "VARCHAR",
    "service_id": "VARCHAR",
    "hour_utc": "TIMESTAMPTZ",
    "executor": "VARCHAR",
    "cluster": "VARCHAR",
    "plan_id": "VARCHAR",  # the plan whose scaling was in force
    "replicas": "INTEGER",
    "gpus": "INTEGER",
    "batch_cap": "INTEGER",
    "requests": "DOUBLE",  # requests that came in during the hour
    "demand_tokens_per_s": "DOUBLE",  # output tokens/s asked for
    "tokens": "DOUBLE",  # output tokens served
    "energy_kwh": "DOUBLE",  # the replicas' GPUs (no PUE)
    "latency_ms": "DOUBLE",  # the latency percentile the service's target bounds, at the load each replica carried
    "saturated": "BOOLEAN",  # the replicas could not keep up (the target is then missed)
}

# What `dispatch` returns per job.
RECORD_COLUMNS = ("job_id", "executor_ref", "error")

# What `running` returns: the planner binds `node`/`gpu_devices` until `end_time`. `confirmed` is False where the
# executor cannot see its jobs and reports what it was told to run (see files.py).
RUNNING_COLUMNS: dict[str, str] = {
    "job_id": "VARCHAR",  # planner id
    "tenant": "VARCHAR",
    "queue_job_id": "VARCHAR",
    "plan_id": "VARCHAR",
    "attempt": "INTEGER",
    "executor": "VARCHAR",
    "executor_ref": "VARCHAR",
    "cluster": "VARCHAR",
    "node": "VARCHAR",
    "gpu_devices": "VARCHAR",
    "gpu_count": "INTEGER",
    "gpu_milli": "INTEGER",
    "power_limit_w": "DOUBLE",
    "start_time": "TIMESTAMPTZ",
    "end_time": "TIMESTAMPTZ",
    "confirmed": "BOOLEAN",
}

_PANDAS_TYPES = {
    "VARCHAR": object,
    "TIMESTAMPTZ": "datetime64[us, UTC]",
    "INTEGER": "Int64",
    "DOUBLE": "float64",
    "BOOLEAN": "boolean",
}


class UnsupportedAction(RuntimeError):
    """The executor cannot do this to a running job (its `changes_power_limits` says so; the loop never asks it)."""


class DuplicateDispatchError(RuntimeError):
    """A second submission of one (plan_id, job_id): the dispatch log exists to make this impossible, so an
    executor that can see it refuses loudly instead of running the job twice."""


def typed_frame(rows: list[dict] | pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """`rows` as a frame with exactly `columns` (name -> SQL type) in that order, typed; missing columns NULL."""
    frame = pd.DataFrame(rows).reset_index(drop=True) if len(rows) else pd.DataFrame(index=range(0))
    out = pd.DataFrame(index=frame.index)
    for name, kind in columns.items():
        values = frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index)
        if kind == "TIMESTAMPTZ":
            out[name] = pd.to_datetime(values, utc=True).astype(_PANDAS_TYPES[kind])
        elif kind == "INTEGER":
            out[name] = pd.to_numeric(values, errors="raise").round().astype("Int64")
        elif kind == "DOUBLE":
            out[name] = pd.to_numeric(values, errors="raise").astype("float64")
        elif kind == "BOOLEAN":
            out[name] = values.astype("boolean")
        else:
            out[name] = values.map(_text).astype(object)
    return out


def typed_values(row: dict, columns: dict[str, str]) -> list:
    """One row's values in `columns`' order, typed as `typed_frame` types them (missing or NaN: NULL); for a
    single-row INSERT, where building a frame costs more than the write."""
    out = []
    for name, kind in columns.items():
        value, kind = row.get(name), kind.split()[0]
        if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and value != value):
            out.append(None)
        elif kind == "TIMESTAMPTZ":
            out.append(pd.to_datetime(value, utc=True).to_pydatetime())
        elif kind == "INTEGER":
            out.append(int(round(float(value))))
        elif kind == "DOUBLE":
            out.append(float(value))
        elif kind == "BOOLEAN":
            out.append(bool(value))
        else:
            out.append(_text(value))
    return out


def _text(value) -> str | None:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and value != value:
        return None
    return str(value)


def empty_events() -> pd.DataFrame:
    return typed_frame([], EVENT_COLUMNS)


def sort_events(events: pd.DataFrame) -> pd.DataFrame:
    """Events in a canonical order: time, then dispatched < started < ended, then plan and job."""
    if events.empty:
        return events.reset_index(drop=True)
    rank = events["event"].map(EVENT_RANK).fillna(9)
    order = events.assign(_rank=rank).sort_values(
        ["event_time", "_rank", "plan_id", "planner_job_id"], kind="mergesort"
    )
    return order.drop(columns="_rank").reset_index(drop=True)


def in_window(times: pd.Series, since, now) -> pd.Series:
    """Mask of `times` in [since, now); since None = no lower bound. Half-open, so that what happens at a planning
    hour (a job dispatched at T starts at T) belongs to the window that starts there: the loop syncs [T-1h, T)
    before it plans and dispatches T."""
    mask = times < utc(now)
    if since is not None:
        mask &= times >= utc(since)
    return mask


def check_window(since, now) -> tuple[pd.Timestamp | None, pd.Timestamp]:
    now_ts = utc(now)
    since_ts = None if since is None else utc(since)
    if since_ts is not None and since_ts >= now_ts:
        raise ValueError(f"sync window [{since_ts}, {now_ts}) is empty: since must be before now")
    return since_ts, now_ts


def plan_time_of(plan_id: str) -> pd.Timestamp:
    """The executor-clock time of a dispatch: its plan's time. Dry-run plans are never dispatched."""
    _, plan_time, dry_run = parse_plan_id(plan_id)
    if dry_run:
        raise ValueError(f"plan {plan_id!r} is a dry run; dry runs are never dispatched")
    return plan_time


class Executor(ABC):
    """Runs what plans dispatch; reports what happened (see the module doc for each method's contract)."""

    kind: str = ""
    # the per-job files of the plan's schedule directory this executor's clusters get (`schedules.JOB_FILES`):
    # what a person or system starting the jobs by hand reads; an executor that reads the plan rows needs none
    job_files: tuple[str, ...] = ("k8s", "slurm")
    # whether `set_power_limit` changes a running job's limit (the planner decides changes only for those jobs)
    changes_power_limits: bool = False
    # whether `preempt` stops a running job at a checkpoint (the planner preempts only those executors' jobs)
    preempts: bool = False
    # whether `scale_service` runs inference services (the planner places services only on those executors' clusters)
    serves: bool = False

    def __init__(self, name: str | None = None):
        self.name = str(name or self.kind)

    @abstractmethod
    def dispatch(self, plan_id: str, items: pd.DataFrame) -> pd.DataFrame:
        """Submit `items` (checked by `items.check_items`) under `plan_id`; one RECORD_COLUMNS row per job."""

    @abstractmethod
    def lookup(self, plan_id: str, job_id: str) -> str | None:
        """The executor_ref of the submission of (plan_id, job_id), or None when none reached the executor."""

    @abstractmethod
    def sync(self, now, since=None) -> pd.DataFrame:
        """EVENT_COLUMNS rows with `event_time` in [since, now), in `sort_events` order."""

    @abstractmethod
    def cancel(self, job_id: str, now) -> bool:
        """End the live run of planner job `job_id` at `now`; False when it has none."""

    @abstractmethod
    def running(self, now) -> pd.DataFrame:
        """RUNNING_COLUMNS rows of the jobs running at `now` (start <= now < end)."""

    def set_power_limit(self, job_id: str, watts: float, at, *, plan_id: str, time_factor: float = 1.0) -> str | None:
        """Change the power limit of `job_id`'s live run to `watts` per GPU from `at` (see the module doc).
        UnsupportedAction where the executor cannot change a running job's limit."""
        raise UnsupportedAction(f"executor {self.name!r} ({self.kind}) cannot change a running job's power limit")

    def power_change_ref(self, plan_id: str, job_id: str) -> str | None:
        """The ref of the power change plan `plan_id` made to `job_id`, or None when none reached the executor."""
        return None

    def preempt(self, job_id: str, at, *, plan_id: str, save_h: float) -> str | None:
        """Stop `job_id`'s live run at `at` at a checkpoint (see the module doc). UnsupportedAction where the
        executor cannot."""
        raise UnsupportedAction(f"executor {self.name!r} ({self.kind}) cannot preempt a running job")

    def preemption_ref(self, plan_id: str, job_id: str) -> str | None:
        """The ref of the preemption plan `plan_id` made of `job_id`, or None when none reached the executor."""
        return None

    def scale_service(self, key: str, at, *, plan_id: str, provision: dict) -> str | None:
        """Run the service's replicas in one cluster as `provision` says from `at` on (see the module doc).
        UnsupportedAction where the executor runs no services."""
        raise UnsupportedAction(f"executor {self.name!r} ({self.kind}) runs no inference services")

    def service_scaling_ref(self, plan_id: str, key: str) -> str | None:
        """The ref of the scaling plan `plan_id` made of `key`, or None when none reached the executor."""
        return None

    def service_usage(self, now, since=None) -> pd.DataFrame:
        """SERVICE_USAGE_COLUMNS rows of the whole hours in [since, now). None served by default."""
        return typed_frame([], SERVICE_USAGE_COLUMNS)

    def imports(self, now) -> list[dict]:
        """Jobs users left in this executor's own queue for the planner, as queue submissions (user fields; the
        loop adds the cluster's region as `home_region` unless one is given). None by default."""
        return []

    def adopt(
        self, latest_starts: dict[str, pd.Timestamp], now, *, plan_id: str | None = None, cluster: str | None = None
    ) -> None:
        """Take imported jobs the queue accepted (planner id -> latest timely start, plan time) under the plan
        `plan_id` (the adopting hour's) in `cluster`: each then starts by its latest start even when no plan
        dispatches it (fail-open), and such a run is reported as attempt 0 of `plan_id` (`sync`, `running`).
        Nothing by default."""
        return None

    def drop_import(self, job_id: str, now) -> bool:
        """Withdraw the user's own submission of an imported job (it goes to another executor's cluster, or was
        cancelled in the queue); False when there is none."""
        return False

    def drained_nodes(self, now) -> dict[str, str]:
        """Node name -> why the executor's resource manager starts no new job there (its own drain state); the plan
        takes those nodes out of its capacity as a fleet file's `drain: true` does. None by default."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
