"""`round-robin`: FIFO; earliest start, clusters tried in a rotating order."""

from __future__ import annotations

import numpy as np

from scheduling.planning.policies.base import BIG, SequentialPolicy


class RoundRobin(SequentialPolicy):
    """Earliest start; clusters tried in a rotating order (the next job starts after the last one's cluster)."""

    name = "round-robin"
    description = "FIFO, earliest start, clusters in rotation"

    def __init__(self):
        self.ptr = 0

    def begin(self, problem):
        self.C = problem.n_clusters

    def score(self, problem, j, view, evaluator):
        rank = (np.arange(problem.n_clusters) - self.ptr) % problem.n_clusters
        return view.s * BIG + rank[None, None, :] + 0.0 * view.cost

    def assigned(self, j, c):
        self.ptr = (c + 1) % self.C
