"""`greedy-carbon`: FIFO; earliest start, and among those the region with the lowest intensity at that hour."""

from __future__ import annotations

from scheduling.planning.policies.base import BIG, SequentialPolicy


class GreedyCarbon(SequentialPolicy):
    """Start as early as possible, in the region with the lowest carbon intensity at that hour."""

    name = "greedy-carbon"
    description = "FIFO, earliest start, the region with the lowest intensity now"

    def score(self, problem, j, view, evaluator):
        return view.s * BIG + problem.forecast[None, : view.n, :] + 0.0 * view.cost
