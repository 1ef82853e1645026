-- ML.ENERGY benchmark v3 (H100 / B200) serving configurations. The file's average power is the TOTAL over
-- num_gpus (avg_power_total_w); avg_power_per_gpu_w divides it.
select
    cast(task as varchar) as task,
    cast(model_id as varchar) as model_id,
    cast(nickname as varchar) as nickname,
    cast(architecture as varchar) as architecture,
    cast(total_params_billions as double) as total_params_billions,
    cast(activated_params_billions as double) as activated_params_billions,
    cast(weight_precision as varchar) as weight_precision,
    cast(gpu_model as varchar) as gpu_model,
    cast(num_gpus as integer) as num_gpus,
    cast(tensor_parallel as integer) as tensor_parallel,
    cast(data_parallel as integer) as data_parallel,
    cast(expert_parallel as integer) as expert_parallel,
    cast(max_num_seqs as integer) as max_num_seqs,
    cast(avg_batch_size as double) as avg_batch_size,
    cast(avg_output_len_tokens as double) as avg_output_len_tokens,
    cast(avg_power_total_w as double) as avg_power_total_w,
    cast(avg_power_total_w as double) / nullif(cast(num_gpus as integer), 0) as avg_power_per_gpu_w,
    cast(energy_per_request_j as double) as energy_per_request_j,
    cast(energy_per_token_j as double) as energy_per_token_j,
    cast(output_throughput_tokens_per_s as double) as output_throughput_tokens_per_s,
    cast(median_itl_ms as double) / 1000.0 as median_itl_s,
    cast(p90_itl_ms as double) / 1000.0 as p90_itl_s,
    cast(p95_itl_ms as double) / 1000.0 as p95_itl_s,
    cast(p99_itl_ms as double) / 1000.0 as p99_itl_s,
    _loaded_at as loaded_at
from {{ source('raw', 'mlenergy_v3_configurations') }}
