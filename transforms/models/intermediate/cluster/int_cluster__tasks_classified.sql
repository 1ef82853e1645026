-- Every task (job) of the traces, one row each, with its job class. Traces:
--   openb / <variant>                       : Alibaba openb pods (resource shape, QoS, creation/scheduled/deletion s)
--   philly / gavel_job_distribution         : Gavel's Philly (duration, #GPUs) pairs
--   philly / runtime                        : Philly runtimes (no resource shape)
-- Job class = gpu_class x num_gpu x gpu_share_bucket x cpu_bucket x gpu_model_constraint (macros/cluster.sql):
--   gpu_class        cpu_only | gpu_share (part of one GPU) | single_gpu | multi_gpu | unknown
--   gpu_share_bucket none | whole | le0.25 | 0.25-0.5 | 0.5-0.75 | 0.75-1 (fraction of one GPU) | unknown
--   cpu_bucket       le2 | 2-4 | 4-8 | 8-16 | 16-32 | gt32 cores (upper bounds inclusive) | unknown
-- duration_s: openb deletion - scheduled (NULL when never scheduled); Philly the given duration/runtime.
with openb as (
    select
        'openb' as trace,
        trace_variant as variant,
        pod_name as task_id,
        cpu_milli,
        memory_mib,
        num_gpu,
        gpu_milli,
        gpu_model_constraint,
        qos,
        pod_phase,
        cast(deletion_time_s - scheduled_time_s as double) as duration_s,
        cast(scheduled_time_s - creation_time_s as double) as queue_delay_s,
        creation_time_s
    from {{ ref('stg_cluster__openb_pods') }}
),

philly_gavel as (
    select
        'philly' as trace,
        'gavel_job_distribution' as variant,
        cast(null as varchar) as task_id,
        cast(null as bigint) as cpu_milli,
        cast(null as bigint) as memory_mib,
        num_gpu,
        1000 as gpu_milli,
        'any' as gpu_model_constraint,
        cast(null as varchar) as qos,
        cast(null as varchar) as pod_phase,
        duration_s,
        cast(null as double) as queue_delay_s,
        cast(null as bigint) as creation_time_s
    from {{ ref('stg_cluster__philly_job_distribution') }}
),

philly_runtime as (
    select
        'philly' as trace,
        'runtime' as variant,
        cast(null as varchar) as task_id,
        cast(null as bigint) as cpu_milli,
        cast(null as bigint) as memory_mib,
        cast(null as integer) as num_gpu,
        cast(null as integer) as gpu_milli,
        'any' as gpu_model_constraint,
        cast(null as varchar) as qos,
        cast(null as varchar) as pod_phase,
        runtime_s as duration_s,
        cast(null as double) as queue_delay_s,
        cast(null as bigint) as creation_time_s
    from {{ ref('stg_cluster__philly_runtimes') }}
),

tasks as (
    select * from openb
    union all
    select * from philly_gavel
    union all
    select * from philly_runtime
),

classified as (
    select
        *,
        {{ gpu_class('num_gpu', 'gpu_milli') }} as gpu_class,
        {{ gpu_share_bucket('num_gpu', 'gpu_milli') }} as gpu_share_bucket,
        {{ cpu_bucket('cpu_milli') }} as cpu_bucket,
        -- GPUs this task occupies: whole GPUs, or the fraction of one GPU it shares
        case
            when num_gpu is null then null
            when num_gpu = 1 then coalesce(gpu_milli, 1000) / 1000.0
            else num_gpu * 1.0
        end as gpu_demand
    from tasks
)

select
    *,
    gpu_class
    || '/' || coalesce(cast(num_gpu as varchar), '?') || 'gpu'
    || '/share:' || gpu_share_bucket
    || '/cpu:' || cpu_bucket
    || '/model:' || gpu_model_constraint as job_class
from classified
