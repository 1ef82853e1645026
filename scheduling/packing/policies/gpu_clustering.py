"""GpuClustering (the reference's `gpu_clustering_score.go`): pods with the same GPU-affinity tag ("share-gpu" or
"<k>-gpu") together.

Node score: ``25 * (8000 - gpuLeft) // 8000`` (gpuLeft: free milli-GPU now, all devices) plus 75 if the node runs
only pods of the pod's tag, 50 if the pod's tag is among others, 25 if the node has no tagged pods, 0 if only other
tags. CPU-only pods score 0 everywhere.

GPU devices: best fit (``best_fit_gpus``).
"""

from __future__ import annotations

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, MAX_SPEC_GPU, PackingPolicy


class GpuClustering(PackingPolicy):
    """Prefer nodes already running pods of the same GPU-affinity tag."""

    name = "gpuclustering"
    display_name = "GpuClustering"

    def score(self, cluster, pod, nodes):
        if not pod.num_gpu:
            return np.zeros(len(nodes), dtype=np.int64)
        col = 0 if pod.is_shared else pod.num_gpu
        tags = cluster.tag_count[nodes]
        n_tags = (tags > 0).sum(axis=1)
        same = tags[:, col] > 0 if col < tags.shape[1] else np.zeros(len(nodes), dtype=bool)
        base = (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU - cluster.gpu_free[nodes].sum(axis=1)) // MAX_SPEC_GPU
        bonus = np.where(same, np.where(n_tags == 1, 75, 50), np.where(n_tags == 0, 25, 0))
        return (base + bonus).astype(np.int64)
