"""Random (the reference's `random_score.go`): one feasible node uniformly at random.

Node score: 100 for one feasible node drawn uniformly, 0 for the others.

GPU devices: a shared pod gets a fitting device drawn uniformly (reservoir sampling in the reference); whole-GPU
pods the first fully-free devices by index. The reference draws from Go's global math/rand, which cannot be
replayed; this uses ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np

from scheduling.packing.base import MAX_NODE_SCORE, PackingPolicy, best_fit_gpus
from scheduling.packing.workload import TargetWorkload


class RandomFit(PackingPolicy):
    """A feasible node, and for a shared pod a fitting device, uniformly at random (seeded)."""

    name = "random"
    display_name = "Random"

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    @classmethod
    def create(cls, workload: TargetWorkload | None = None, seed: int | None = None) -> RandomFit:
        return cls(seed)

    def score(self, cluster, pod, nodes):
        out = np.zeros(len(nodes), dtype=np.int64)
        out[self.rng.integers(len(nodes))] = MAX_NODE_SCORE
        return out

    def select_gpus(self, cluster, pod, node):
        if pod.is_shared:
            fits = np.flatnonzero(cluster.gpu_free[node, : cluster.gpu_count[node]] >= pod.gpu_milli)
            return (int(fits[self.rng.integers(len(fits))]),)
        return best_fit_gpus(cluster, pod, node)
