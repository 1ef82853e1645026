-- Job classes of the cluster traces: one row per trace x variant x job class, with the class's resource shape,
-- count and share within its variant, GPU demand, duration distribution and QoS mix.
-- Classes and buckets: int_cluster__tasks_classified (macros/cluster.sql); semantics: job_profiles.yml.
with tasks as (
    select * from {{ ref('int_cluster__tasks_classified') }}
),

variant_totals as (
    select
        trace,
        variant,
        count(*) as variant_job_count,
        sum(gpu_demand) as variant_gpu_demand
    from tasks
    group by trace, variant
),

classes as (
    select
        trace,
        variant,
        job_class,
        gpu_class,
        num_gpu,
        gpu_share_bucket,
        cpu_bucket,
        gpu_model_constraint,
        count(*) as job_count,
        avg(cpu_milli) as avg_cpu_milli,
        min(cpu_milli) as min_cpu_milli,
        max(cpu_milli) as max_cpu_milli,
        avg(memory_mib) as avg_memory_mib,
        avg(gpu_milli) filter (where num_gpu >= 1) as avg_gpu_milli,
        sum(gpu_demand) as gpu_demand,
        avg(gpu_demand) as avg_gpu_demand_per_job,
        count(duration_s) as n_with_duration,
        avg(duration_s) as duration_mean_s,
        quantile_cont(duration_s, 0.5) as duration_p50_s,
        quantile_cont(duration_s, 0.9) as duration_p90_s,
        quantile_cont(duration_s, 0.99) as duration_p99_s,
        max(duration_s) as duration_max_s,
        quantile_cont(queue_delay_s, 0.5) as queue_delay_p50_s,
        quantile_cont(queue_delay_s, 0.9) as queue_delay_p90_s,
        count(qos) as n_with_qos,
        count(*) filter (where qos = 'LS') / nullif(count(qos), 0) as qos_ls_share,
        count(*) filter (where qos = 'BE') / nullif(count(qos), 0) as qos_be_share,
        count(*) filter (where qos = 'Burstable') / nullif(count(qos), 0) as qos_burstable_share,
        count(*) filter (where qos = 'Guaranteed') / nullif(count(qos), 0) as qos_guaranteed_share,
        count(*) filter (where pod_phase = 'Failed') / nullif(count(pod_phase), 0) as failed_share
    from tasks
    group by all
)

select
    c.trace,
    c.variant,
    c.job_class,
    c.gpu_class,
    c.num_gpu,
    c.gpu_share_bucket,
    c.cpu_bucket,
    c.gpu_model_constraint,
    c.job_count,
    v.variant_job_count,
    c.job_count / v.variant_job_count as share_of_variant,
    c.avg_cpu_milli,
    c.min_cpu_milli,
    c.max_cpu_milli,
    c.avg_memory_mib,
    c.avg_gpu_milli,
    c.gpu_demand,
    c.avg_gpu_demand_per_job,
    c.gpu_demand / nullif(v.variant_gpu_demand, 0) as share_of_variant_gpu_demand,
    c.n_with_duration,
    c.duration_mean_s,
    c.duration_p50_s,
    c.duration_p90_s,
    c.duration_p99_s,
    c.duration_max_s,
    c.queue_delay_p50_s,
    c.queue_delay_p90_s,
    c.n_with_qos,
    c.qos_ls_share,
    c.qos_be_share,
    c.qos_burstable_share,
    c.qos_guaranteed_share,
    c.failed_share
from classes as c
inner join variant_totals as v on v.trace = c.trace and v.variant = c.variant
