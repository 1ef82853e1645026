"""Exactly-once power-limit changes of running jobs: `plan.power_changes`, an `action_log.ActionLog` keyed by
(plan_id, job_id).

    record_decisions(plan_id, changes, executor_of)      # the plan's decisions, once per plan (status intent)
    apply_power_changes(plan_id, executor)               # -> {"sent": [...], "reconciled": [...], ...}

The decisions are `scheduling.planning.recap`'s changed rows; an executor is asked `Executor.power_change_ref`,
then `Executor.set_power_limit`. Fail-open: a job whose change failed keeps running at the limit it had.
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import utc
from scheduling.executors.action_log import STATUS_COLUMNS, ActionLog

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
    **STATUS_COLUMNS,
}
LOG = ActionLog(
    TABLE,
    COLUMNS,
    "changed_at",
    lookup=lambda executor, plan_id, job: executor.power_change_ref(plan_id, job),
    send=lambda executor, row: executor.set_power_limit(
        str(row["job_id"]),
        float(row["to_limit_w"]),
        utc(row["changed_at"]),
        plan_id=row["plan_id"],
        time_factor=float(row["time_factor"]) if pd.notna(row["time_factor"]) else 1.0,
    ),
)
DDL = LOG.ddl


# write the plan's power changes (rows of `recap_running` with `changed`) as intents, once per plan
record_decisions = LOG.record
# plan.power_changes rows (of one plan, of some jobs), ordered by plan and job; empty without the table
read_changes = LOG.read
# carry out the plan's changes logged for an executor (`ActionLog.carry_out`)
apply_power_changes = LOG.carry_out
