-- A live feed's own carbon-intensity forecasts (raw.grid_live_forecasts, written by the live connectors only; an
-- empty relation when the table does not exist yet). issued_at = when the provider generated the forecast.
with source as (
    {{ optional_source('raw', 'grid_live_forecasts', {
        'region': 'varchar',
        'issued_at': 'timestamptz',
        'hour_utc': 'timestamptz',
        'carbon_intensity_gco2_per_kwh': 'double',
        'signal_type': 'varchar',
        'basis': 'varchar',
        'scope': 'varchar',
        'data_source': 'varchar',
        'quality_flag': 'varchar',
        '_loaded_at': 'timestamptz',
    }) }}
)

select
    region,
    issued_at,
    {{ utc_hour('hour_utc') }} as hour_utc,
    signal_type,
    basis,
    scope,
    data_source,
    avg(carbon_intensity_gco2_per_kwh) as carbon_intensity_gco2_per_kwh,
    count(*) as n_samples,
    {{ agg_flag_set('quality_flag') }} as quality_flag,
    max(_loaded_at) as loaded_at
from source
group by all
