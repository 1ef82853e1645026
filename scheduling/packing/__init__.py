"""GPU-cluster packer: cluster model, pods, fragmentation and packing policies (FGD and five baselines).

It places one pod at a time on a cluster of nodes with CPU, memory and GPU devices, which fractional pods may
share. It reproduces the simulator of "Beware of Fragmentation" (Weng et al., USENIX ATC'23) and its public
artifact: same feasibility rules, integer scores and tie-breaking. The hourly planner's cluster agents use it inside
each cluster; ``scheduling/evaluation/fgd_replay.py`` replays the paper's openb experiments on it.

Units: CPU milli-cores, memory MiB, GPU milli-GPU (1000 = one device).

    cluster = Cluster.from_nodes(nodes_df)          # columns sn|name, cpu_milli, memory_mib, gpu, model
    pod = Pod("job-1", cpu_milli=8000, memory_mib=30517, num_gpu=1, gpu_milli=500, gpu_spec="V100M16|V100M32")
    workload = TargetWorkload.from_pods(pods)       # the typical pods fragmentation is measured against
    policy = make_policy("fgd", workload=workload)  # names: POLICY_NAMES; or FGD(workload), BestFit(), ...
    placement = policy.place(cluster, pod)          # Placement(node, node_name, gpus, score), None if nowhere
    cluster.allocate(pod, placement)                # binds it; or policy.schedule(cluster, pod) for both steps
    cluster.release("job-1")                        # gives its resources back
    cluster.fragmentation(workload)                 # milli-GPU, sum over nodes of F_n

Policies follow the Kubernetes scheduler framework (filter, score, choose, select GPUs; ``base.py``), one module
each under ``policies/``, resolved by name in ``registry.py``. They keep per-cluster caches keyed on
``cluster.version``, valid across allocate/release on the same Cluster; not thread-safe (one policy per thread).
"""

from scheduling.packing.base import PackingPolicy, best_fit_gpus
from scheduling.packing.cluster import Binding, Cluster, Placement
from scheduling.packing.frag import FragTables, frag_tables, node_frag_batch, node_frag_memo, node_frag_scalar
from scheduling.packing.pods import MILLI, Pod, normalize_gpu_spec, pods_from_frame
from scheduling.packing.policies import FGD, BestFit, DotProd, GpuClustering, GpuPacking, RandomFit
from scheduling.packing.registry import DISPLAY_NAMES, POLICIES, POLICY_NAMES, UnknownNameError, make_policy
from scheduling.packing.workload import TargetWorkload

__all__ = [
    "Binding",
    "Cluster",
    "Placement",
    "FragTables",
    "frag_tables",
    "node_frag_batch",
    "node_frag_memo",
    "node_frag_scalar",
    "MILLI",
    "Pod",
    "normalize_gpu_spec",
    "pods_from_frame",
    "PackingPolicy",
    "best_fit_gpus",
    "FGD",
    "BestFit",
    "DotProd",
    "GpuClustering",
    "GpuPacking",
    "RandomFit",
    "DISPLAY_NAMES",
    "POLICIES",
    "POLICY_NAMES",
    "UnknownNameError",
    "make_policy",
    "TargetWorkload",
]
