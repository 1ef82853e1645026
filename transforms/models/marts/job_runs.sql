-- One row per dispatched attempt of a job: planned against actual start, end and run time, the energy (measured
-- where the executor reported it, else the plan's draw x the actual run time), and the realized carbon at the
-- actual hourly intensity of the cluster's zone.
with attempts as (
    select * from {{ ref('int_jobs__attempts') }}
),

windows as (
    select * from {{ ref('job_window_carbon') }}
),

runs as (
    select
        a.*,
        epoch(a.planned_end - a.planned_start) / 3600.0 as est_runtime_h,
        epoch(a.ended_at - a.started_at) / 3600.0 as actual_runtime_h,
        run.ci_hours / nullif(run.hours, 0) as mean_ci_gco2_per_kwh,
        run.missing_hours as ci_missing_hours,
        planned.ci_hours as planned_ci_hours
    from attempts as a
    left join windows as run
        on run.tenant = a.tenant and run.job_id = a.job_id and run.attempt = a.attempt and run.plan_id = a.plan_id
        and run.kind = 'run'
    left join windows as planned
        on planned.tenant = a.tenant and planned.job_id = a.job_id and planned.attempt = a.attempt
        and planned.plan_id = a.plan_id and planned.kind = 'planned'
),

energy as (
    select
        *,
        case
            when measured_energy_kwh is not null then measured_energy_kwh
            when actual_runtime_h is not null then draw_kw * actual_runtime_h + transfer_kwh
        end as energy_kwh,
        case
            when measured_energy_kwh is not null then 'measured'
            when actual_runtime_h is not null then 'power_model'
        end as energy_source
    from runs
)

select
    tenant,
    job_id,
    attempt,
    plan_id,
    planner_job_id,
    executor,
    cluster,
    region,
    zone,
    node,
    power_limit_w,
    outcome,
    submitted_at,
    deadline,
    planned_start,
    planned_end,
    started_at,
    ended_at,
    epoch(started_at - planned_start) / 3600.0 as start_delay_h,
    est_runtime_h,
    actual_runtime_h,
    100.0 * (actual_runtime_h - est_runtime_h) / nullif(est_runtime_h, 0) as runtime_error_pct,
    energy_kwh,
    energy_source,
    mean_ci_gco2_per_kwh,
    ci_missing_hours,
    -- energy spread evenly over the run (the data transfer too) at the zone's actual intensity
    energy_kwh * mean_ci_gco2_per_kwh / 1000.0 as realized_kgco2e,
    expected_kgco2e,
    -- the planned window at the actual intensity: expected_kgco2e against this is the forecast's error alone
    (draw_kw * planned_ci_hours + transfer_kwh * planned_ci_hours / nullif(est_runtime_h, 0)) / 1000.0
        as planned_window_actual_kgco2e,
    case when outcome = 'finished' then ended_at <= deadline end as deadline_met
from energy
