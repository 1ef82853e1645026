"""Job intake: operators' jobs into `queue.jobs`, and queued jobs into the planner's job frame.

spec       the job spec: user fields, parsing, per-field checks, spec_hash
files      job files: YAML (`jobs:` list), JSON (list or {"jobs": [...]}), CSV (lists as a|b)
estimate   planner job type, hostable clusters, home cluster, run time and deadline of a queued job
checks     checks of parsed jobs against the fleet (regions, GPU models, node sizes, deadlines)
store      queue.jobs, queue.job_history, queue.submissions: DDL, states and transitions, list/show/cancel
intake     submissions (file, form, staging table) -> queue.jobs, rejections -> quarantine.rejected_rows
frame      queued jobs -> the planner's job frame (scheduling.domain.jobs.JOB_COLUMNS + executor columns)
trace      trace-derived demo jobs written as an intake file

Nothing is imported here, so that the DAG form can read `spec`'s enums and bounds without numpy or pandas.
"""
