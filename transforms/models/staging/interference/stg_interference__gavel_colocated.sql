-- Gavel pairwise co-location (space sharing) on one GPU: both jobs' throughput together and alone.
-- Each unordered pair appears in both orders (A with B, B with A). feasible = false: Gavel's [0, 0] (OOM / never
-- profiled, which includes every pair with a multi-GPU job).
select
    cast(measurement_set as varchar) as measurement_set,
    lower(cast(gpu_type as varchar)) as gpu_type,
    cast(consolidated as boolean) as consolidated,
    cast(job_a as varchar) as job_a,
    cast(scale_factor_a as integer) as scale_factor_a,
    cast(job_b as varchar) as job_b,
    cast(scale_factor_b as integer) as scale_factor_b,
    cast(steps_per_s_a_colocated as double) as steps_per_s_a_colocated,
    cast(steps_per_s_b_colocated as double) as steps_per_s_b_colocated,
    cast(steps_per_s_a_isolated as double) as steps_per_s_a_isolated,
    cast(steps_per_s_b_isolated as double) as steps_per_s_b_isolated,
    cast(norm_throughput_a as double) as norm_throughput_a,
    cast(norm_throughput_b as double) as norm_throughput_b,
    cast(feasible as boolean) as feasible,
    _loaded_at as loaded_at
from {{ source('raw', 'gavel_colocated') }}
