-- One row per dispatched attempt of a job: planned against actual start, end and run time, the energy (measured
-- where the executor reported it or the job metered it with CodeCarbon / Zeus, energy_meter, else the draw of each
-- stretch at one power limit x its hours, plus the data transfer), and the realized carbon at the actual hourly
-- intensity: each stretch of the run at the cluster's zone over its hours, the data moved to a
-- cluster outside the home region at the mean of the home and the cluster's zone in the hour it starts (as the
-- planner prices a move and the simulator values it).
with attempts as (
    select * from {{ ref('int_jobs__attempts') }}
),

windows as (
    select * from {{ ref('job_window_carbon') }}
),

grid as (
    select region, hour_utc, carbon_intensity_direct_gco2_per_kwh as ci
    from {{ ref('grid_hourly') }}
),

runs as (
    select
        a.*,
        epoch(a.planned_end - a.planned_start) / 3600.0 as est_runtime_h,
        epoch(a.ended_at - a.started_at) / 3600.0 as actual_runtime_h,
        run.ci_hours / nullif(run.hours, 0) as mean_ci_gco2_per_kwh,
        run.kwh as run_kwh,
        run.gco2e as run_gco2e,
        run.missing_hours as ci_missing_hours,
        planned.ci_hours as planned_ci_hours,
        -- the intensity a data transfer is charged at: both ends of the network, in the hour the run starts
        0.5 * (run_home.ci + run_dest.ci) as transfer_ci,
        0.5 * (planned_home.ci + planned_dest.ci) as planned_transfer_ci
    from attempts as a
    left join windows as run
        on run.tenant = a.tenant and run.job_id = a.job_id and run.attempt = a.attempt and run.plan_id = a.plan_id
        and run.kind = 'run'
    left join windows as planned
        on planned.tenant = a.tenant and planned.job_id = a.job_id and planned.attempt = a.attempt
        and planned.plan_id = a.plan_id and planned.kind = 'planned'
    left join grid as run_home on run_home.region = a.home_zone and run_home.hour_utc = {{ utc_hour('a.started_at') }}
    left join grid as run_dest on run_dest.region = a.zone and run_dest.hour_utc = {{ utc_hour('a.started_at') }}
    left join grid as planned_home
        on planned_home.region = a.home_zone and planned_home.hour_utc = {{ utc_hour('a.planned_start') }}
    left join grid as planned_dest
        on planned_dest.region = a.zone and planned_dest.hour_utc = {{ utc_hour('a.planned_start') }}
),

energy as (
    select
        *,
        case
            when measured_energy_kwh is not null then measured_energy_kwh
            when actual_runtime_h is not null then run_kwh + transfer_kwh
        end as energy_kwh,
        case
            when measured_energy_kwh is not null then 'measured'
            when actual_runtime_h is not null then 'power_model'
        end as energy_source,
        case
            when measured_energy_kwh is not null then measured_energy_kwh * mean_ci_gco2_per_kwh
            when actual_runtime_h is not null
                then run_gco2e + transfer_kwh * coalesce(transfer_ci, mean_ci_gco2_per_kwh)
        end as realized_gco2e
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
    power_changes,
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
    case when energy_source = 'measured' then energy_meter end as energy_meter,
    mean_ci_gco2_per_kwh,
    ci_missing_hours,
    -- the run at the zone's actual intensity over the run, a data transfer at its ends' in the start hour
    realized_gco2e / 1000.0 as realized_kgco2e,
    expected_kgco2e,
    -- the planned window at the actual intensity, valued as the plan's forecast was: expected_kgco2e against this is
    -- the forecast's error alone
    (
        draw_kw * planned_ci_hours
        + transfer_kwh * coalesce(planned_transfer_ci, planned_ci_hours / nullif(est_runtime_h, 0))
    ) / 1000.0 as planned_window_actual_kgco2e,
    case when outcome = 'finished' then ended_at <= deadline end as deadline_met
from energy
