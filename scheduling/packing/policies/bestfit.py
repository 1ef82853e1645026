"""BestFit (the reference's `best_fit_score.go`): the node left with the least CPU and GPU after placement.

Node score: ``int((1 - 0.5 * cpuLeft' / 128000 - 0.5 * gpuLeft' / 8000) * 100)``, where ``cpuLeft'`` (milli-cores)
and ``gpuLeft'`` (milli-GPU, all devices) are what the node has free once the pod is placed. The reference then
min-max normalizes the scores over the nodes; that keeps their order, so it is skipped.

GPU devices: best fit (``best_fit_gpus``).
"""

from __future__ import annotations

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, PackingPolicy


class BestFit(PackingPolicy):
    """Least CPU and GPU left after placement (weights 0.5/0.5 over 128 cores / 8 GPUs)."""

    name = "bestfit"
    display_name = "BestFit"

    def score(self, cluster, pod, nodes):
        cpu_left = cluster.cpu_free[nodes]
        gpu_left = cluster.gpu_free[nodes].sum(axis=1)
        s = (cpu_left - pod.cpu_milli).astype(np.float64) / MAX_SPEC_CPU * 0.5
        s = s + (gpu_left - pod.total_gpu_milli).astype(np.float64) / MAX_SPEC_GPU * 0.5
        return ((1.0 - s) * MAX_NODE_SCORE).astype(np.int64)
