-- One row per region x UTC hour: generation by fuel in MW, wide (one <fuel>_mw column per contract fuel; NULL where
-- the source has no such fuel). All fuels of an hour come from ONE data source, so mixes are never stitched
-- together: files (ensembleci, lets_wait_awhile) win over live feeds, as for carbon intensity.
with per_source as (
    select
        region,
        hour_utc,
        data_source,
        {{ data_source_rank('data_source') }} as source_rank,
        {%- for fuel in var('fuels') %}
        sum(generation_mw) filter (where fuel = '{{ fuel }}') as {{ fuel }}_mw,
        {%- endfor %}
        count(*) as n_fuels,
        bool_or(contains(coalesce(quality_flag, ''), 'scaled_div4')) as generation_scaled,
        bool_or(contains(coalesce(quality_flag, ''), 'repeated_row')) as generation_repeated_row,
        bool_or(contains(coalesce(quality_flag, ''), 'partial_hour')) as generation_partial_hour,
        {{ agg_flag_set('quality_flag') }} as generation_quality_flag
    from {{ ref('stg_grid__generation') }}
    group by region, hour_utc, data_source
)

select
    * exclude (data_source, source_rank),
    data_source as generation_data_source
from per_source
qualify row_number() over (partition by region, hour_utc order by source_rank, data_source) = 1
