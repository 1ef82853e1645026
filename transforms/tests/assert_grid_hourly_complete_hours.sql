-- Every region's hours are contiguous between its first and last hour (no gaps in the hourly key), and each
-- EnsembleCI region has all 17,544 hours of 2020-2021.
with spans as (
    select
        region,
        count(*) as n_hours,
        min(hour_utc) as first_hour,
        max(hour_utc) as last_hour,
        count(*) filter (where hour_utc >= timestamptz '2020-01-01 00:00:00+00'
                           and hour_utc < timestamptz '2022-01-01 00:00:00+00') as n_hours_2020_2021,
        bool_or(ci_data_source = 'ensembleci') as is_ensembleci
    from {{ ref('grid_hourly') }}
    group by region
)

select *
from spans
where n_hours <> cast(epoch(last_hour - first_hour) / 3600 as bigint) + 1
   or (is_ensembleci and n_hours_2020_2021 <> 17544)
