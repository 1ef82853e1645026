"""The one interface of placement policies, `PlacementPolicy.plan(problem, agents=None, ...) -> PlanOutcome`, and
`SequentialPolicy`, the base of the policies that the vectorized coordinator (`coordinator.Coordinator`) runs job by
job. Sequential policies differ only in two hooks: `order(problem, prio)` (which job is planned first) and
`score(problem, j, view, evaluator)` (a (K, H, C) array over the job's candidates, lower is better).

=================  ================================  =====================================================
policy             order                             score (among candidates meeting capacity + deadline)
=================  ================================  =====================================================
priority (ours)    priority P, ascending (config.)   forecast carbon of the window incl. transfer, with the
                                                     power-limit options of the power model, plus the learned
                                                     capacity price of the window (`prices.py`)
performance-first  FIFO (submission, id)             end time (earliest start, fastest GPU), default limit
greedy-carbon      FIFO                              earliest start; among those, lowest intensity now
carbon-time        FIFO                              -(carbon saved vs the best earliest start) / (wait + 1)
round-robin        FIFO                              earliest start; clusters in rotating order
random             FIFO                              earliest start; a random cluster order per job
rolling-lp         (LP over the known jobs, hourly)  see `rolling_lp.py`: the hourly plan's default
optimum            (LP over all jobs)                see `optimum.py`: the bound, not an online policy
=================  ================================  =====================================================
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from scheduling.planning.coordinator import Coordinator
from scheduling.planning.job_priority import PriorityParts
from scheduling.planning.outcome import PlanOutcome
from scheduling.planning.problem import PlanningProblem, PriorityWeights

BIG = 1e6  # separates "start hour" from the tie-break inside one score


class PlacementPolicy(ABC):
    """The one interface: plan a problem (optionally with cluster agents that pack the jobs starting now)."""

    name: ClassVar[str] = "base"
    power_aware: ClassVar[bool] = False
    description: ClassVar[str] = ""

    @abstractmethod
    def plan(
        self,
        problem: PlanningProblem,
        agents=None,
        pods=None,
        now_hour: int | None = None,
        *,
        explain: bool = True,
        tentative: bool = True,
    ) -> PlanOutcome:
        """Decide start hour, cluster and power option for every job of `problem`."""

    def capacity_prices(self, context, now_h: int, hours: int):
        """(H, C) kgCO2e per GPU-milli-hour to charge candidate windows, or None. `context` is the
        HourlyPlanner (job history, forecasts, actuals known at now_h)."""
        return None

    def expected_jobs(self, context, now, free, forecast):
        """A PlanningProblem of jobs expected to arrive after `now` (planned for their capacity only, never
        dispatched), or None. `context` is the HourlyPlanner; `free`/`forecast` as in the plan's problem."""
        return None

    @classmethod
    def create(cls, seed: int = 0, weights: PriorityWeights | None = None, learn_prices: bool = True):
        """Factory used by the registry's `make_policy`; a policy takes the options it needs (default: none)."""
        return cls()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SequentialPolicy(PlacementPolicy):
    """A policy that the coordinator runs job by job (see the module table)."""

    weights: PriorityWeights = PriorityWeights()

    def plan(self, problem, agents=None, pods=None, now_hour=None, *, explain=True, tentative=True):
        return Coordinator(problem, self, agents, pods, now_hour).run(explain=explain, tentative=tentative)

    def order(self, problem: PlanningProblem, prio: PriorityParts) -> np.ndarray:
        """FIFO: submission time, then the job's position."""
        sub = problem.jobs["submit_time"].to_numpy()
        return np.lexsort((np.arange(problem.n_jobs), sub))

    def begin(self, problem: PlanningProblem) -> None:
        pass

    @abstractmethod
    def score(self, problem: PlanningProblem, j: int, view, evaluator) -> np.ndarray: ...

    def assigned(self, j: int, c: int) -> None:
        pass
