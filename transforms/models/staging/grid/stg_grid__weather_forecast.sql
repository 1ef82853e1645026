-- GFS weather forecasts averaged over each region, per UTC hour. A row whose five values are all 0 is the files'
-- way of saying "missing" (the US files' last day): its values become NULL.
with source as (
    select * from {{ source('raw', 'grid_weather_forecast') }}
),

hourly as (
    select
        cast(region as varchar) as region,
        {{ utc_hour('hour_utc') }} as hour_utc,
        cast(data_source as varchar) as data_source,
        avg(cast(wind_speed_m_per_s as double)) as wind_speed_m_per_s,
        avg(cast(temperature_k as double)) as temperature_k,
        avg(cast(dewpoint_k as double)) as dewpoint_k,
        avg(cast(dswrf_w_per_m2 as double)) as dswrf_w_per_m2,
        avg(cast(precipitation_kg_per_m2 as double)) as precipitation_kg_per_m2,
        max(_loaded_at) as loaded_at
    from source
    group by all
),

flagged as (
    select
        *,
        coalesce(wind_speed_m_per_s, 0) = 0
            and coalesce(temperature_k, 0) = 0
            and coalesce(dewpoint_k, 0) = 0
            and coalesce(dswrf_w_per_m2, 0) = 0
            and coalesce(precipitation_kg_per_m2, 0) = 0 as is_missing
    from hourly
)

select
    region,
    hour_utc,
    data_source,
    case when not is_missing then wind_speed_m_per_s end as wind_speed_m_per_s,
    case when not is_missing then temperature_k end as temperature_k,
    case when not is_missing then dewpoint_k end as dewpoint_k,
    case when not is_missing then dswrf_w_per_m2 end as dswrf_w_per_m2,
    case when not is_missing then precipitation_kg_per_m2 end as precipitation_kg_per_m2,
    is_missing as is_weather_missing,
    loaded_at
from flagged
