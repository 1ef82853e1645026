"""DotProd (the reference's `dot_product_score.go`, run with ``-dimext merge -norm max``): the node whose free
resources are least aligned with the pod's request.

Node score: ``int(100 * (1 - node . pod / 2))`` with node = [cpuLeft / 128000, gpuLeft / 8000] (free now, GPU summed
over the devices) and pod = [cpu / 128000, gpu / 8000] (the pod's total request).

GPU devices: best fit (``best_fit_gpus``).
"""

from __future__ import annotations

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, MAX_SPEC_CPU, MAX_SPEC_GPU, PackingPolicy


class DotProd(PackingPolicy):
    """The smaller the dot product of the normalized free node and pod vectors, the higher the score."""

    name = "dotprod"
    display_name = "DotProd"

    def score(self, cluster, pod, nodes):
        a0 = cluster.cpu_free[nodes].astype(np.float64) / MAX_SPEC_CPU
        a1 = cluster.gpu_free[nodes].sum(axis=1).astype(np.float64) / MAX_SPEC_GPU
        b0 = float(pod.cpu_milli) / MAX_SPEC_CPU
        b1 = float(pod.total_gpu_milli) / MAX_SPEC_GPU
        dot = (0.0 + a0 * b0) + a1 * b1
        return (MAX_NODE_SCORE * (1 - dot / 2.0)).astype(np.int64)
