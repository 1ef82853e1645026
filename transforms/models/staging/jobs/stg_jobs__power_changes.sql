-- The plans' power-limit changes of running jobs (plan.power_changes), keyed by (plan_id, planner job id): the new
-- limit, its draw and its run-time factor, as the deciding plan computed them; empty until a plan changed one.
with source as (
    {{ optional_source('plan', 'power_changes', {
        'plan_id': 'varchar',
        'job_id': 'varchar',
        'run_plan_id': 'varchar',
        'attempt': 'integer',
        'changed_at': 'timestamptz',
        'from_limit_w': 'double',
        'to_limit_w': 'double',
        'time_factor': 'double',
        'draw_kw': 'double',
        'reason': 'varchar',
        'quantile': 'double',
        'status': 'varchar',
    }) }}
)

select
    plan_id,
    job_id as planner_job_id,
    run_plan_id,
    attempt,
    changed_at,
    from_limit_w,
    to_limit_w,
    time_factor,
    draw_kw,
    reason,
    quantile,
    status
from source
