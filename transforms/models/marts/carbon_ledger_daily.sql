-- The carbon ledger summed per day of submission x tenant x region: the sums any rollup (a period, per tenant, per
-- region, per day) is made of. valued_* count only jobs that have a run-now counterfactual (finished ones), so
-- saving = counterfactual - valued_realized.
select
    submitted_day,
    tenant,
    region,
    count(*) as jobs,
    count(*) filter (where outcome = 'finished') as finished,
    count(*) filter (where outcome = 'failed') as failed,
    count(*) filter (where outcome = 'cancelled') as cancelled,
    count(*) filter (where outcome = 'finished' and deadline_met) as deadlines_met,
    count(*) filter (where deadline_regret) as deadline_regrets,
    count(*) filter (where energy_source = 'measured') as measured_energy_jobs,
    {{ fixed_order_sum('realized_kgco2e') }} as realized_kgco2e,
    coalesce({{ fixed_order_sum('realized_kgco2e') }} filter (where counterfactual_kgco2e is not null), 0) as valued_realized_kgco2e,
    coalesce({{ fixed_order_sum('counterfactual_kgco2e') }}, 0) as counterfactual_kgco2e
from {{ ref('carbon_ledger') }}
group by submitted_day, tenant, region
