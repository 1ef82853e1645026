-- Published day-ahead forecasts (DACF files), long: one row per region x UTC hour x target x data source.
select
    cast(region as varchar) as region,
    {{ utc_hour('hour_utc') }} as hour_utc,
    cast(target as varchar) as target,
    cast(value as double) as value,
    cast(unit as varchar) as unit,
    cast(publisher as varchar) as publisher,
    cast(data_source as varchar) as data_source,
    _loaded_at as loaded_at
from {{ source('raw', 'grid_published_forecasts') }}
