-- AcmeTrace CDF curves: (cluster, metric) -> value at cdf_pct (0-100). The unit is the metric name's suffix
-- (_w, _c, _pct), split out as `unit`.
select
    lower(cast(cluster as varchar)) as cluster,
    cast(metric as varchar) as metric,
    regexp_extract(cast(metric as varchar), '_([a-z]+)$', 1) as unit,
    cast(value as double) as value,
    cast(cdf_pct as double) as cdf_pct,
    _loaded_at as loaded_at
from {{ source('raw', 'acme_utilization_cdfs') }}
