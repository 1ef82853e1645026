-- The carbon ledger summed per tenant, per region and per day (of submission): jobs, how many finished and met
-- their deadline, realized against run-now kgCO2e and the saving. One row per (grain, key).
with ledger as (
    select * from {{ ref('carbon_ledger') }}
),

keyed as (
    select 'tenant' as grain, tenant as key, * from ledger
    union all
    select 'region' as grain, region as key, * from ledger
    union all
    select 'day' as grain, cast(submitted_day as varchar) as key, * from ledger
)

select
    grain,
    key,
    count(*) as jobs,
    count(*) filter (where outcome = 'finished') as finished,
    100.0 * count(*) filter (where deadline_met) / nullif(count(*) filter (where outcome = 'finished'), 0)
        as deadlines_met_pct,
    sum(realized_kgco2e) as realized_kgco2e,
    sum(counterfactual_kgco2e) filter (where counterfactual_kgco2e is not null) as counterfactual_kgco2e,
    100.0 * (sum(counterfactual_kgco2e) filter (where counterfactual_kgco2e is not null)
        - sum(realized_kgco2e) filter (where counterfactual_kgco2e is not null))
        / nullif(sum(counterfactual_kgco2e) filter (where counterfactual_kgco2e is not null), 0) as saving_pct
from keyed
group by grain, key
