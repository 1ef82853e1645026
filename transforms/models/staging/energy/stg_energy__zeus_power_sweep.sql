-- Zeus power-limit sweep: per GPU type x training config x power limit, time and average power per epoch.
-- gpu_type lower-cased (a40, v100, rtx6000, p100) like the Gavel GPU types; workload = network/dataset.
select
    lower(cast(gpu_type as varchar)) as gpu_type,
    cast(dataset as varchar) as dataset,
    cast(network as varchar) as network,
    cast(network as varchar) || '/' || cast(dataset as varchar) as workload,
    cast(batch_size as integer) as batch_size,
    cast(optimizer as varchar) as optimizer,
    cast(power_limit_w as double) as power_limit_w,
    cast(time_per_epoch_s as double) as time_per_epoch_s,
    cast(avg_power_w as double) as avg_power_w,
    cast(energy_per_epoch_j as double) as energy_per_epoch_j,
    _loaded_at as loaded_at
from {{ source('raw', 'zeus_power_sweep') }}
