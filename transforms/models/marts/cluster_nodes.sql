-- Per node: the capacity of every node of every cluster (openb, pai2020). Per-cluster roll-up: cluster_capacity.
select
    cluster,
    node_id,
    gpu_model,
    num_gpu,
    cpu_milli,
    memory_mib,
    is_gpu_node,
    in_gpu_node_list
from {{ ref('int_cluster__nodes') }}
