-- Alibaba PAI 2020 machine inventory, in the openb units: cores -> cpu_milli (x1000), GB -> memory_mib (x1024).
-- gpu_type 'CPU' (CPU-only machines) becomes gpu_model NULL; 'MISC' is K40m/K80/M60 x8.
select
    cast(machine as varchar) as node_id,
    case when gpu_type = 'CPU' then null else cast(gpu_type as varchar) end as gpu_model,
    cast(cap_cpu_cores as bigint) * 1000 as cpu_milli,
    cast(cap_mem_gb as bigint) * 1024 as memory_mib,
    cast(cap_gpu as integer) as num_gpu,
    cast(cap_gpu as integer) > 0 as is_gpu_node,
    _loaded_at as loaded_at
from {{ source('raw', 'pai_machine_specs') }}
