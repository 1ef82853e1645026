-- Gavel's Philly job distribution: one (duration, #GPUs) pair per job.
select
    cast(duration_s as double) as duration_s,
    cast(num_gpus as integer) as num_gpu,
    _loaded_at as loaded_at
from {{ source('raw', 'philly_job_distribution') }}
