-- ML.ENERGY leaderboard v2 diffusion runs: energy per image (text-to-image) or per video.
select
    cast(task_family as varchar) as task_family,
    cast(task as varchar) as task,
    cast(gpu_dir as varchar) as gpu_dir,
    cast(config as varchar) as config,
    cast(model as varchar) as model,
    cast(gpu as varchar) as gpu_model,
    cast(energy_per_image_j as double) as energy_per_image_j,
    cast(energy_per_video_j as double) as energy_per_video_j,
    cast(batch_latency_s as double) as batch_latency_s,
    cast(batch_size as integer) as batch_size,
    cast(denoising_steps as integer) as denoising_steps,
    cast(frames as integer) as frames,
    _loaded_at as loaded_at
from {{ source('raw', 'mlenergy_v2_diffusion_runs') }}
