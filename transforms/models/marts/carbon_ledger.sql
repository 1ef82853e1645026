-- One row per job whose latest attempt ended (finished, failed, cancelled; a failed job that will be retried
-- shows as failed until its next attempt): the carbon it really emitted over every attempt against the run-now counterfactual (the same job started at submission in its home region at the
-- default power limit, for the run time it really took, at the actual intensity), the saving, whether it met its
-- deadline (and whether missing it is the planner's regret: run now, it would have been met), and the forecast's
-- error on the plans that placed it.
with runs as (
    select * from {{ ref('job_runs') }}
),

run_now as (
    select tenant, job_id, attempt, plan_id, ci_hours, hours
    from {{ ref('job_window_carbon') }}
    where kind = 'run_now'
),

last_attempt as (
    select *
    from runs
    qualify row_number() over (partition by tenant, job_id order by attempt desc, started_at desc nulls last) = 1
),

per_job as (
    select
        tenant,
        job_id,
        count(*) as attempts,
        {{ fixed_order_sum('realized_kgco2e') }} as realized_kgco2e,
        {{ fixed_order_sum('expected_kgco2e') }} filter (where started_at is not null) as forecast_kgco2e,
        {{ fixed_order_sum('planned_window_actual_kgco2e') }} filter (where started_at is not null) as planned_window_actual_kgco2e,
        bool_or(energy_source = 'measured') as any_measured_energy,
        string_agg(distinct energy_meter, '+' order by energy_meter) as energy_meters
    from runs
    group by tenant, job_id
)

select
    l.tenant,
    l.job_id,
    l.planner_job_id,
    l.submitted_at,
    cast({{ as_utc_naive('l.submitted_at') }} as date) as submitted_day,
    l.region,
    l.cluster,
    l.outcome,
    p.attempts,
    l.ended_at,
    l.deadline,
    coalesce(l.deadline_met, false) as deadline_met,
    -- late, although started at submission on its home cluster at the default limit, for the run time it really
    -- took (the run-now window), it would have ended by its deadline
    coalesce(
        l.outcome = 'finished' and not l.deadline_met
        and l.submitted_at + to_microseconds(cast(n.hours * 3600e6 as bigint)) <= l.deadline,
        false
    ) as deadline_regret,
    p.realized_kgco2e,
    a.run_now_kw * n.ci_hours / 1000.0 as counterfactual_kgco2e,
    a.run_now_kw * n.ci_hours / 1000.0 - p.realized_kgco2e as saving_kgco2e,
    100.0 * (a.run_now_kw * n.ci_hours / 1000.0 - p.realized_kgco2e) / nullif(a.run_now_kw * n.ci_hours / 1000.0, 0)
        as saving_pct,
    p.forecast_kgco2e,
    100.0 * (p.forecast_kgco2e - p.planned_window_actual_kgco2e) / nullif(p.planned_window_actual_kgco2e, 0)
        as forecast_error_pct,
    case when p.any_measured_energy then 'measured' else 'power_model' end as energy_source,
    p.energy_meters as energy_meter
from last_attempt as l
inner join per_job as p on p.tenant = l.tenant and p.job_id = l.job_id
left join {{ ref('int_jobs__attempts') }} as a
    on a.tenant = l.tenant and a.job_id = l.job_id and a.attempt = l.attempt and a.plan_id = l.plan_id
left join run_now as n
    on n.tenant = l.tenant and n.job_id = l.job_id and n.attempt = l.attempt and n.plan_id = l.plan_id
where l.outcome in ('finished', 'failed', 'cancelled')
