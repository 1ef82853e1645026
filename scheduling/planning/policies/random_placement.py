"""`random`: FIFO; earliest start, a random cluster among those where the job can start then."""

from __future__ import annotations

import numpy as np

from scheduling.planning.policies.base import BIG, SequentialPolicy


class RandomPlacement(SequentialPolicy):
    """Earliest start; a random cluster among those where the job can start then."""

    name = "random"
    description = "FIFO, earliest start, random cluster"

    @classmethod
    def create(cls, seed=0, weights=None, learn_prices=True):
        return cls(seed=seed)

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def score(self, problem, j, view, evaluator):
        u = self.rng.random(problem.n_clusters)
        return view.s * BIG + u[None, None, :] + 0.0 * view.cost
