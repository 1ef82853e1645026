-- One row per stretch of a started attempt at one GPU power limit: from its start at the dispatch limit and the
-- plan's draw, then from each power_changed event at the limit, draw and run-time factor the deciding plan recorded
-- (stg_jobs__power_changes; a change no plan recorded keeps the draw and factor it had), to the next change or the
-- attempt's end (NULL while it runs). rel_time_factor: run time at the stretch's limit relative to the dispatch
-- limit, so a stretch does seg_hours / rel_time_factor hours of the work planned at the dispatch limit.
with attempts as (
    select * from {{ ref('int_jobs__attempts') }}
    where started_at is not null
),

changes as (
    select
        a.tenant, a.job_id, a.attempt, a.plan_id, a.zone, a.ended_at,
        e.event_time as seg_start,
        e.power_limit_w,
        c.draw_kw,
        c.time_factor as rel_time_factor
    from attempts as a
    inner join {{ ref('stg_jobs__events') }} as e
        on e.tenant = a.tenant and e.job_id = a.job_id and e.attempt = a.attempt and e.plan_id = a.plan_id
        and e.event = 'power_changed' and e.event_time >= a.started_at
        and (a.ended_at is null or e.event_time < a.ended_at)
    left join {{ ref('stg_jobs__power_changes') }} as c
        on c.run_plan_id = e.plan_id and c.planner_job_id = e.planner_job_id and c.changed_at = e.event_time
),

stretches as (
    select
        tenant, job_id, attempt, plan_id, zone, ended_at, started_at as seg_start, power_limit_w, draw_kw,
        1.0 as rel_time_factor
    from attempts

    union all

    select tenant, job_id, attempt, plan_id, zone, ended_at, seg_start, power_limit_w, draw_kw, rel_time_factor
    from changes
),

ordered as (
    select
        *,
        lead(seg_start) over (partition by tenant, job_id, attempt, plan_id order by seg_start) as next_start,
        row_number() over (partition by tenant, job_id, attempt, plan_id order by seg_start) as seg
    from stretches
)

select
    tenant,
    job_id,
    attempt,
    plan_id,
    seg,
    zone,
    power_limit_w,
    -- a change no plan recorded: the draw and factor of the stretch before it
    coalesce(draw_kw, last_value(draw_kw ignore nulls) over w) as draw_kw,
    coalesce(rel_time_factor, last_value(rel_time_factor ignore nulls) over w) as rel_time_factor,
    seg_start,
    coalesce(next_start, ended_at) as seg_end
from ordered
window w as (partition by tenant, job_id, attempt, plan_id order by seg rows between unbounded preceding and current row)
