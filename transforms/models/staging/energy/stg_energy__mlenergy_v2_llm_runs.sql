-- ML.ENERGY leaderboard v2 LLM / MLLM text-generation runs.
select
    cast(task_family as varchar) as task_family,
    cast(task as varchar) as task,
    cast(gpu_dir as varchar) as gpu_dir,
    cast(config as varchar) as config,
    cast(model as varchar) as model,
    cast(gpu as varchar) as gpu_model,
    cast(tensor_parallel as integer) as tensor_parallel,
    cast(pipeline_parallel as integer) as pipeline_parallel,
    cast(tensor_parallel as integer) * cast(pipeline_parallel as integer) as num_gpus,
    cast(energy_per_request_j as double) as energy_per_request_j,
    cast(avg_tpot_s as double) as avg_tpot_s,
    cast(token_throughput_tokens_per_s as double) as token_throughput_tokens_per_s,
    cast(avg_output_tokens as double) as avg_output_tokens,
    cast(avg_batch_size_reqs as double) as avg_batch_size_reqs,
    cast(max_batch_size_reqs as integer) as max_batch_size_reqs,
    _loaded_at as loaded_at
from {{ source('raw', 'mlenergy_v2_llm_runs') }}
