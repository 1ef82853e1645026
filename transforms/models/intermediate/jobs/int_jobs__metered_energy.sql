-- One row per attempt (tenant, job_id, attempt, plan_id) whose job measured its own energy with CodeCarbon or Zeus
-- (stg_telemetry__gpu_telemetry rows with a job_key): the attempt's energy in kWh and the meter it came from. A
-- reading belongs to the job's latest attempt that started at or before the reading's midpoint (else the job's
-- first attempt). Readings loaded twice (the same file under two names) count once. Per attempt, CodeCarbon (the
-- whole machine) wins over Zeus (GPUs only).
with readings as (
    select distinct on (log_format, job_key, meter_run_id, gpu_index, window_start_utc, ts_utc)
        log_format as meter,
        job_key as planner_job_id,
        meter_run_id,
        gpu_index,
        window_start_utc,
        ts_utc,
        energy_j,
        window_start_utc + (ts_utc - window_start_utc) / 2 as midpoint
    from {{ ref('stg_telemetry__gpu_telemetry') }}
    where log_format in ('codecarbon', 'zeus') and job_key is not null and energy_j is not null
    order by log_format, job_key, meter_run_id, gpu_index, window_start_utc, ts_utc, loaded_at
),

attempts as (
    select
        tenant,
        job_id,
        planner_job_id,
        plan_id,
        attempt,
        min(event_time) filter (where event in ('started', 'resumed')) as started_at
    from {{ ref('stg_jobs__events') }}
    group by tenant, job_id, planner_job_id, plan_id, attempt
),

assigned as (
    select
        a.tenant,
        a.job_id,
        a.plan_id,
        a.attempt,
        r.meter,
        r.energy_j
    from readings as r
    inner join attempts as a on a.planner_job_id = r.planner_job_id
    qualify row_number() over (
        partition by r.meter, r.planner_job_id, r.meter_run_id, r.gpu_index, r.window_start_utc, r.ts_utc
        order by
            (a.started_at <= r.midpoint) desc nulls last,
            case when a.started_at <= r.midpoint then a.started_at end desc nulls last,
            a.started_at asc nulls last,
            a.attempt asc,
            a.plan_id asc
    ) = 1
),

per_meter as (
    select
        tenant,
        job_id,
        plan_id,
        attempt,
        meter,
        {{ fixed_order_sum('energy_j') }} / 3.6e6 as energy_kwh,
        count(*) as readings
    from assigned
    group by tenant, job_id, plan_id, attempt, meter
)

select
    tenant,
    job_id,
    plan_id,
    attempt,
    meter as energy_meter,
    energy_kwh as metered_energy_kwh,
    readings as meter_readings
from per_meter
qualify row_number() over (
    partition by tenant, job_id, plan_id, attempt order by case meter when 'codecarbon' then 0 else 1 end
) = 1
