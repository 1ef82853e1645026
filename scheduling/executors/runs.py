"""Finished runs as the executors reported them, beside what the plan that dispatched them assumed: the runtime
feedback the plan service gives the predictor's refiner (`scheduling.models.performance.runs`).

    runs = finished_runs("2021-07-15T12:00Z")       # finished before T, newest `per_key` per job type x GPU model

One row per attempt that ended `finished` before `as_of` (`raw.job_events`: started -> finished; a run whose power
limit the plans changed counts its stretches at the dispatch limit's speed, `scheduling.domain.execution`, so that
`actual_h` is comparable with `planned_h`), joined with
its assignment in the plan that dispatched it (`plan.assignments`: planned start/end, GPU model and the `speed` the
plan assumed) and its job (`queue.jobs`: the job type). Failed and cancelled attempts are no observation; nor are
runs whose plan recorded no speed, nor jobs of a job type the profiles do not know (the planner estimated those with
their class's profile type, whose runs they are not). Only events before `as_of` count, as the loop's sync at T
loads the window [T-1h, T) (an event at T itself belongs to the next window), so a plan replayed at T sees the runs
it saw the first time.
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import utc
from scheduling.domain.execution import Segment, work_done_h
from scheduling.executors.events import TABLE as EVENTS
from scheduling.executors.power_log import TABLE as CHANGES
from scheduling.models.performance.runs import FEEDBACK_RUNS_PER_KEY, RUN_COLUMNS
from scheduling.queue import store
from scheduling.queue.estimate import KNOWN_JOB_TYPES
from warehouse.db import column_exists, reader, table_exists

ASSIGNMENTS = "plan.assignments"
COLUMNS = (*RUN_COLUMNS, "tenant", "queue_job_id", "attempt", "plan_id", "cluster", "started_at")

SQL = f"""
WITH attempts AS (
    SELECT tenant, job_id, planner_job_id, plan_id, attempt,
           min(event_time) FILTER (WHERE event = 'started') AS started_at,
           max(event_time) FILTER (WHERE event = 'finished') AS finished_at
    FROM {EVENTS}
    WHERE event_time < ?
    GROUP BY tenant, job_id, planner_job_id, plan_id, attempt
)
SELECT r.planner_job_id AS job_id, q.job_type, a.gpu_model, a.speed,
       epoch(a.end_time - a.start_time) / 3600.0 AS planned_h,
       epoch(r.finished_at - r.started_at) / 3600.0 AS actual_h,
       r.finished_at, r.tenant, r.job_id AS queue_job_id, r.attempt, r.plan_id, a.cluster, r.started_at
FROM attempts AS r
JOIN {ASSIGNMENTS} AS a ON a.plan_id = r.plan_id AND a.job_id = r.planner_job_id
JOIN {store.JOBS} AS q ON q.tenant = r.tenant AND q.job_id = r.job_id
WHERE r.finished_at IS NOT NULL AND r.started_at IS NOT NULL AND a.speed IS NOT NULL
QUALIFY row_number() OVER (
    PARTITION BY q.job_type, a.gpu_model ORDER BY r.finished_at DESC, r.planner_job_id DESC, r.attempt DESC
) <= ?
ORDER BY r.finished_at, r.planner_job_id, r.attempt
"""


def finished_runs(as_of, *, db_path=None, per_key: int = FEEDBACK_RUNS_PER_KEY) -> pd.DataFrame:
    """The runs finished before `as_of` (see the module doc), oldest first, at most the newest `per_key` of each job
    type and GPU model; empty (with the columns) while the warehouse has no events, plans or queue yet."""
    empty = pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    try:
        with reader(db_path) as con:
            if not all(table_exists(con, t) for t in (EVENTS, ASSIGNMENTS, store.JOBS)):
                return empty
            if not column_exists(con, ASSIGNMENTS, "speed"):
                return empty
            frame = con.execute(SQL, [utc(as_of).to_pydatetime(), int(per_key)]).df()
    except FileNotFoundError:
        return empty
    frame = frame[frame["job_type"].isin(KNOWN_JOB_TYPES)]
    for col in ("finished_at", "started_at"):
        frame[col] = pd.to_datetime(frame[col], utc=True)
    frame = _at_dispatch_limit(frame, as_of, db_path)
    return frame[list(COLUMNS)].reset_index(drop=True)


def _at_dispatch_limit(frame: pd.DataFrame, as_of, db_path) -> pd.DataFrame:
    """`actual_h` of the runs whose limit changed mid-run, as the hours they would have taken at their dispatch
    limit: each stretch's hours over its time factor (`plan.power_changes`) relative to that limit."""
    with reader(db_path) as con:
        if frame.empty or not table_exists(con, CHANGES):
            return frame
        changes = con.execute(
            f"SELECT e.plan_id, e.planner_job_id AS job_id, e.attempt, e.event_time, c.time_factor FROM {EVENTS} AS e "
            f"JOIN {CHANGES} AS c ON c.run_plan_id = e.plan_id AND c.job_id = e.planner_job_id "
            "AND c.changed_at = e.event_time WHERE e.event = 'power_changed' AND e.event_time < ? "
            "ORDER BY e.event_time",
            [utc(as_of).to_pydatetime()],
        ).df()
    if changes.empty:
        return frame
    frame = frame.copy()
    by_run = {key: g for key, g in changes.groupby(["plan_id", "job_id", "attempt"], sort=False)}
    for i, run in frame.iterrows():
        mine = by_run.get((run["plan_id"], run["job_id"], run["attempt"]))
        if mine is None:
            continue
        segments = [Segment(run["started_at"], 1.0)]
        segments += [Segment(t, f) for t, f in zip(pd.to_datetime(mine["event_time"], utc=True), mine["time_factor"])]
        frame.loc[i, "actual_h"] = work_done_h(segments, run["finished_at"])
    return frame
