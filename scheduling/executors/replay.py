"""`replay`, the embedded default executor: runs dispatched jobs in replayed time, with run times that are not the
plan's estimates, and reports them as a real executor would.

Plan time IS the replay clock: a dispatch happens at its plan's time, and every later `sync(now)` / `running(now)`
reads the same clock. Nothing here reads the wall clock, so replaying an hour gives the same runs and events.

Dispatching records one run per job in `executor.replay_runs` (DDL below), in one transaction per call. The run
starts exactly at the planned `start_time` and keeps running whatever the planner does next (fail-open: the stored
run is the executor's promise). Its true run time:

* settings ``truth``: a CSV with columns ``job_id, true_duration_h`` (demos write it from the trace); `job_id` is
  matched against the planner id (``tenant/job_id``) first, then the queue's id. Jobs it does not list, and every
  job without the setting, get
* the plan's estimate of the whole job (`est_duration_h` less a resumed run's restore, over 1 - `work_done`) x a noise
  factor ``exp(sigma * z)``, z standard normal drawn from a generator seeded by (seed, job_id): lognormal with median
  1 and spread `sigma` (default 0.15: about 68 % of runs within x0.86..x1.16 of the estimate; the mean factor is
  exp(sigma^2/2) = 1.011). The factor belongs to the job, so every attempt of it takes as long.

Failures: with probability ``failure_rate`` (default 0.02) a run fails, drawn per (seed, job_id, attempt); it fails
after a fraction of its true run time drawn uniformly in (0, 1) from the same generator. Otherwise it finishes
after the true run time. `true_end` is when the run ends (its finish or its failure); `outcome` says which.

Power limits: `set_power_limit` records a change in `executor.replay_power_changes` (one per deciding plan and
job) and the run advances from then on at the change's `time_factor` (run time relative to its dispatch limit), as
the one execution model `scheduling.domain.execution` computes: the true run time is work done at the dispatch
limit, a failure strikes after its fraction of that work, and `true_end` follows every change.

Preemption: `preempt` stops a live run at a checkpoint (`executor.replay_preemptions`, one per deciding plan and
job): the run keeps the work done by the checkpoint signal `save_h` before the stop (`kept_share` of the whole job,
`scheduling.domain.execution.kept_work_h`). The job's next run, on this or another replay executor of the
warehouse, resumes from that checkpoint: it first restores it for as long as it took to write (`restore_h`), then
does the rest of the job's true run time (`work_done` = the share kept).

Events of a run: ``dispatched`` at the plan time, ``started`` at start_time (``resumed`` for a run that resumes from a
checkpoint), ``power_changed`` at each change, then ``finished`` / ``failed`` at true_end, or ``cancelled`` /
``preempted`` at that time when `cancel` / `preempt` came first (a run cancelled before its start never starts).
`sync(now, since)` is a pure function of the stored runs and the window [since, now). Run `sync` for a window after that
hour's dispatches, cancels and power changes: their events at `now` itself belong to the window starting at `now`.

`running(now)` reports what a real executor knows, not the truth: the runs with start_time <= now < end, with the
limit in force and the plan's expected end (or, for a run that has outlived it, the next full hour after `now`,
the earliest the planner can see it end). Energy is not measured (`energy_kwh` NULL).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc
from scheduling.domain.execution import Segment, end_time, failure_work_h, kept_work_h, resume_segments
from scheduling.executors.base import (
    EVENT_COLUMNS,
    RECORD_COLUMNS,
    RUNNING_COLUMNS,
    DuplicateDispatchError,
    Executor,
    check_window,
    in_window,
    plan_time_of,
    sort_events,
    typed_frame,
)
from scheduling.executors.items import check_items
from scheduling.executors.replay_serving import ReplayServing
from warehouse.db import create_tables, reader, table_exists, writer

TABLE = "executor.replay_runs"
RUN_COLUMNS: dict[str, str] = {
    "executor": "VARCHAR NOT NULL",  # the executor's name: several replay executors may share a warehouse
    "plan_id": "VARCHAR NOT NULL",
    "job_id": "VARCHAR NOT NULL",  # planner id, tenant/job_id
    "tenant": "VARCHAR",
    "queue_job_id": "VARCHAR NOT NULL",
    "attempt": "INTEGER NOT NULL",
    "run_ref": "VARCHAR NOT NULL",  # the executor_ref of the dispatch
    "cluster": "VARCHAR NOT NULL",
    "region": "VARCHAR",
    "node": "VARCHAR",
    "gpu_devices": "VARCHAR",
    "gpu_count": "INTEGER",
    "gpu_milli": "INTEGER",
    "power_limit_w": "DOUBLE",
    "dispatched_at": "TIMESTAMPTZ NOT NULL",  # the plan's time
    "start_time": "TIMESTAMPTZ NOT NULL",
    "est_end": "TIMESTAMPTZ NOT NULL",  # the plan's end_time
    "est_duration_h": "DOUBLE NOT NULL",  # the estimate the plan used
    "true_duration_h": "DOUBLE NOT NULL",  # the whole job's run time here: truth file, or estimate x noise
    "duration_source": "VARCHAR NOT NULL",  # truth | noise
    "outcome": "VARCHAR NOT NULL",  # finished | failed
    "true_end": "TIMESTAMPTZ NOT NULL",  # end of the run when not cancelled: the finish or the failure
    "work_h": "DOUBLE",  # hours at the dispatch limit the run does until true_end (all of it, or until it fails)
    "cancelled_at": "TIMESTAMPTZ",
    "work_done": "DOUBLE",  # share of the job done before this run (the checkpoint it resumes from; 0: a first run)
    "restore_h": "DOUBLE",  # hours reading that checkpoint at the start (no progress)
    "preempted_at": "TIMESTAMPTZ",
    "kept_share": "DOUBLE",  # share of the job done at the checkpoint its preemption wrote
    "checkpoint_h": "DOUBLE",  # hours the job had to write that checkpoint (and needs to read it back)
    "expected_energy_kwh": "DOUBLE",
    "expected_kgco2e": "DOUBLE",
}
DDL = f"""
CREATE SCHEMA IF NOT EXISTS executor;
CREATE TABLE IF NOT EXISTS {TABLE} (
    {", ".join(f"{name} {kind}" for name, kind in RUN_COLUMNS.items())},
    PRIMARY KEY (executor, plan_id, job_id)
);
"""
CHANGES = "executor.replay_power_changes"
CHANGE_COLUMNS: dict[str, str] = {
    "executor": "VARCHAR NOT NULL",
    "change_plan_id": "VARCHAR NOT NULL",  # the plan that decided the change (its idempotency key with job_id)
    "job_id": "VARCHAR NOT NULL",
    "plan_id": "VARCHAR NOT NULL",  # the run's: the plan that dispatched it
    "changed_at": "TIMESTAMPTZ NOT NULL",
    "power_limit_w": "DOUBLE NOT NULL",
    "time_factor": "DOUBLE NOT NULL",  # run time at this limit relative to the run's dispatch limit
    "change_ref": "VARCHAR NOT NULL",
}
DDL += "".join(
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {name} {RUN_COLUMNS[name]};\n"
    for name in ("work_h", "work_done", "restore_h", "preempted_at", "kept_share", "checkpoint_h")
)
PREEMPTIONS = "executor.replay_preemptions"
PREEMPTION_COLUMNS: dict[str, str] = {
    "executor": "VARCHAR NOT NULL",
    "preempt_plan_id": "VARCHAR NOT NULL",  # the plan that decided it (its idempotency key with job_id)
    "job_id": "VARCHAR NOT NULL",
    "plan_id": "VARCHAR NOT NULL",  # the run's: the plan that dispatched it
    "preempted_at": "TIMESTAMPTZ NOT NULL",
    "save_h": "DOUBLE NOT NULL",
    "kept_share": "DOUBLE NOT NULL",
    "preempt_ref": "VARCHAR NOT NULL",
}
DDL += f"""
CREATE TABLE IF NOT EXISTS {PREEMPTIONS} (
    {", ".join(f"{name} {kind}" for name, kind in PREEMPTION_COLUMNS.items())},
    PRIMARY KEY (executor, preempt_plan_id, job_id)
);
"""
DDL += f"""
CREATE TABLE IF NOT EXISTS {CHANGES} (
    {", ".join(f"{name} {kind}" for name, kind in CHANGE_COLUMNS.items())},
    PRIMARY KEY (executor, change_plan_id, job_id)
);
"""
DEFAULT_SIGMA = 0.15
DEFAULT_FAILURE_RATE = 0.02


def _rng(*parts) -> np.random.Generator:
    """A generator seeded by the text of `parts` (stable across processes and platforms)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def noise_factor(job_id: str, sigma: float, seed: int = 0) -> float:
    """The job's true/estimated run-time factor: exp(sigma * z), z ~ N(0, 1) seeded by (seed, job_id)."""
    return float(math.exp(sigma * _rng(seed, "duration", job_id).standard_normal()))


def failure_draw(job_id: str, attempt: int, failure_rate: float, seed: int = 0) -> float | None:
    """The fraction of its run after which attempt `attempt` of `job_id` fails, or None when it does not fail."""
    rng = _rng(seed, "failure", job_id, int(attempt))
    fails, fraction = rng.random(), rng.random()
    return float(fraction) if fails < failure_rate else None


def read_truth(path: str | Path) -> dict[str, float]:
    """job_id -> true_duration_h from a truth CSV; ValueError naming the file, row and field of a bad value."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"replay truth file {path} does not exist (setting 'truth')")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col in ("job_id", "true_duration_h"):
        if col not in frame.columns:
            raise ValueError(f"{path}: missing column {col!r}; header is {list(frame.columns)}")
    out: dict[str, float] = {}
    for i, (job, raw) in enumerate(zip(frame["job_id"], frame["true_duration_h"])):
        row = i + 2  # header is line 1
        job = job.strip()
        if not job:
            raise ValueError(f"{path}, row {row}, field 'job_id': empty")
        try:
            hours = float(raw)
        except ValueError:
            raise ValueError(f"{path}, row {row}, field 'true_duration_h': not a number: {raw!r}") from None
        if not math.isfinite(hours) or hours <= 0:
            raise ValueError(f"{path}, row {row}, field 'true_duration_h': must be a positive number, got {raw!r}")
        if job in out:
            raise ValueError(f"{path}, row {row}, field 'job_id': {job!r} listed twice")
        out[job] = hours
    return out


class ReplayExecutor(Executor):
    """Runs in replayed time (see the module doc). Settings: `truth`, `sigma`, `failure_rate`, `seed`, `name`."""

    kind = "replay"
    job_files = ()  # it runs the dispatch items; no Pod manifests or batch scripts to read
    changes_power_limits = True
    preempts = True
    serves = True
    SETTINGS = ("name", "truth", "sigma", "failure_rate", "seed")

    def __init__(
        self,
        *,
        db_path=None,
        name: str | None = None,
        truth: str | Path | None = None,
        sigma: float = DEFAULT_SIGMA,
        failure_rate: float = DEFAULT_FAILURE_RATE,
        seed: int = 0,
    ):
        super().__init__(name)
        self.db_path = db_path
        self.sigma = float(sigma)
        self.failure_rate = float(failure_rate)
        self.seed = int(seed)
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"executor {self.name!r}: setting 'sigma' must be >= 0, got {sigma!r}")
        if not 0 <= self.failure_rate <= 1:
            raise ValueError(f"executor {self.name!r}: setting 'failure_rate' must be in [0, 1], got {failure_rate!r}")
        self.truth_path = None if truth is None else Path(truth)
        self.truth = {} if truth is None else read_truth(truth)
        self.serving = ReplayServing(self.name, db_path)

    # ------------------------------------------------------------------------------------------- services

    def scale_service(self, key: str, at, *, plan_id: str, provision: dict) -> str | None:
        return self.serving.scale(key, at, plan_id=plan_id, provision=provision)

    def service_scaling_ref(self, plan_id: str, key: str) -> str | None:
        return self.serving.scaling_ref(plan_id, key)

    def service_usage(self, now, since=None) -> pd.DataFrame:
        return self.serving.usage(now, since)

    # ------------------------------------------------------------------------------------------- dispatch

    def run_ref(self, plan_id: str, job_id: str) -> str:
        return f"{self.name}:{plan_id}:{job_id}"

    def plan_runs(
        self, plan_id: str, items: pd.DataFrame, checkpoints: dict[str, tuple[float, float]] | None = None
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The runs `items` would get (RUN_COLUMNS) and one record per job; pure (no warehouse access).
        `checkpoints`: job -> (share done, hours to restore) of the checkpoint a job resumes from."""
        checkpoints = checkpoints or {}
        dispatched_at = plan_time_of(plan_id)
        items = check_items(items)
        runs, records = [], []
        for row in items.to_dict(orient="records"):
            job = row["job_id"]
            if row["start_time"] < dispatched_at:
                error = f"start_time {row['start_time']} is before the plan's time {dispatched_at}"
                records.append({"job_id": job, "executor_ref": None, "error": error})
                continue
            done, restore_h = checkpoints.get(job, (0.0, 0.0))
            truth = self.truth.get(job, self.truth.get(str(row["queue_job_id"])))
            if truth is not None:
                hours, source = truth, "truth"
            else:  # the plan's estimate of the whole job: its run less the restore, over the share it takes as left
                work_est_h = max(float(row["est_duration_h"]) - restore_h, 1e-9)
                whole_h = work_est_h / (1.0 - float(row["work_done"]))
                hours, source = whole_h * noise_factor(job, self.sigma, self.seed), "noise"
            fraction = failure_draw(job, int(row["attempt"]), self.failure_rate, self.seed)
            ran_h = failure_work_h(hours * (1.0 - done), fraction)
            ref = self.run_ref(plan_id, job)
            runs.append(
                {
                    **{k: row.get(k) for k in RUN_COLUMNS if k in row},
                    "executor": self.name,
                    "plan_id": plan_id,
                    "run_ref": ref,
                    "dispatched_at": dispatched_at,
                    "est_end": row["end_time"],
                    "true_duration_h": hours,
                    "duration_source": source,
                    "outcome": "finished" if fraction is None else "failed",
                    "true_end": end_time(resume_segments(row["start_time"], restore_h), ran_h),
                    "work_h": ran_h,
                    "cancelled_at": None,
                    "work_done": done,
                    "restore_h": restore_h,
                }
            )
            records.append({"job_id": job, "executor_ref": ref, "error": None})
        frame = typed_frame(runs, {k: v.split()[0] for k, v in RUN_COLUMNS.items()})
        return frame, pd.DataFrame(records, columns=list(RECORD_COLUMNS))

    def dispatch(self, plan_id: str, items: pd.DataFrame) -> pd.DataFrame:
        """Record a run per item in one transaction; DuplicateDispatchError when one of them has a run already."""
        with writer(self.db_path) as con:
            create_tables(con, DDL)
            runs, records = self.plan_runs(plan_id, items, _checkpoints(con, items["job_id"]))
            if runs.empty:
                return records
            con.execute("BEGIN TRANSACTION")
            try:
                con.register("_runs", runs)
                dup = con.execute(
                    f"SELECT r.job_id FROM {TABLE} AS r JOIN _runs AS n USING (executor, plan_id, job_id) "
                    "ORDER BY r.job_id LIMIT 5"
                ).fetchall()
                if dup:
                    raise DuplicateDispatchError(
                        f"executor {self.name!r}, plan {plan_id}: job(s) {[d[0] for d in dup]} were dispatched already"
                    )
                con.execute(f"INSERT INTO {TABLE} BY NAME SELECT * FROM _runs")
                con.unregister("_runs")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return records

    def lookup(self, plan_id: str, job_id: str) -> str | None:
        return self._ref(TABLE, "run_ref", "plan_id", plan_id, job_id)

    def _ref(self, table: str, ref: str, by_plan: str, plan_id: str, job_id: str) -> str | None:
        """Column `ref` of this executor's row of `table` keyed by (`by_plan` = plan_id, job_id), or None."""
        try:
            with reader(self.db_path) as con:
                if not table_exists(con, table):
                    return None
                row = con.execute(
                    f"SELECT {ref} FROM {table} WHERE executor = ? AND {by_plan} = ? AND job_id = ?",
                    [self.name, plan_id, str(job_id)],
                ).fetchone()
        except FileNotFoundError:
            return None
        return None if row is None else str(row[0])

    # ------------------------------------------------------------------------------------------- reading

    def runs(self, now=None, since=None) -> pd.DataFrame:
        """This executor's stored runs (those dispatched by `now` and not ended by `since`, when given)."""
        sql, params = f"SELECT * FROM {TABLE} WHERE executor = ?", [self.name]
        if now is not None:
            sql += " AND dispatched_at <= ?"
            params.append(utc(now).to_pydatetime())
        if since is not None:
            sql += " AND least(cancelled_at, preempted_at, true_end) >= ?"
            params.append(utc(since).to_pydatetime())
        try:
            with reader(self.db_path) as con:
                if not table_exists(con, TABLE):
                    return typed_frame([], {k: v.split()[0] for k, v in RUN_COLUMNS.items()})
                frame = con.execute(sql + " ORDER BY plan_id, job_id", params).df()
        except FileNotFoundError:
            return typed_frame([], {k: v.split()[0] for k, v in RUN_COLUMNS.items()})
        for col in ("dispatched_at", "start_time", "est_end", "true_end", "cancelled_at", "preempted_at"):
            frame[col] = pd.to_datetime(frame[col], utc=True)
        return frame

    def changes(self, job_ids=None) -> pd.DataFrame:
        """This executor's power changes (CHANGE_COLUMNS), of `job_ids` when given, in time order."""
        empty = typed_frame([], {k: v.split()[0] for k, v in CHANGE_COLUMNS.items()})
        sql, params = f"SELECT * FROM {CHANGES} WHERE executor = ?", [self.name]
        try:
            with reader(self.db_path) as con:
                if not table_exists(con, CHANGES):
                    return empty
                frame = con.execute(sql + " ORDER BY job_id, plan_id, changed_at", params).df()
        except FileNotFoundError:
            return empty
        if job_ids is not None:
            frame = frame[frame["job_id"].isin(set(job_ids))]
        frame["changed_at"] = pd.to_datetime(frame["changed_at"], utc=True)
        return frame.reset_index(drop=True)

    def sync(self, now, since=None) -> pd.DataFrame:
        since, now = check_window(since, now)
        runs = self.runs(now=now, since=since)
        by_run = _changes_by_run(self.changes(runs["job_id"]) if len(runs) else None)
        events = []
        for run in runs.to_dict(orient="records"):
            end, how = run_end(run)
            stream = [("dispatched", run["dispatched_at"], run["power_limit_w"])]
            if how != "cancelled" or end > run["start_time"]:
                resumed = pd.notna(run.get("work_done")) and run["work_done"] > 0
                stream.append(("resumed" if resumed else "started", run["start_time"], run["power_limit_w"]))
            limit = run["power_limit_w"]
            for change in by_run.get((run["plan_id"], run["job_id"]), []):
                if change["changed_at"] < end:
                    limit = change["power_limit_w"]
                    stream.append(("power_changed", change["changed_at"], limit))
            stream.append((how, end, limit))
            for event, at, watts in stream:
                events.append({**self._event_fields(run), "event": event, "event_time": at, "power_limit_w": watts})
        frame = typed_frame(events, EVENT_COLUMNS)
        return sort_events(frame[in_window(frame["event_time"], since, now)])

    def _event_fields(self, run: dict) -> dict:
        return {
            "tenant": run["tenant"],
            "job_id": run["queue_job_id"],
            "planner_job_id": run["job_id"],
            "executor": self.name,
            "executor_ref": run["run_ref"],
            "plan_id": run["plan_id"],
            "attempt": run["attempt"],
            "cluster": run["cluster"],
            "node": run["node"],
            "gpu_devices": run["gpu_devices"],
            "gpu_count": run["gpu_count"],
            "gpu_milli": run["gpu_milli"],
            "power_limit_w": run["power_limit_w"],
            "energy_kwh": None,
        }

    def running(self, now) -> pd.DataFrame:
        now = utc(now)
        runs = self.runs(now=now, since=now)  # dispatched by now, not ended before now
        ended = pd.Series([run_end(r)[0] for r in runs.to_dict(orient="records")], index=runs.index, dtype=object)
        runs = runs[(runs["start_time"] <= now) & (pd.to_datetime(ended, utc=True) > now)]
        by_run = _changes_by_run(self.changes(runs["job_id"]) if len(runs) else None)
        limits = [
            next(
                (
                    c["power_limit_w"]
                    for c in reversed(by_run.get((r["plan_id"], r["job_id"]), []))
                    if c["changed_at"] <= now
                ),
                r["power_limit_w"],
            )
            for r in runs.to_dict(orient="records")
        ]
        runs = runs.assign(power_limit_w=limits)
        next_hour = now.floor("h") + pd.Timedelta(hours=1)
        rows = [
            {
                "job_id": r["job_id"],
                "tenant": r["tenant"],
                "queue_job_id": r["queue_job_id"],
                "plan_id": r["plan_id"],
                "attempt": r["attempt"],
                "executor": self.name,
                "executor_ref": r["run_ref"],
                "cluster": r["cluster"],
                "node": r["node"],
                "gpu_devices": r["gpu_devices"],
                "gpu_count": r["gpu_count"],
                "gpu_milli": r["gpu_milli"],
                "power_limit_w": r["power_limit_w"],
                "start_time": r["start_time"],
                "end_time": r["est_end"] if r["est_end"] > now else next_hour,
                "confirmed": True,
            }
            for r in runs.to_dict(orient="records")
        ]
        return typed_frame(rows, RUNNING_COLUMNS).sort_values("job_id", kind="mergesort").reset_index(drop=True)

    # ------------------------------------------------------------------------------------------- power limits

    def change_ref(self, plan_id: str, job_id: str) -> str:
        return f"{self.name}:{plan_id}:{job_id}:power"

    def set_power_limit(self, job_id: str, watts: float, at, *, plan_id: str, time_factor: float = 1.0) -> str | None:
        """Record the change and move the run's true end (see the module doc); the same (plan_id, job_id) again
        returns the first change's ref and changes nothing. None when the job has no live run at `at`."""
        at = utc(at)
        if not (math.isfinite(float(watts)) and float(watts) > 0):
            raise ValueError(f"job {job_id}: power limit must be a positive number of watts, got {watts!r}")
        if not (math.isfinite(float(time_factor)) and float(time_factor) > 0):
            raise ValueError(f"job {job_id}: time_factor must be a positive number, got {time_factor!r}")
        job_id, watts, time_factor = str(job_id), float(watts), float(time_factor)
        return self._once(
            (CHANGES, "change_ref", "change_plan_id"),
            job_id,
            at,
            plan_id,
            lambda con, live: self._record_change(con, live, job_id, watts, at, plan_id, time_factor),
        )

    def _once(self, key: tuple[str, str, str], job_id: str, at, plan_id: str, act) -> str | None:
        """In one transaction: the ref of the action plan `plan_id` took on `job_id` already (`key`: its table, ref
        column and deciding-plan column), else `act(con, live)` on the job's run live at `at` (`_live_run`); None
        when it has none."""
        table, ref, by_plan = key
        with writer(self.db_path) as con:
            create_tables(con, DDL)
            con.execute("BEGIN TRANSACTION")
            try:
                done = con.execute(
                    f"SELECT {ref} FROM {table} WHERE executor = ? AND {by_plan} = ? AND job_id = ?",
                    [self.name, plan_id, job_id],
                ).fetchone()
                if done is not None:
                    out = str(done[0])
                else:
                    live = self._live_run(con, job_id, at)
                    out = None if live is None else act(con, live)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return out

    def _record_change(self, con, live: tuple, job_id: str, watts: float, at, plan_id: str, time_factor: float) -> str:
        run_plan, start, work_h, restore_h = live[0], utc(live[1]), float(live[2]), float(live[3])
        earlier = con.execute(
            f"SELECT changed_at, time_factor FROM {CHANGES} WHERE executor = ? AND plan_id = ? AND job_id = ? "
            "ORDER BY changed_at",
            [self.name, run_plan, job_id],
        ).fetchall()
        if earlier and utc(earlier[-1][0]) > at:
            raise ValueError(f"job {job_id}: a power change at {at} comes before the last one ({earlier[-1][0]})")
        segments = self._segments(start, restore_h, [*earlier, (at, time_factor)])
        ref = self.change_ref(plan_id, job_id)
        con.execute(
            f"INSERT INTO {CHANGES} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [self.name, plan_id, job_id, run_plan, at.to_pydatetime(), watts, time_factor, ref],
        )
        con.execute(
            f"UPDATE {TABLE} SET true_end = ? WHERE executor = ? AND plan_id = ? AND job_id = ?",
            [end_time(segments, work_h).to_pydatetime(), self.name, run_plan, job_id],
        )
        return ref

    def _live_run(self, con, job_id: str, at) -> tuple | None:
        """(plan_id, start_time, work_h, restore_h, true_duration_h, work_done) of the job's run live at `at`."""
        return con.execute(
            f"SELECT plan_id, start_time, coalesce(work_h, epoch(true_end - start_time) / 3600.0), "
            f"coalesce(restore_h, 0), true_duration_h, coalesce(work_done, 0) FROM {TABLE} "
            "WHERE executor = ? AND job_id = ? AND start_time <= ? AND least(cancelled_at, preempted_at, true_end) > ? "
            "ORDER BY start_time DESC LIMIT 1",
            [self.name, job_id, *[at.to_pydatetime()] * 2],
        ).fetchone()

    @staticmethod
    def _segments(start, restore_h: float, changes) -> list[Segment]:
        """The run's segments (`execution.resume_segments`): restore, then its limits' time factors."""
        return resume_segments(start, restore_h, [Segment(utc(t), float(f)) for t, f in changes])

    def power_change_ref(self, plan_id: str, job_id: str) -> str | None:
        return self._ref(CHANGES, "change_ref", "change_plan_id", plan_id, job_id)

    # ------------------------------------------------------------------------------------------- preemption

    def preempt_ref(self, plan_id: str, job_id: str) -> str:
        return f"{self.name}:{plan_id}:{job_id}:preempt"

    def preempt(self, job_id: str, at, *, plan_id: str, save_h: float) -> str | None:
        """Stop the job's live run at `at`, keeping the work done by the checkpoint signal `save_h` earlier
        (`execution.kept_work_h` over the run's restore and limits); the job's next run resumes from it. The same
        (plan_id, job_id) again returns the first preemption's ref and changes nothing. None when the job has no
        live run at `at`."""
        at = utc(at)
        if not (math.isfinite(float(save_h)) and float(save_h) >= 0):
            raise ValueError(f"job {job_id}: save_h must be a non-negative number of hours, got {save_h!r}")
        return self._once(
            (PREEMPTIONS, "preempt_ref", "preempt_plan_id"),
            str(job_id),
            at,
            plan_id,
            lambda con, live: self._record_preemption(con, live, str(job_id), at, plan_id, float(save_h)),
        )

    def _record_preemption(self, con, live: tuple, job_id: str, at, plan_id: str, save_h: float) -> str:
        run_plan, start, _, restore_h, whole_h, work_done = live
        changes = con.execute(
            f"SELECT changed_at, time_factor FROM {CHANGES} WHERE executor = ? AND plan_id = ? AND job_id = ? "
            "AND changed_at < ? ORDER BY changed_at",
            [self.name, run_plan, job_id, at.to_pydatetime()],
        ).fetchall()
        kept_h = kept_work_h(self._segments(utc(start), float(restore_h), changes), at, save_h)
        kept = min(float(work_done) + kept_h / float(whole_h), 1.0)
        ref = self.preempt_ref(plan_id, job_id)
        con.execute(
            f"INSERT INTO {PREEMPTIONS} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [self.name, plan_id, job_id, run_plan, at.to_pydatetime(), save_h, kept, ref],
        )
        con.execute(
            f"UPDATE {TABLE} SET preempted_at = ?, kept_share = ?, checkpoint_h = ? "
            "WHERE executor = ? AND plan_id = ? AND job_id = ?",
            [at.to_pydatetime(), kept, save_h, self.name, run_plan, job_id],
        )
        return ref

    def preemption_ref(self, plan_id: str, job_id: str) -> str | None:
        return self._ref(PREEMPTIONS, "preempt_ref", "preempt_plan_id", plan_id, job_id)

    # ------------------------------------------------------------------------------------------- cancel

    def cancel(self, job_id: str, now) -> bool:
        """End every live run of `job_id` (dispatched by `now`, not ended by `now`) at `now`."""
        now = utc(now)
        with writer(self.db_path) as con:
            create_tables(con, DDL)
            n = con.execute(
                f"UPDATE {TABLE} SET cancelled_at = ? WHERE executor = ? AND job_id = ? AND dispatched_at <= ? "
                "AND cancelled_at IS NULL AND least(preempted_at, true_end) > ? RETURNING job_id",
                [now.to_pydatetime(), self.name, str(job_id), now.to_pydatetime(), now.to_pydatetime()],
            ).fetchall()
        return bool(n)


def run_end(run: dict) -> tuple[pd.Timestamp, str]:
    """(when, how) a stored run ends: its finish or failure (`true_end`, `outcome`), or an earlier cancel or
    preemption."""
    end, how = run["true_end"], run["outcome"]
    for column, event in (("cancelled_at", "cancelled"), ("preempted_at", "preempted")):
        at = run.get(column)
        if at is not None and pd.notna(at) and at < end:
            end, how = at, event
    return end, how


def _checkpoints(con, job_ids) -> dict[str, tuple[float, float]]:
    """job -> (share done, hours to restore) of the checkpoint its latest preempted run (on any replay executor
    of the warehouse: a job moved between clusters takes its checkpoint along) left."""
    if not table_exists(con, TABLE):
        return {}
    con.register("_jobs", pd.DataFrame({"job_id": pd.Series(job_ids, dtype=str)}))
    rows = con.execute(
        f"SELECT r.job_id, r.kept_share, r.checkpoint_h FROM {TABLE} AS r JOIN _jobs USING (job_id) "
        "WHERE r.preempted_at IS NOT NULL QUALIFY row_number() OVER (PARTITION BY r.job_id ORDER BY r.preempted_at "
        "DESC) = 1"
    ).fetchall()
    con.unregister("_jobs")
    return {str(j): (float(k), float(c)) for j, k, c in rows}


def _changes_by_run(changes: pd.DataFrame | None) -> dict[tuple[str, str], list[dict]]:
    """(run plan_id, job_id) -> its power changes in time order."""
    out: dict[tuple[str, str], list[dict]] = {}
    if changes is None or changes.empty:
        return out
    for change in changes.sort_values("changed_at", kind="mergesort").to_dict(orient="records"):
        out.setdefault((change["plan_id"], change["job_id"]), []).append(change)
    return out
