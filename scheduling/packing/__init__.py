"""GPU-cluster packer: cluster model, pods, fragmentation and packing policies (FGD and five baselines).

The packer places one pod at a time on a cluster of nodes that have CPU, memory and GPU devices; GPU devices
can be shared by fractional pods (milli-GPU). It reproduces the reference simulator of "Beware of
Fragmentation" (Weng et al., USENIX ATC'23): same feasibility rules, integer scores and tie-breaking (see
/work/shared/specs/fgd-reference.md). The hourly planner's cluster agents use it inside each cluster.

Units: CPU milli-cores, memory MiB, GPU milli-GPU (1000 = one device).

API
---
Cluster and pods::

    from scheduling.packing import Cluster, Pod, TargetWorkload, make_policy

    cluster = Cluster.from_nodes(nodes_df)            # columns sn|name, cpu_milli, memory_mib, gpu, model
                                                      # [, tiebreak_rank]; or Cluster(names, cpu, mem, gpu, model)
    pod = Pod("job-1", cpu_milli=8000, memory_mib=30517, num_gpu=1, gpu_milli=500, gpu_spec="V100M16|V100M32")

Target workload (the "typical pods" the fragmentation is measured against)::

    workload = TargetWorkload.from_pods(pods)          # 95 % popularity cut, as the reference
    workload = TargetWorkload.from_specs([(8000, 500, 1), (4000, 0, 0)], [0.7, 0.3])

Policies (``make_policy(name, workload=..., seed=...)``; names in ``POLICY_NAMES``: random, dotprod,
gpuclustering, gpupacking, bestfit, fgd)::

    policy = make_policy("fgd", workload=workload)     # or FGD(workload), BestFit(), ...
    placement = policy.place(cluster, pod)             # -> Placement(node, node_name, gpus, score) | None
    if placement is not None:
        cluster.allocate(pod, placement)               # binds the pod (ValueError if it does not fit)
    cluster.release("job-1")                           # gives its resources back
    policy.schedule(cluster, pod)                      # place + allocate in one call

The framework steps are public too: ``policy.filter(cluster, pod) -> bool[N]``,
``policy.score(cluster, pod, nodes) -> int64[len(nodes)]`` (higher is better),
``policy.choose(...)`` (max score, ties to the lowest ``cluster.tiebreak_rank``) and
``policy.select_gpus(cluster, pod, node) -> tuple[int, ...]``. Subclass :class:`PackingPolicy` for new ones.

Fragmentation::

    cluster.fragmentation(workload)        # float, milli-GPU: sum over nodes of F_n(M)
    cluster.node_fragmentation(workload)   # float64[N], memoized per workload, recomputed for changed nodes
    cluster.gpu_milli_idle                 # free milli-GPU; fragmentation ratio = F / idle
    tables = frag_tables(workload, cluster.model_names)   # shared per workload and model list, with a memo
    node_frag_batch(cpu_left, gpu_free, model_id, tables)  # F for any batch of (hypothetical) node states
    node_frag_memo(cpu_left, gpu_free, model_id, tables)   # the same through the state memo

State (numpy arrays, read-only for callers): ``cluster.cpu_free``, ``mem_free``, ``gpu_free`` (N x G, milli per
device), ``gpu_count``, ``model_id``/``model_names``, ``pod_count``, ``tiebreak_rank``, ``version`` (bumped on
each change of a node), ``bindings`` (pod id -> Binding(pod, node, gpus)), ``gpu_milli_allocated``.
``cluster.copy()`` gives an independent what-if copy.

Policies keep per-cluster caches keyed on ``cluster.version``; they are valid across allocate/release on the
same Cluster object. Not thread-safe: use one policy object per thread.

The openb replay of the paper's experiments (trace loading, arrival order, metrics, plots) is
``scheduling/evaluation/fgd_replay.py``; its command is ``python -m scheduling fgd-replay``.
"""
from scheduling.packing.base import PackingPolicy, best_fit_gpus
from scheduling.packing.cluster import Binding, Cluster, Placement
from scheduling.packing.frag import FragTables, frag_tables, node_frag_batch, node_frag_memo, node_frag_scalar
from scheduling.packing.pods import MILLI, Pod, normalize_gpu_spec, pods_from_frame
from scheduling.packing.policies import FGD, BestFit, DotProd, GpuClustering, GpuPacking, RandomFit
from scheduling.packing.registry import DISPLAY_NAMES, POLICIES, POLICY_NAMES, UnknownNameError, make_policy
from scheduling.packing.workload import TargetWorkload

__all__ = [
    "Binding", "Cluster", "Placement", "FragTables", "frag_tables", "node_frag_batch", "node_frag_memo",
    "node_frag_scalar", "MILLI", "Pod", "normalize_gpu_spec", "pods_from_frame", "PackingPolicy", "best_fit_gpus",
    "FGD", "BestFit", "DotProd", "GpuClustering", "GpuPacking", "RandomFit", "DISPLAY_NAMES", "POLICIES",
    "POLICY_NAMES", "UnknownNameError", "make_policy", "TargetWorkload",
]
