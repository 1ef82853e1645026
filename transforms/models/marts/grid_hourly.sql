-- One row per region x UTC hour (hour_utc = the hour's start): carbon intensity, generation by fuel, renewable share,
-- weather, calendar and data-quality flags. Column contract: docs/data-contracts.md; semantics: grid_hourly.yml.
with ci as (
    select * from {{ ref('int_grid__ci_selected') }}
),

generation as (
    select * from {{ ref('int_grid__generation_wide') }}
),

from_mix as (
    select * from {{ ref('int_grid__ci_from_mix') }}
),

weather as (
    select * from {{ ref('int_grid__weather_hourly') }}
),

region_hours as (
    select region, hour_utc from ci
    union
    select region, hour_utc from generation
),

joined as (
    select
        k.region,
        k.hour_utc,
        ci.carbon_intensity_direct_gco2_per_kwh as direct_from_rows,
        ci.carbon_intensity_lifecycle_gco2_per_kwh as lifecycle_from_rows,
        ci.direct_signal_type,
        ci.direct_basis,
        ci.direct_data_source,
        ci.direct_quality_flag,
        ci.lifecycle_basis as lifecycle_basis_from_rows,
        ci.lifecycle_quality_flag,
        ci.carbon_intensity_marginal_gco2_per_kwh,
        ci.marginal_data_source,
        from_mix.carbon_intensity_direct_gco2_per_kwh as direct_from_mix,
        generation.* exclude (region, hour_utc),
        weather.* exclude (region, hour_utc, label_hour_utc)
    from region_hours as k
    left join ci on ci.region = k.region and ci.hour_utc = k.hour_utc
    left join generation on generation.region = k.region and generation.hour_utc = k.hour_utc
    left join from_mix on from_mix.region = k.region and from_mix.hour_utc = k.hour_utc
    left join weather on weather.region = k.region and weather.hour_utc = k.hour_utc
),

computed as (
    select
        *,
        -- direct: the region's file/feed value; recomputed from the hour's mix only where no row exists.
        -- lifecycle: rows only (never filled: lifecycle factors differ between datasets, e.g. SE's 'unknown').
        coalesce(direct_from_rows, direct_from_mix) as ci_direct,
        lifecycle_from_rows as ci_lifecycle,
        direct_from_rows is null and direct_from_mix is not null as direct_filled_from_mix,
        case when generation_data_source is not null then
            {%- for fuel in var('fuels') %}
            greatest(coalesce({{ fuel }}_mw, 0), 0){{ " +" if not loop.last }}
            {%- endfor %}
        end as total_mw,
        case when generation_data_source is not null then {{ renewable_mw() }} end as renewable_total_mw
    from joined
)

select
    region,
    hour_utc,
    ci_direct as carbon_intensity_direct_gco2_per_kwh,
    ci_lifecycle as carbon_intensity_lifecycle_gco2_per_kwh,
    case
        when direct_from_rows is not null then direct_signal_type
        when direct_filled_from_mix then 'average'
    end as signal_type,
    case
        when direct_from_rows is not null then direct_basis
        when direct_filled_from_mix then 'production'
    end as basis,
    {%- for fuel in var('fuels') %}
    {{ fuel }}_mw,
    {%- endfor %}
    total_mw as total_generation_mw,
    renewable_total_mw as renewable_mw,
    renewable_total_mw / nullif(total_mw, 0) as renewable_share,
    wind_speed_m_per_s,
    temperature_k,
    dewpoint_k,
    dswrf_w_per_m2,
    precipitation_kg_per_m2,
    -- calendar, in UTC (the key is UTC); day_of_week 0 = Monday ... 6 = Sunday
    cast(hour({{ as_utc_naive('hour_utc') }}) as integer) as hour_of_day,
    cast(isodow({{ as_utc_naive('hour_utc') }}) - 1 as integer) as day_of_week,
    cast(month({{ as_utc_naive('hour_utc') }}) as integer) as month,
    cast(dayofyear({{ as_utc_naive('hour_utc') }}) as integer) as day_of_year,
    isodow({{ as_utc_naive('hour_utc') }}) >= 6 as is_weekend,
    -- data-quality flags from ingestion (raw quality_flag codes)
    coalesce(contains(direct_quality_flag, 'repeated_row'), false)
        or coalesce(generation_repeated_row, false) as is_repeated_row,
    coalesce(contains(direct_quality_flag, 'recomputed_from_mix'), false)
        or direct_filled_from_mix as ci_recomputed_from_mix,
    coalesce(generation_scaled, false) as generation_scaled,
    -- additive columns (beyond the contract)
    coalesce(contains(direct_quality_flag, 'partial_hour'), false)
        or coalesce(generation_partial_hour, false) as is_partial_hour,
    case
        when direct_from_rows is not null then direct_data_source
        when direct_filled_from_mix then 'recomputed:' || generation_data_source
    end as ci_data_source,
    lifecycle_basis_from_rows as lifecycle_basis,
    carbon_intensity_marginal_gco2_per_kwh,
    marginal_data_source,
    generation_data_source,
    nullif(
        array_to_string(
            list_sort(list_distinct(list_filter(
                string_split(
                    concat_ws(';', direct_quality_flag, lifecycle_quality_flag, generation_quality_flag), ';'
                ),
                x -> x <> ''
            ))),
            ';'
        ),
        ''
    ) as quality_flags
from computed
