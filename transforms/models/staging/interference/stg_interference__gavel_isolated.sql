-- Gavel isolated throughput per measurement set x GPU type x placement x job type x scale factor, in training
-- steps per second of the whole job (0 = not runnable).
select
    cast(measurement_set as varchar) as measurement_set,
    lower(cast(gpu_type as varchar)) as gpu_type,
    cast(consolidated as boolean) as consolidated,
    cast(job_type as varchar) as job_type,
    cast(model_family as varchar) as model_family,
    cast(batch_size as integer) as batch_size,
    cast(scale_factor as integer) as scale_factor,
    cast(steps_per_s as double) as steps_per_s,
    _loaded_at as loaded_at
from {{ source('raw', 'gavel_isolated') }}
