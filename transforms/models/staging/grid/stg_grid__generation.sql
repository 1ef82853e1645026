-- A table, not a view: ~2 M rows (generation) / 0.5 M (CI) aggregated once here, then read by several models and
-- tests.
{{ config(materialized='table') }}

-- Generation per region x UTC hour x fuel x data source, in MW (hourly mean). Sub-hourly rows are averaged into
-- their UTC hour (the mean of MW readings is the hourly mean MW).
with source as (
    select * from {{ source('raw', 'grid_generation') }}
),

hourly as (
    select
        cast(region as varchar) as region,
        {{ utc_hour('hour_utc') }} as hour_utc,
        cast(fuel as varchar) as fuel,
        cast(data_source as varchar) as data_source,
        avg(cast(generation_mw as double)) as generation_mw,
        count(*) as n_samples,
        {{ agg_flag_set('quality_flag') }} as quality_flag,
        max(_loaded_at) as loaded_at
    from source
    where generation_mw is not null
    group by all
)

select
    *,
    data_source in {{ live_data_sources_sql() }} as is_live_feed
from hourly
