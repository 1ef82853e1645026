"""Placement policies behind one interface, `PlacementPolicy.plan(problem, agents=None, ...) -> PlanOutcome`.

Sequential policies share the vectorized coordinator (`coordinator.Coordinator`) and differ only in two hooks:
`order(problem, prio)` (which job is planned first) and `score(problem, j, view, evaluator)` (a (K, H, C) array
over the job's candidates, lower is better). No code path branches on a policy's name.

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
optimum            (LP over all jobs)                see `optimum.py`: the bound, not a sequential policy
=================  ================================  =====================================================
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from scheduling.planning.coordinator import Coordinator, PlanOutcome, PriorityParts
from scheduling.domain.plan import PlanningProblem, Preemption, PriorityWeights

BIG = 1e6  # separates "start hour" from the tie-break inside one score


class PlacementPolicy(ABC):
    """The one interface: plan a problem (optionally with cluster agents that pack the jobs starting now)."""

    name: ClassVar[str] = "base"
    power_aware: ClassVar[bool] = False
    description: ClassVar[str] = ""
    preemption: Preemption | None = None  # set: the policy may evict running checkpointing jobs (`evicted`)

    @abstractmethod
    def plan(self, problem: PlanningProblem, agents=None, pods=None, now_hour: int | None = None, *,
             explain: bool = True, tentative: bool = True) -> PlanOutcome:
        """Decide start hour, cluster and power option for every job of `problem`."""

    def capacity_prices(self, context, now_h: int, hours: int):
        """(H, C) kgCO2e per GPU-milli-hour to charge candidate windows, or None. `context` is the
        HourlyPlanner (job history, forecasts, actuals known at now_h)."""
        return None

    def expected_jobs(self, context, now, free, forecast):
        """A PlanningProblem of jobs expected to arrive after `now` (planned for their capacity only, never
        dispatched), or None. `context` is the HourlyPlanner; `free`/`forecast` as in the plan's problem."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SequentialPolicy(PlacementPolicy):
    """A policy that the coordinator runs job by job (see the module table)."""

    weights: PriorityWeights = PriorityWeights()

    @classmethod
    def create(cls, seed: int = 0, weights: PriorityWeights | None = None, learn_prices: bool = True):
        """Factory used by `make_policy`; subclasses take the options they need."""
        return cls()

    def plan(self, problem, agents=None, pods=None, now_hour=None, *, explain=True, tentative=True):
        return Coordinator(problem, self, agents, pods, now_hour).run(explain=explain, tentative=tentative)

    def order(self, problem: PlanningProblem, prio: PriorityParts) -> np.ndarray:
        """FIFO: submission time, then the job's position."""
        sub = problem.jobs["submit_time"].to_numpy()
        return np.lexsort((np.arange(problem.n_jobs), sub))

    def begin(self, problem: PlanningProblem) -> None:
        pass

    @abstractmethod
    def score(self, problem: PlanningProblem, j: int, view, evaluator) -> np.ndarray:
        ...

    def assigned(self, j: int, c: int) -> None:
        pass


class PriorityCarbon(SequentialPolicy):
    """Ours: priority order, minimum forecast carbon over (power option, start, cluster)."""

    name = "priority"
    power_aware = True
    description = "priority order (P = 0.35U + 0.40F + 0.25O), min forecast carbon, power-limit options"

    @classmethod
    def create(cls, seed=0, weights=None, learn_prices=True):
        return cls(weights, learn_prices=learn_prices)

    def __init__(self, weights: PriorityWeights | None = None, learn_prices: bool = True,
                 price_window_h: int = 72):
        from scheduling.planning.prices import PriceLearner

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


class PerformanceFirst(SequentialPolicy):
    """Earliest finish: earliest start on the fastest GPU, at the default power limit."""

    name = "performance-first"
    description = "FIFO, earliest finish (earliest start, fastest GPU)"

    def score(self, problem, j, view, evaluator):
        return view.end + 1e-6 * view.cost


class GreedyCarbon(SequentialPolicy):
    """Start as early as possible, in the region with the lowest carbon intensity at that hour."""

    name = "greedy-carbon"
    description = "FIFO, earliest start, the region with the lowest intensity now"

    def score(self, problem, j, view, evaluator):
        return view.s * BIG + problem.forecast[None, : view.n, :] + 0.0 * view.cost


class CarbonTime(SequentialPolicy):
    """Carbon saved per unit of waiting: among candidates, maximise (C_ref - C) / (wait + 1), where C_ref is
    the cheapest candidate at the earliest feasible start and wait the hours after it (GAIA's Carbon-Time,
    extended to regions). A candidate saving nothing scores its plain cost behind every saving one."""

    name = "carbon-time"
    description = "FIFO, maximise carbon saved per hour of waiting"

    def score(self, problem, j, view, evaluator):
        feas = view.feasible
        if not feas.any():
            return view.cost
        s_min = int(np.nonzero(feas.any(axis=(0, 2)))[0][0])
        ref = np.where(feas[:, s_min, :], view.cost[:, s_min, :], np.inf).min()
        wait = np.maximum(view.s - s_min, 0)
        saved = ref - view.cost
        rate = saved / (wait + 1.0)
        return np.where(saved > 1e-12, -rate, BIG + view.cost)


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


def _optimum():
    from scheduling.planning.lp import OptimumPolicy

    return OptimumPolicy


def _rolling_lp():
    from scheduling.planning.policies.rolling_lp import RollingLP

    return RollingLP


POLICY_CLASSES = {
    PriorityCarbon.name: PriorityCarbon,
    PerformanceFirst.name: PerformanceFirst,
    GreedyCarbon.name: GreedyCarbon,
    CarbonTime.name: CarbonTime,
    RoundRobin.name: RoundRobin,
    RandomPlacement.name: RandomPlacement,
}
ONLINE_POLICIES = ("priority", "rolling-lp", "performance-first", "greedy-carbon", "carbon-time", "round-robin",
                   "random")
POLICY_NAMES = ONLINE_POLICIES + ("optimum",)
# The hourly plan's default: on all four evaluated scenarios (two periods x two loads) it emits less carbon and meets
# more deadlines than `priority` (docs/results/planner/results.md); `priority` stays the formula.
DEFAULT_POLICY = "rolling-lp"


def make_policy(name: str, *, seed: int = 0, weights: PriorityWeights | None = None,
                learn_prices: bool = True) -> PlacementPolicy:
    """A fresh policy by name (POLICY_NAMES). `priority-noprices` is the priority policy without learned
    capacity prices (the formula alone); `rolling-lp` the model-predictive policy (`rolling_lp.py`)."""
    if name == "optimum":
        return _optimum()()
    if name == "rolling-lp":
        return _rolling_lp()()
    if name == "priority-noprices":
        return PriorityCarbon(weights, learn_prices=False)
    if name not in POLICY_CLASSES:
        raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return POLICY_CLASSES[name].create(seed=seed, weights=weights, learn_prices=learn_prices)
