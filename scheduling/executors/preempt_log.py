"""Exactly-once preemptions of running jobs at a checkpoint: `plan.preemptions`, an `action_log.ActionLog` keyed
by (plan_id, job_id).

    record_preemptions(plan_id, decisions, executor_of)  # the plan's decisions, once per plan (status intent)
    apply_preemptions(plan_id, executor)                 # -> {"sent": [...], "reconciled": [...], ...}

A decision names the job's run (run_plan_id, attempt), the hours its checkpoint takes to write (`save_h`) and the
share of the job the planner expects it to keep (`work_done`, `scheduling.domain.execution.kept_work_h` over the
planned run): the queue takes that share over when the executor reports the job `preempted`. An executor is asked
`Executor.preemption_ref`, then `Executor.preempt`. Fail-open: a job whose preemption failed runs on.
"""

from __future__ import annotations

from common.timeutil import utc
from scheduling.executors.action_log import STATUS_COLUMNS, ActionLog

TABLE = "plan.preemptions"
COLUMNS: dict[str, str] = {
    "plan_id": "VARCHAR NOT NULL",  # the plan that decided the preemption
    "job_id": "VARCHAR NOT NULL",
    "run_plan_id": "VARCHAR",  # the run's dispatch plan
    "attempt": "INTEGER",
    "cluster": "VARCHAR",
    "executor": "VARCHAR NOT NULL",
    "preempt_at": "TIMESTAMPTZ NOT NULL",  # the plan's time
    "reason": "VARCHAR",  # carbon | deadline | drained | chunk
    "save_h": "DOUBLE NOT NULL",
    "work_done": "DOUBLE NOT NULL",  # share of the job the checkpoint is expected to keep
    "kgco2e_kept": "DOUBLE",  # forecast kgCO2e of running on
    "kgco2e": "DOUBLE",  # forecast kgCO2e of stopping now and resuming later, the overhead included
    "resume_at": "TIMESTAMPTZ",  # the hour the decision expects the job to start again
    **STATUS_COLUMNS,
}
LOG = ActionLog(
    TABLE,
    COLUMNS,
    "preempt_at",
    lookup=lambda executor, plan_id, job: executor.preemption_ref(plan_id, job),
    send=lambda executor, row: executor.preempt(
        str(row["job_id"]), utc(row["preempt_at"]), plan_id=row["plan_id"], save_h=float(row["save_h"])
    ),
)
DDL = LOG.ddl


# write the plan's preemptions (rows of `pausing.pause_running`) as intents, once per plan
record_preemptions = LOG.record
# plan.preemptions rows (of one plan, of some jobs), ordered by plan and job; empty without the table
read_preemptions = LOG.read
# carry out the plan's preemptions logged for an executor (`ActionLog.carry_out`)
apply_preemptions = LOG.carry_out
