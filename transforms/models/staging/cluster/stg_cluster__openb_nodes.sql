-- Alibaba openb node lists. node_list: gpu_node (the 1,213 GPU nodes the FGD simulator uses) or all_node (1,523,
-- including CPU-only nodes).
select
    cast(variant as varchar) as node_list,
    cast(sn as varchar) as node_id,
    cast(cpu_milli as bigint) as cpu_milli,
    cast(memory_mib as bigint) as memory_mib,
    cast(num_gpu as integer) as num_gpu,
    nullif(trim(cast(gpu_model as varchar)), '') as gpu_model,
    cast(num_gpu as integer) > 0 as is_gpu_node,
    _loaded_at as loaded_at
from {{ source('raw', 'openb_nodes') }}
