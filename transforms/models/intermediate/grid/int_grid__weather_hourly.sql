-- One weather row per region x UTC hour the forecast is VALID for (regions with weather: CISO, ERCO, DE from their
-- weather files, SE from columns of its direct-emissions file). The files label each GFS forecast one day before its
-- valid hour, so hour_utc = label + var weather_label_shift_hours (24; evidence in dbt_project.yml). Rows marked
-- missing are dropped; the file source wins if several sources cover an hour.
select
    region,
    hour_utc + to_hours(cast({{ var('weather_label_shift_hours') }} as integer)) as hour_utc,
    hour_utc as label_hour_utc,
    data_source as weather_data_source,
    wind_speed_m_per_s,
    temperature_k,
    dewpoint_k,
    dswrf_w_per_m2,
    precipitation_kg_per_m2
from {{ ref('stg_grid__weather_forecast') }}
where not is_weather_missing
qualify row_number() over (
    partition by region, hour_utc order by case data_source when 'ensembleci' then 1 else 2 end, data_source
) = 1
