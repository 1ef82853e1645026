-- Microsoft Philly job runtimes (seconds), one row per job; the trace gives no GPU count.
select
    cast(runtime_s as double) as runtime_s,
    _loaded_at as loaded_at
from {{ source('raw', 'philly_runtimes') }}
