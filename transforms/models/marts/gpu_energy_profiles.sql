-- Per GPU type x training config (workload = network/dataset, batch size, optimizer) x power limit: time, average
-- power and energy per epoch; and per GPU type x config the energy-optimal power limit with its slowdown and saving
-- against the maximum limit. Semantics: gpu_energy_profiles.yml.
with sweep as (
    select * from {{ ref('stg_energy__zeus_power_sweep') }}
),

ranked as (
    select
        *,
        max(power_limit_w) over config as max_power_limit_w,
        -- the energy-optimal limit: least energy per epoch; ties go to the higher limit (the faster one)
        row_number() over (config order by energy_per_epoch_j, power_limit_w desc) = 1 as is_energy_optimal
    from sweep
    window config as (partition by gpu_type, workload, batch_size, optimizer)
),

optimal as (
    select
        gpu_type, workload, batch_size, optimizer,
        power_limit_w as energy_optimal_limit_w,
        time_per_epoch_s as time_at_optimal_s,
        energy_per_epoch_j as energy_at_optimal_j
    from ranked
    where is_energy_optimal
),

at_max as (
    select
        gpu_type, workload, batch_size, optimizer,
        time_per_epoch_s as time_at_max_s,
        energy_per_epoch_j as energy_at_max_j
    from ranked
    where power_limit_w = max_power_limit_w
)

select
    r.gpu_type,
    r.dataset,
    r.network,
    r.workload,
    r.batch_size,
    r.optimizer,
    r.power_limit_w,
    r.time_per_epoch_s,
    r.avg_power_w,
    r.energy_per_epoch_j,
    r.max_power_limit_w,
    r.is_energy_optimal,
    o.energy_optimal_limit_w,
    o.time_at_optimal_s / m.time_at_max_s - 1 as slowdown_at_optimal,
    1 - o.energy_at_optimal_j / m.energy_at_max_j as energy_saving_at_optimal,
    -- additive: this limit against the maximum limit
    r.time_per_epoch_s / m.time_at_max_s - 1 as slowdown_vs_max_limit,
    1 - r.energy_per_epoch_j / m.energy_at_max_j as energy_saving_vs_max_limit
from ranked as r
inner join optimal as o using (gpu_type, workload, batch_size, optimizer)
inner join at_max as m using (gpu_type, workload, batch_size, optimizer)
