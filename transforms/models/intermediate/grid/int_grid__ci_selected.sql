-- One row per region x UTC hour: the carbon intensity chosen for each signal.
--   direct    : signal_type = average, scope = direct
--   lifecycle : signal_type = average, scope = lifecycle
--   marginal  : signal_type = marginal (live feeds such as WattTime; kept apart, never mixed with averages)
-- Precedence when several rows cover the same region-hour and signal: FILE sources (ensembleci, lets_wait_awhile)
-- win over live feeds (electricitymaps, watttime, ukci, eia930, entsoe in that order); then production-based wins over
-- consumption-based; then data_source name (deterministic).
with ci as (
    select
        *,
        case when signal_type = 'marginal' then 'marginal' else scope end as signal,
        {{ data_source_rank('data_source') }} as source_rank,
        case basis when 'production' then 1 else 2 end as basis_rank
    from {{ ref('stg_grid__carbon_intensity') }}
    where signal_type in ('average', 'marginal')
),

chosen as (
    select *
    from ci
    qualify row_number() over (
        partition by region, hour_utc, signal order by source_rank, basis_rank, scope, data_source
    ) = 1
)

select
    region,
    hour_utc,
    any_value(carbon_intensity_gco2_per_kwh) filter (where signal = 'direct') as carbon_intensity_direct_gco2_per_kwh,
    any_value(signal_type) filter (where signal = 'direct') as direct_signal_type,
    any_value(basis) filter (where signal = 'direct') as direct_basis,
    any_value(data_source) filter (where signal = 'direct') as direct_data_source,
    any_value(quality_flag) filter (where signal = 'direct') as direct_quality_flag,
    any_value(carbon_intensity_gco2_per_kwh) filter (where signal = 'lifecycle')
        as carbon_intensity_lifecycle_gco2_per_kwh,
    any_value(basis) filter (where signal = 'lifecycle') as lifecycle_basis,
    any_value(data_source) filter (where signal = 'lifecycle') as lifecycle_data_source,
    any_value(quality_flag) filter (where signal = 'lifecycle') as lifecycle_quality_flag,
    any_value(carbon_intensity_gco2_per_kwh) filter (where signal = 'marginal')
        as carbon_intensity_marginal_gco2_per_kwh,
    any_value(data_source) filter (where signal = 'marginal') as marginal_data_source
from chosen
group by region, hour_utc
