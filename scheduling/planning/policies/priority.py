"""`priority` (ours): plan jobs in priority order P = 0.35 U + 0.40 F + 0.25 O (lowest first); each takes the
(power option, start hour, cluster) with the least forecast carbon of its window, plus the learned capacity price."""

from __future__ import annotations

import numpy as np

from scheduling.planning.policies.base import SequentialPolicy
from scheduling.planning.prices import PriceLearner
from scheduling.planning.problem import PriorityWeights


class PriorityCarbon(SequentialPolicy):
    """Ours: priority order, minimum forecast carbon over (power option, start, cluster)."""

    name = "priority"
    power_aware = True
    description = "priority order (P = 0.35U + 0.40F + 0.25O), min forecast carbon, power-limit options"

    @classmethod
    def create(cls, seed=0, weights=None, learn_prices=True):
        return cls(weights, learn_prices=learn_prices)

    def __init__(self, weights: PriorityWeights | None = None, learn_prices: bool = True, price_window_h: int = 72):
        self.weights = weights or PriorityWeights()
        self.prices = PriceLearner(window_h=price_window_h) if learn_prices else None

    def capacity_prices(self, context, now_h, hours):
        if self.prices is None:
            return None
        self.prices.maybe_refresh(now_h, context.table, context.forecast_matrix, context.actual_matrix)
        return self.prices.prices(now_h, hours)

    def order(self, problem, prio):
        key = prio.priority if self.weights.order == "ascending" else -prio.priority
        sub = problem.jobs["submit_time"].to_numpy()
        return np.lexsort((np.arange(problem.n_jobs), sub, np.round(key, 12)))

    def score(self, problem, j, view, evaluator):
        return view.cost if view.price is None else view.cost + view.price

    def __repr__(self) -> str:
        return f"PriorityCarbon({self.weights.as_dict()})"
