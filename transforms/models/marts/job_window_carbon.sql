-- The actual carbon intensity integrated over each window a job ran in, was planned for, or would have run in had
-- it started at submission at home (the run-now counterfactual): ci_hours = sum over the window's hours of
-- overlap (h) x intensity (g/kWh) of the window's zone (marts.grid_hourly, direct production-based average),
-- so kgCO2e = draw (kW, PUE included) x ci_hours / 1000. missing_hours counts hours without intensity.
with attempts as (
    select * from {{ ref('int_jobs__attempts') }}
),

windows as (
    select tenant, job_id, attempt, plan_id, 'run' as kind, zone, started_at as w_start, ended_at as w_end
    from attempts
    where started_at is not null and ended_at > started_at

    union all

    select tenant, job_id, attempt, plan_id, 'planned' as kind, zone, planned_start as w_start, planned_end as w_end
    from attempts
    where planned_end > planned_start

    union all

    -- run now at home, at the default limit, for the run time it really took (the planned one scaled by the
    -- attempt's actual / planned ratio)
    select
        tenant, job_id, attempt, plan_id, 'run_now' as kind, home_zone as zone,
        submitted_at as w_start,
        submitted_at + to_microseconds(cast(
            run_now_duration_h * epoch(ended_at - started_at) / epoch(planned_end - planned_start) * 3600e6 as bigint
        )) as w_end
    from attempts
    where outcome = 'finished' and run_now_duration_h > 0 and planned_end > planned_start and ended_at > started_at
),

hours as (
    select
        w.*,
        unnest(generate_series({{ utc_hour('w.w_start') }}, w.w_end - interval 1 microsecond, interval 1 hour))
            as hour_utc
    from windows as w
),

weighted as (
    select
        h.tenant, h.job_id, h.attempt, h.plan_id, h.kind,
        epoch(least(h.w_end, h.hour_utc + interval 1 hour) - greatest(h.w_start, h.hour_utc)) / 3600.0 as overlap_h,
        g.carbon_intensity_direct_gco2_per_kwh as ci
    from hours as h
    left join {{ ref('grid_hourly') }} as g
        on g.region = h.zone and g.hour_utc = h.hour_utc
)

select
    tenant,
    job_id,
    attempt,
    plan_id,
    kind,
    {{ fixed_order_sum('overlap_h') }} as hours,
    {{ fixed_order_sum('overlap_h * ci') }} as ci_hours,
    coalesce({{ fixed_order_sum('overlap_h') }} filter (where ci is null), 0) as missing_hours
from weighted
group by tenant, job_id, attempt, plan_id, kind
