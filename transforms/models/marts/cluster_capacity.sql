-- Per cluster x GPU model ('none' = CPU-only nodes): nodes, GPUs, CPU and memory, with the cluster's totals beside
-- them. Per node: cluster_nodes.
with nodes as (
    select * from {{ ref('int_cluster__nodes') }}
),

by_model as (
    select
        cluster,
        coalesce(gpu_model, 'none') as gpu_model,
        count(*) as num_nodes,
        sum(num_gpu) as num_gpus,
        min(num_gpu) as min_gpus_per_node,
        max(num_gpu) as max_gpus_per_node,
        sum(cpu_milli) as cpu_milli,
        sum(memory_mib) as memory_mib,
        min(cpu_milli) as min_node_cpu_milli,
        max(cpu_milli) as max_node_cpu_milli,
        min(memory_mib) as min_node_memory_mib,
        max(memory_mib) as max_node_memory_mib
    from nodes
    group by all
)

select
    *,
    sum(num_nodes) over (partition by cluster) as cluster_num_nodes,
    sum(num_gpus) over (partition by cluster) as cluster_num_gpus,
    sum(cpu_milli) over (partition by cluster) as cluster_cpu_milli,
    sum(memory_mib) over (partition by cluster) as cluster_memory_mib,
    num_gpus / nullif(sum(num_gpus) over (partition by cluster), 0) as share_of_cluster_gpus
from by_model
