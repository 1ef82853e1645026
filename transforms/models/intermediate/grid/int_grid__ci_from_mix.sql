-- Production-based average carbon intensity recomputed from each region-hour's generation mix (the source chosen in
-- int_grid__generation_wide) with the CarbonCast emission factors (seed grid_emission_factors):
--     CI = sum_i(gen_i x EF_i) / sum_i(gen_i)        (negative net generation counts as 0)
-- This is how the EnsembleCI files were built (SOURCE.md: RMSE 0.00) and how the loader recomputes DE's direct CI
-- (whose "direct" file holds lifecycle CI). grid_hourly uses it only where no direct/lifecycle CI row exists for a
-- region-hour; the data test on this model checks it against the files' values.
with mix as (
    select g.region, g.hour_utc, g.fuel, greatest(g.generation_mw, 0) as generation_mw
    from {{ ref('stg_grid__generation') }} as g
    inner join {{ ref('int_grid__generation_wide') }} as w
        on g.region = w.region and g.hour_utc = w.hour_utc and g.data_source = w.generation_data_source
),

factors as (
    select * from {{ ref('grid_emission_factors') }}
)

select
    mix.region,
    mix.hour_utc,
    sum(mix.generation_mw * f.direct_gco2_per_kwh) / nullif(sum(mix.generation_mw), 0)
        as carbon_intensity_direct_gco2_per_kwh,
    sum(mix.generation_mw * f.lifecycle_gco2_per_kwh) / nullif(sum(mix.generation_mw), 0)
        as carbon_intensity_lifecycle_gco2_per_kwh,
    sum(mix.generation_mw) as total_generation_mw,
    count(*) filter (where f.fuel is null) as n_fuels_without_factor
from mix
left join factors as f on f.fuel = mix.fuel
group by mix.region, mix.hour_utc
