-- Zeus power-limit profiling windows (a fixed number of iterations per window), one row per window x GPU.
select
    lower(cast(gpu_model as varchar)) as gpu_type,
    cast(model_name as varchar) as network,
    cast(gpu_ids as varchar) as gpu_ids,
    cast(num_gpus as integer) as num_gpus,
    cast(window_index as integer) as window_index,
    cast(window_name as varchar) as window_name,
    cast(power_limit_w as double) as power_limit_w,
    cast(start_time_s as double) as start_time_s,
    cast(elapsed_time_s as double) as elapsed_time_s,
    cast(gpu_index as integer) as gpu_index,
    cast(energy_j as double) as energy_j,
    cast(avg_power_w as double) as avg_power_w,
    _loaded_at as loaded_at
from {{ source('raw', 'zeus_profile_windows') }}
