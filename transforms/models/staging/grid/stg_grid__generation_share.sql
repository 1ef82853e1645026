-- Generation mix in percent from live feeds (raw.grid_generation_share; UK Carbon Intensity API), no MW. An empty
-- relation when the table does not exist yet.
with source as (
    {{ optional_source('raw', 'grid_generation_share', {
        'region': 'varchar',
        'hour_utc': 'timestamptz',
        'fuel': 'varchar',
        'share_pct': 'double',
        'data_source': 'varchar',
        'quality_flag': 'varchar',
        '_loaded_at': 'timestamptz',
    }) }}
)

select
    region,
    {{ utc_hour('hour_utc') }} as hour_utc,
    fuel,
    data_source,
    avg(share_pct) as share_pct,
    count(*) as n_samples,
    {{ agg_flag_set('quality_flag') }} as quality_flag,
    max(_loaded_at) as loaded_at
from source
group by all
