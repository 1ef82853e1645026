-- The actual carbon intensity integrated over each window a job ran in, was planned for, or would have run in had
-- it started at submission at home (the run-now counterfactual): ci_hours = sum over the window's hours of
-- overlap (h) x intensity (g/kWh) of the window's zone (marts.grid_hourly, direct production-based average),
-- so kgCO2e = draw (kW, PUE included) x ci_hours / 1000. missing_hours counts hours without intensity. A run is
-- valued piecewise: one window per stretch at one power limit (int_jobs__power_segments), each at its own draw
-- (kwh, gco2e).
with attempts as (
    select * from {{ ref('int_jobs__attempts') }}
),

segments as (
    select * from {{ ref('int_jobs__power_segments') }}
    where seg_end > seg_start
),

-- the hours an attempt's run would have taken at its dispatch limit: each stretch's hours over its time factor
dispatch_hours as (
    select tenant, job_id, attempt, plan_id,
           {{ fixed_order_sum('epoch(seg_end - seg_start) / 3600.0 / rel_time_factor') }} as hours_at_dispatch_limit
    from segments
    group by tenant, job_id, attempt, plan_id
),

windows as (
    -- the run, one window per stretch at one power limit, with the stretch's draw
    select tenant, job_id, attempt, plan_id, 'run' as kind, zone, seg_start as w_start, seg_end as w_end, draw_kw
    from segments

    union all

    select
        tenant, job_id, attempt, plan_id, 'planned' as kind, zone, planned_start as w_start, planned_end as w_end,
        draw_kw
    from attempts
    where planned_end > planned_start

    union all

    -- run now at home, at the default limit, for the run time it really took (the planned one scaled by the
    -- attempt's actual / planned ratio, its stretches at lowered or raised limits counted at the dispatch limit)
    select
        a.tenant, a.job_id, a.attempt, a.plan_id, 'run_now' as kind, a.home_zone as zone,
        a.submitted_at as w_start,
        a.submitted_at + to_microseconds(cast(
            a.run_now_duration_h * d.hours_at_dispatch_limit * 3600.0 / epoch(a.planned_end - a.planned_start)
            * 3600e6 as bigint
        )) as w_end,
        a.run_now_kw as draw_kw
    from attempts as a
    inner join dispatch_hours as d
        on d.tenant = a.tenant and d.job_id = a.job_id and d.attempt = a.attempt and d.plan_id = a.plan_id
    where a.outcome = 'finished' and a.run_now_duration_h > 0 and a.planned_end > a.planned_start
        and a.ended_at > a.started_at
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
        h.draw_kw,
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
    coalesce({{ fixed_order_sum('overlap_h') }} filter (where ci is null), 0) as missing_hours,
    -- at each stretch's own draw (a run whose power limit changed): kWh and gCO2e (hours without intensity: none)
    {{ fixed_order_sum('overlap_h * draw_kw') }} as kwh,
    {{ fixed_order_sum('overlap_h * draw_kw * ci') }} as gco2e
from weighted
group by tenant, job_id, attempt, plan_id, kind
