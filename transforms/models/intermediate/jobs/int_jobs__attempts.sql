-- One row per dispatched attempt of a job (tenant, job_id, attempt, plan_id): what the executor reported (start,
-- end, outcome, measured energy; else the energy the job metered itself, int_jobs__metered_energy) beside what the
-- plan that dispatched it expected (window, draw, zone, deadline, the run-now counterfactual's inputs). An attempt
-- with no terminal event yet has outcome 'running' (started) or 'dispatched'; 'unconfirmed' when the executor cannot
-- say (a hand-off through files). A preempted attempt is a partial run: the job's next attempt resumes its work.
with events as (
    select * from {{ ref('stg_jobs__events') }}
),

reported as (
    select
        tenant,
        job_id,
        planner_job_id,
        plan_id,
        attempt,
        min(executor) as executor,
        max(cluster) as cluster,
        max(node) as node,
        -- the limit the run started at (later power_changed events: int_jobs__power_segments)
        arg_min(power_limit_w, event_time) filter (
            where event in ('dispatched', 'started', 'resumed') and power_limit_w is not null
        ) as reported_power_limit_w,
        count(*) filter (where event = 'power_changed') as power_changes,
        -- resumed: a run that goes on from the job's checkpoint; preempted: one stopped at a checkpoint
        min(event_time) filter (where event in ('started', 'resumed')) as started_at,
        max(event_time) filter (where event in ('finished', 'failed', 'cancelled', 'preempted')) as ended_at,
        arg_max(event, event_time) filter (
            where event in ('finished', 'failed', 'cancelled', 'preempted')
        ) as terminal_event,
        bool_or(event = 'unconfirmed') as unconfirmed,
        {{ fixed_order_sum('energy_kwh') }} as measured_energy_kwh
    from events
    group by tenant, job_id, planner_job_id, plan_id, attempt
)

select
    r.tenant,
    r.job_id,
    r.planner_job_id,
    r.plan_id,
    r.attempt,
    r.executor,
    coalesce(r.cluster, a.cluster) as cluster,
    a.region,
    a.zone,
    r.node,
    coalesce(r.reported_power_limit_w, a.power_limit_w) as power_limit_w,
    r.power_changes,
    a.submitted_at,
    a.deadline,
    a.planned_start,
    a.planned_end,
    r.started_at,
    r.ended_at,
    case
        when r.terminal_event is not null then r.terminal_event
        when r.started_at is not null then 'running'
        when r.unconfirmed then 'unconfirmed'
        else 'dispatched'
    end as outcome,
    a.draw_kw,
    a.transfer_kwh,
    a.expected_energy_kwh,
    a.expected_kgco2e,
    coalesce(r.measured_energy_kwh, m.metered_energy_kwh) as measured_energy_kwh,
    case
        when r.measured_energy_kwh is not null then 'executor'
        when m.metered_energy_kwh is not null then m.energy_meter
    end as energy_meter,
    a.home_zone,
    a.run_now_kw,
    a.run_now_duration_h
from reported as r
left join {{ ref('stg_jobs__assignments') }} as a
    on a.plan_id = r.plan_id and a.planner_job_id = r.planner_job_id
left join {{ ref('int_jobs__metered_energy') }} as m
    on m.tenant = r.tenant and m.job_id = r.job_id and m.attempt = r.attempt and m.plan_id = r.plan_id
