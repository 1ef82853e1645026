-- Alibaba openb pod (task) lists, one row per trace variant x pod. Times are seconds since the trace start.
-- gpu_milli is the share of ONE GPU a GPU-sharing pod asks for (num_gpu = 1); whole-GPU pods have 1000, CPU-only 0.
-- gpu_model_constraint: the allowed GPU models, de-duplicated and sorted, joined by '|'; 'any' without constraint.
select
    cast(variant as varchar) as trace_variant,
    cast(name as varchar) as pod_name,
    cast(cpu_milli as bigint) as cpu_milli,
    cast(memory_mib as bigint) as memory_mib,
    cast(num_gpu as integer) as num_gpu,
    cast(gpu_milli as integer) as gpu_milli,
    nullif(trim(cast(gpu_spec as varchar)), '') as gpu_spec,
    {{ normalize_gpu_constraint('gpu_spec') }} as gpu_model_constraint,
    cast(qos as varchar) as qos,
    cast(pod_phase as varchar) as pod_phase,
    cast(creation_time_s as bigint) as creation_time_s,
    cast(deletion_time_s as bigint) as deletion_time_s,
    cast(scheduled_time_s as bigint) as scheduled_time_s,
    _loaded_at as loaded_at
from {{ source('raw', 'openb_pods') }}
