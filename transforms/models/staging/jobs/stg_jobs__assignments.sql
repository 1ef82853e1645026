-- The stored plans' assignments (plan.assignments), keyed by (plan_id, planner job id); an empty relation until a
-- plan has been stored. Older plans lack the counterfactual columns: they read as NULL.
with source as (
    {{ optional_source('plan', 'assignments', {
        'plan_id': 'varchar',
        'job_id': 'varchar',
        'cluster': 'varchar',
        'region': 'varchar',
        'zone': 'varchar',
        'start_time': 'timestamptz',
        'end_time': 'timestamptz',
        'submit_time': 'timestamptz',
        'deadline': 'timestamptz',
        'power_limit_w': 'double',
        'expected_energy_kwh': 'double',
        'expected_kgco2e': 'double',
        'status': 'varchar',
        'draw_kw': 'double',
        'transfer_kwh': 'double',
        'home_cluster': 'varchar',
        'home_zone': 'varchar',
        'run_now_kw': 'double',
        'run_now_duration_h': 'double',
    }) }}
)

select
    plan_id,
    job_id as planner_job_id,
    cluster,
    region,
    zone,
    start_time as planned_start,
    end_time as planned_end,
    submit_time as submitted_at,
    deadline,
    power_limit_w,
    expected_energy_kwh,
    expected_kgco2e,
    status,
    draw_kw,
    coalesce(transfer_kwh, 0) as transfer_kwh,
    home_cluster,
    home_zone,
    run_now_kw,
    run_now_duration_h
from source
