"""Variants of `rolling-lp` for evaluation, and the ablation runs of `results.evaluate(..., ablations=True)`.

Each variant is a `RollingLP` subclass that overrides one or two of its hooks; none is the adopted configuration
(`RollingLPOptions`), which the registered `rolling-lp` runs. Each takes its own parameters, then `options`
(default `RollingLPOptions()`); ReplayPlan runs fixed options.

    WarmStarted()                            each hour's LP starts from the last one's simplex basis
    LearnedPrices()                          the priority policy's learned capacity prices in the LP's objective
    ClairvoyantArrivals(48)                  the trace's true next arrivals instead of the replayed ones
    ReserveMultiGpu()                        hold a draining node for each blocked multi-GPU job
    StandbyBackfill(6)                       jobs ending within 6 h may use a standby node
    StandbyJobGpus(2)                        jobs of 2 GPUs or more may use a standby node
    StandbyBelowUtilization(0.7)             no standby nodes while more than 70 % of the GPUs are allocated
    StandbyNeverYields()                     a due job never starts on a standby node
    DefaultPowerReduction()                  a large LP keeps the default power limit, not the least-carbon option
    ReplayPlan(plan)                         execute a fixed plan through the agents (`bounds.replay_optimum`)

`ABLATION_RUNS` names the runs `evaluate` adds beside the policies (`run_ablations`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from scheduling.evaluation.simulator import simulate
from scheduling.planning.agents import STANDBY
from scheduling.planning.forecasts import make_forecasts
from scheduling.planning.lp import LPResult, WarmStart, solve_lp
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.policies.rolling_lp import Dispatch, RollingLP, RollingLPOptions
from scheduling.planning.prices import PriceLearner
from scheduling.planning.problem import PriorityWeights, abs_hours

PERFECT_INFORMATION = "rolling-lp-perfect-information"
PERFECT_ARRIVALS_H = 48  # the perfect-information run's look-ahead on arrivals: shorter sees less, longer adds nothing
REFERENCE_RUNS = (PERFECT_INFORMATION,)  # ablations reported over seeds beside the policies and the bound


# ---------------------------------------------------------------------------------------------------- variants
class WarmStarted(RollingLP):
    """Each hour's LP starts from the simplex basis of the last one (`lp.WarmStart`): the same optimum in fewer
    simplex iterations, though where the LP is degenerate now and then another optimal vertex.

    Changes `_solve_options` (`warm`)."""

    def __init__(self, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.warm = WarmStart()

    def _solve_options(self) -> dict:
        return {**super()._solve_options(), "warm": self.warm}


class LearnedPrices(RollingLP):
    """Adds the priority policy's learned capacity prices (`prices.PriceLearner`: LP duals of the last 72 h of
    arrivals, per hour of day and cluster) to the LP's objective, folded into the intensity: a stand-in for the
    jobs that have not arrived yet.

    Changes `capacity_prices` (None in `RollingLP`)."""

    def __init__(self, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.prices = PriceLearner()

    def capacity_prices(self, context, now_h, hours):
        self.prices.maybe_refresh(now_h, context.table, context.forecast_matrix, context.actual_matrix)
        return self.prices.prices(now_h, hours)


class ClairvoyantArrivals(RollingLP):
    """The expected jobs are the jobs that *will* arrive in the next `hours` hours, at their true times, instead of
    the replayed recent arrivals: with oracle forecasts, the perfect-information reference of the ablations. The
    simulator's job table holds them; a live plan's holds only the jobs known, so there it finds none.

    Changes `_expected_arrivals`."""

    def __init__(self, hours: int = PERFECT_ARRIVALS_H, options: RollingLPOptions | None = None):
        if hours < 1:
            raise ValueError(f"ClairvoyantArrivals needs a look-ahead of at least one hour, not {hours}")
        super().__init__(options)
        self.hours = int(hours)

    def _expected_arrivals(self, tbl, now_h: int) -> tuple[np.ndarray, int] | None:
        return np.flatnonzero((tbl.submit_h > now_h) & (tbl.submit_h < now_h + self.hours)), 0


class ReserveMultiGpu(RollingLP):
    """Holds a node for each pending multi-GPU job that no node of its LP cluster can take now -- the node that
    drains first, open to jobs that end before the job's planned start -- and gives the LP per-cluster earliest
    starts for these jobs (when that node will have drained); only while the fleet's GPU allocation is at most
    `below_utilization` (a draining node idles capacity a busy fleet lacks). At most `max_nodes` held per cluster.

    Changes `_prepare` (drain releases, holds dropped above the threshold) and `_before_dispatch` (the holds)."""

    def __init__(self, max_nodes: int = 1, below_utilization: float = 1.0, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.max_nodes = max_nodes
        self.below_utilization = below_utilization
        self._holding = False

    def _prepare(self, p, agents, pods, now_hour):
        p = super()._prepare(p, agents, pods, now_hour)
        self._holding = self._holds_affordable(p, agents, pods)
        return _with_drain_release(p, agents, pods, now_hour) if self._holding else p

    def _before_dispatch(self, d: Dispatch) -> None:
        super()._before_dispatch(d)
        if self._holding:
            self._reserve(d.p, d.lp, d.agents, d.pods, d.now_hour)

    def _holds_affordable(self, p, agents, pods) -> bool:
        """Holds only while the GPU allocation now is at most `below_utilization`; above it every hold is dropped."""
        if agents is None or pods is None:
            return False
        if allocated_now(p) <= self.below_utilization:
            return True
        for agent in agents:
            for node in [n for n, (holder, _) in agent.reserved.items() if holder != STANDBY]:
                del agent.reserved[node]
        return False

    def _reserve(self, p, lp: LPResult, agents, pods, now_hour) -> dict[str, str]:
        """Hold a node for every pending multi-GPU job on the cluster where the LP plans it, when no node there can
        take it now (`ClusterAgent.reserve`), earliest planned start first; made again from the LP at every plan.
        A hold stays with its job while the LP keeps some of the job on that cluster (a draining node must not be
        swapped for another one every hour). Returns {job id: node}."""
        weight, _, sb, cb = lp.heaviest(p.n_jobs)
        want = np.flatnonzero((p.jobs["num_gpu"].to_numpy() > 1) & (weight > 1e-9))
        want = want[np.argsort(sb[want], kind="stable")]
        ids = [pods[int(j)].pod_id for j in range(p.n_jobs)]
        mass_c = {}
        sel = lp.x > 1e-9
        for j, c in zip(lp.job[sel], lp.c[sel]):
            mass_c.setdefault(ids[int(j)], set()).add(int(c))
        for c, agent in enumerate(agents):
            for node, (holder, _) in list(agent.reserved.items()):
                if holder != STANDBY and c not in mass_c.get(holder, ()):
                    del agent.reserved[node]
        held = {}
        for j in want:
            agent, pod = agents[int(cb[j])], pods[int(j)]
            if agent.cluster.feasible(pod).any():
                continue
            node = agent.reserve(pod, self.max_nodes, until_h=now_hour + int(sb[j]))
            if node is not None:
                held[pod.pod_id] = node
        return held


class StandbyBackfill(RollingLP):
    """Other jobs may use a standby node if they end within `hours` hours.

    Changes `_standby_until`."""

    def __init__(self, hours: int, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.hours = int(hours)

    def _standby_until(self, now_hour: int) -> int:
        return now_hour + self.hours


class StandbyJobGpus(RollingLP):
    """Jobs of `gpus` GPUs or more (instead of whole-node jobs) may use a standby node.

    Changes `_standby_job_gpus`."""

    def __init__(self, gpus: int, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.gpus = int(gpus)

    def _standby_job_gpus(self) -> int:
        return self.gpus


class StandbyBelowUtilization(RollingLP):
    """Keeps no standby node (and releases the ones kept) while more than `share` of the fleet's GPUs is allocated.

    Changes `_give_back_standby`."""

    def __init__(self, share: float, options: RollingLPOptions | None = None):
        super().__init__(options)
        self.share = float(share)

    def _give_back_standby(self, p, agents) -> bool:
        if allocated_now(p) <= self.share:
            return False
        for agent in agents:
            for node in agent.standby_nodes():
                del agent.reserved[node]
        return True


class StandbyNeverYields(RollingLP):
    """A due job never starts on a standby node: the node stays kept for whole-node jobs even if the job runs late.

    Changes `_due_on_standby`."""

    def _due_on_standby(self, d: Dispatch, j: int, options: list[tuple]) -> bool:
        return False


class DefaultPowerReduction(RollingLP):
    """An LP above `max_power_candidates` keeps the default power limit of each (job, start hour, cluster) instead of
    the option with the least forecast carbon.

    Changes `_solve_options` (`power_reduction="default"`)."""

    def _solve_options(self) -> dict:
        return {**super()._solve_options(), "power_reduction": "default"}


class ReplayPlan(RollingLP):
    """Executes a fixed plan {job_id: (power option, absolute start hour, cluster)} through the same hourly machinery
    (cluster agents, forced starts when a job is due): each hour, a job whose planned hour has come is offered to its
    planned cluster; one that cannot start there waits while it can and is then started where it still meets its
    deadline. Measures what node packing costs a plan made without it (`bounds.replay_optimum`).

    Runs on every GPU, without a candidate limit, job budget, standby pool or expected jobs; changes `_solve` (the
    LP's weights are the plan's)."""

    name = "replay-plan"
    description = "replay a fixed offline plan through the cluster agents (diagnostic)"

    def __init__(self, plan: dict):
        super().__init__(
            RollingLPOptions(
                capacity_factor=1.0,
                max_power_candidates=None,
                max_lp_jobs=None,
                standby_pool=False,
                expected_arrivals_h=0,
            )
        )
        self.fixed = plan

    def _solve(self, p) -> LPResult:
        lp = solve_lp(p, self.options.late_penalty_kg, self.options.time_limit_s, presolve=False)
        now = int(abs_hours(p.now))
        x = np.zeros_like(lp.x)
        first = np.searchsorted(lp.job, np.arange(p.n_jobs + 1))
        for j, job_id in enumerate(p.jobs["job_id"].astype(str)):
            if job_id not in self.fixed:
                continue
            k, start, c = self.fixed[job_id]
            rel = max(int(start) - now, 0)
            v = np.arange(first[j], first[j + 1])
            hit = v[(lp.k[v] == k) & (lp.c[v] == c) & (lp.s[v] == rel)]
            later = v[lp.s[v] >= 1]
            if len(hit):
                x[hit[0]] = 1.0
            elif rel > 0 and len(later):  # keep it waiting for its planned hour
                x[later[0]] = 1.0
        lp.x = x
        return lp


def allocated_now(p) -> float:
    """Share of the fleet's GPU-milli allocated now (hour 0 of the problem)."""
    return 1.0 - float(p.free[0].sum()) / max(float(np.sum(p.capacity)), 1.0)


def _with_drain_release(p, agents, pods, now_hour):
    """The problem with per-cluster earliest starts for multi-GPU jobs that no node of a cluster can take now: the
    hour the node they hold there (or else the first node able to host them) has drained. The LP's per-cluster
    GPU count cannot see that a whole-node job waits for a node to empty."""
    multi = np.flatnonzero(p.jobs["num_gpu"].to_numpy() > 1)
    if not len(multi):
        return p
    rel = np.repeat(p.release[:, None], p.n_clusters, axis=1).astype(np.int64)
    for j in multi:
        pod = pods[int(j)]
        for c, agent in enumerate(agents):
            if not p.allowed[j, c] or agent.cluster.feasible(pod).any():
                continue
            opt = agent.drain_option(pod, max_reserved=len(agent.reserved) + 1)
            if opt is not None:
                rel[j, c] = max(rel[j, c], opt[1] - int(now_hour))
    return dataclasses.replace(p, release_c=rel)


# ---------------------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class AblationRun:
    """One run beside the evaluated policies: `policy` (a registered name, or a factory of the policy object) planning
    from `forecasts` ("oracle": the actual intensity, "naive": seasonal naive, None: the scenario's own); run only
    when `requires` is among the evaluated policies (None: always)."""

    label: str
    policy: str | Callable[[], PlacementPolicy]
    forecasts: str | None = None
    requires: str | None = None


ABLATION_RUNS = (
    AblationRun("priority-noprices", "priority-noprices"),  # the priority formula without learned capacity prices
    AblationRun("priority-oracle-forecast", "priority", "oracle"),
    AblationRun("priority-naive-forecast", "priority", "naive"),
    AblationRun("rolling-lp-oracle-forecast", "rolling-lp", "oracle", requires="rolling-lp"),
    AblationRun("rolling-lp-naive-forecast", "rolling-lp", "naive", requires="rolling-lp"),
    # the perfect-information reference: what the same hourly plan reaches on the same nodes when nothing is
    # uncertain -- oracle forecasts and the true arrivals of the next hours instead of the replayed ones
    AblationRun(PERFECT_INFORMATION, lambda: ClairvoyantArrivals(PERFECT_ARRIVALS_H), "oracle", requires="rolling-lp"),
)


def run_ablations(
    sc,
    policies,
    *,
    seed: int = 0,
    weights: PriorityWeights | None = None,
    postpone_margin_h: float = 1.0,
    runs: tuple[AblationRun, ...] = ABLATION_RUNS,
) -> dict[str, dict]:
    """The simulated metrics of each of `runs` that applies to `policies` (the evaluated policy names), by label, in
    the order of `runs`; runs on the same forecasts share one provider."""
    providers = {}
    out = {}
    for run in runs:
        if run.requires is not None and run.requires not in policies:
            continue
        if run.forecasts is not None and run.forecasts not in providers:
            providers[run.forecasts] = make_forecasts(run.forecasts, sc.grid, sc.fleet.zones)
        policy = run.policy if isinstance(run.policy, str) else run.policy()
        out[run.label] = simulate(
            sc,
            policy,
            seed=seed,
            weights=weights,
            forecasts=providers.get(run.forecasts),
            postpone_margin_h=postpone_margin_h,
        ).metrics
    return out
