"""`performance-first`: FIFO; each job takes the candidate that ends earliest (earliest start, fastest GPU) at
the default power limit. The baseline every reduction is measured against."""

from __future__ import annotations

from scheduling.planning.policies.base import SequentialPolicy


class PerformanceFirst(SequentialPolicy):
    """Earliest finish: earliest start on the fastest GPU, at the default power limit."""

    name = "performance-first"
    description = "FIFO, earliest finish (earliest start, fastest GPU)"

    def score(self, problem, j, view, evaluator):
        return view.end + 1e-6 * view.cost
