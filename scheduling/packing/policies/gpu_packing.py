"""GpuPacking (the reference's `gpu_packing_score.go`): shared devices first, then free devices of used nodes,
then idle nodes.

Node score, from the devices the pod would take (``ratio`` = sum of their free share in percent):

* the pod fits on partly used devices: ``max(100 - ratio // 10, 50)``;
* it takes fully-free devices (``full_used`` of them) of a node already in use: ``max(50 - full_used, 33)``;
* the node is idle (all ``n`` devices free): ``max(33 - n, n)``.

CPU-only pods score 0 everywhere. GPU devices: best fit (``best_fit_gpus``).
"""

from __future__ import annotations

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, PackingPolicy, sorted_take
from scheduling.packing.pods import MILLI


class GpuPacking(PackingPolicy):
    """Prefer shared devices, then used nodes, then idle nodes."""

    name = "gpupacking"
    display_name = "GpuPacking"

    def score(self, cluster, pod, nodes):
        if pod.gpu_milli <= 0:
            return np.zeros(len(nodes), dtype=np.int64)
        n_full = cluster.gpu_full[nodes]
        idle_node = n_full == cluster.gpu_count[nodes]
        if pod.gpu_milli == MILLI:  # whole devices: always fully-free ones
            full_used = np.full(len(nodes), pod.num_gpu)
            ratio = np.zeros(len(nodes), dtype=np.int64)
        elif pod.num_gpu == 1:  # the least free device that fits
            free = cluster.gpu_free[nodes]
            least = np.where(free >= pod.gpu_milli, free, MILLI + 1).min(axis=1)
            full_used = (least == MILLI).astype(np.int64)
            ratio = least * 100 // MILLI
        else:
            srt, take = sorted_take(cluster.gpu_free[nodes], pod)
            full_used = (take & (srt == MILLI)).sum(axis=1)
            ratio = np.where(take, srt * 100 // MILLI, 0).sum(axis=1)
        case1 = np.maximum(MAX_NODE_SCORE - ratio // 10, MAX_NODE_SCORE // 2)
        case2 = np.maximum(MAX_NODE_SCORE // 2 - full_used, MAX_NODE_SCORE // 3)
        case3 = np.maximum(MAX_NODE_SCORE // 3 - n_full, n_full)
        return np.where(idle_node, case3, np.where(full_used > 0, case2, case1)).astype(np.int64)
