-- AcmeTrace per-cluster job statistics (times in seconds, rates as fractions 0-1).
select
    lower(cast(cluster as varchar)) as cluster,
    * exclude (cluster, _source, _batch_id, _loaded_at),
    _loaded_at as loaded_at
from {{ source('raw', 'acme_cluster_summary') }}
