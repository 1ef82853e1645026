-- ML.ENERGY leaderboard v2, legacy benchmark (2023, one GPU of each type): per GPU x task x model.
select
    cast(gpu as varchar) as gpu_model,
    cast(task as varchar) as task,
    cast(model as varchar) as model,
    cast(throughput_tokens_per_s as double) as throughput_tokens_per_s,
    cast(response_length_tokens as double) as response_length_tokens,
    cast(latency_s as double) as latency_s,
    cast(energy_per_response_j as double) as energy_per_response_j,
    _loaded_at as loaded_at
from {{ source('raw', 'mlenergy_v2_legacy') }}
