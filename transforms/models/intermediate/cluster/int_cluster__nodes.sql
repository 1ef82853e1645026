-- Every node of every cluster, in one shape (cpu_milli, memory_mib, GPUs and their model):
--   openb   : Alibaba openb, the all_node list (1,523 nodes incl. CPU-only); in_gpu_node_list marks the 1,213 nodes
--             of the gpu_node list (the FGD simulator's cluster)
--   pai2020 : Alibaba PAI 2020 inventory (1,896 machines; MISC = K40m/K80/M60)
with openb_all as (
    select * from {{ ref('stg_cluster__openb_nodes') }} where node_list = 'all_node'
),

openb_gpu as (
    select node_id from {{ ref('stg_cluster__openb_nodes') }} where node_list = 'gpu_node'
)

select
    'openb' as cluster,
    a.node_id,
    a.gpu_model,
    a.num_gpu,
    a.cpu_milli,
    a.memory_mib,
    a.is_gpu_node,
    g.node_id is not null as in_gpu_node_list
from openb_all as a
left join openb_gpu as g on g.node_id = a.node_id

union all

select
    'pai2020' as cluster,
    node_id,
    gpu_model,
    num_gpu,
    cpu_milli,
    memory_mib,
    is_gpu_node,
    is_gpu_node as in_gpu_node_list
from {{ ref('stg_cluster__pai_machine_specs') }}
