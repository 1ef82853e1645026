-- A table, not a view: ~2 M rows (generation) / 0.5 M (CI) aggregated once here, then read by several models and
-- tests.
{{ config(materialized='table') }}

-- Carbon intensity per region x UTC hour x signal (signal_type, basis, scope) x data source.
-- Hour aggregation: rows are keyed by the start of their UTC hour; sub-hourly rows a live feed may write
-- (e.g. half-hourly) are averaged into their hour, with the number of samples kept.
with source as (
    select * from {{ source('raw', 'grid_carbon_intensity') }}
),

hourly as (
    select
        cast(region as varchar) as region,
        {{ utc_hour('hour_utc') }} as hour_utc,
        cast(signal_type as varchar) as signal_type,
        cast(basis as varchar) as basis,
        cast(scope as varchar) as scope,
        cast(data_source as varchar) as data_source,
        avg(cast(carbon_intensity_gco2_per_kwh as double)) as carbon_intensity_gco2_per_kwh,
        count(*) as n_samples,
        {{ agg_flag_set('quality_flag') }} as quality_flag,
        max(_loaded_at) as loaded_at
    from source
    where carbon_intensity_gco2_per_kwh is not null
    group by all
)

select
    *,
    data_source in {{ live_data_sources_sql() }} as is_live_feed
from hourly
