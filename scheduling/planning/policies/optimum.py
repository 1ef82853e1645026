"""`optimum`: the LP bound behind the placement-policy interface (see `scheduling.planning.lp`). It knows every job
and the actual intensity, so it is a reference for evaluation, never an online policy."""

from __future__ import annotations

import numpy as np
import pandas as pd

from scheduling.planning.candidates import Evaluator
from scheduling.planning.job_priority import priority_parts
from scheduling.planning.lp import LPResult, solve_lp
from scheduling.planning.outcome import PlanOutcome, lp_unplaced_reason
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.problem import PriorityWeights


class OptimumPolicy(PlacementPolicy):
    """The LP bound behind the policy interface. `plan()` solves the relaxation on the problem and reports, per
    job, the candidate with the largest weight (a rounding for display; the bound is `stats['lp']`)."""

    name = "optimum"
    power_aware = True
    description = "LP relaxation over jobs x hours x regions, perfect knowledge (the bound)"

    def __init__(self, late_penalty_kg: float = 1000.0, time_limit_s: float = 600.0):
        self.late_penalty_kg = late_penalty_kg
        self.time_limit_s = time_limit_s
        self.last: LPResult | None = None

    def plan(self, problem, agents=None, pods=None, now_hour=None, *, explain=True, tentative=True):
        lp = solve_lp(problem, self.late_penalty_kg, self.time_limit_s)
        self.last = lp
        N = problem.n_jobs
        best, k, s, c = lp.heaviest(N)
        placed = best > 1e-9
        frac_cost = lp.job_carbon(N)
        cost = np.where(placed, frac_cost, np.nan)
        late = lp.u > 1e-6
        prio = priority_parts(problem, PriorityWeights())
        reason = [None] * N
        if not placed.all():
            ev = Evaluator(problem)
            for j in np.flatnonzero(~placed):
                reason[j] = lp_unplaced_reason(problem, int(j), ev.latest_start(int(j)))
        out = PlanOutcome(
            problem,
            self.name,
            np.arange(N),
            k,
            s,
            c,
            cost,
            late,
            placed,
            reason,
            [None] * N,
            [None] * N,
            ["dispatched" if (p and s[i] == 0) else "tentative" for i, p in enumerate(placed)],
            np.zeros(N, dtype=np.int64),
            prio,
        )
        if explain:
            out.explanations = [
                _lp_explanation(problem, prio, j, k[j], s[j], c[j], frac_cost[j], late[j])
                for j in np.flatnonzero(placed)
            ]
        out.stats = {"lp": lp.summary(), "n_jobs": N, "n_placed": int(placed.sum())}
        return out


def _lp_explanation(problem, prio, j, k, s, c, cost, late) -> dict:
    now = problem.now
    return {
        "job_id": str(problem.jobs["job_id"].iat[j]),
        "priority": float(prio.priority[j]),
        "urgency": float(prio.urgency[j]),
        "flexibility": float(prio.flexibility[j]),
        "opportunity": float(prio.opportunity[j]),
        "weights": prio.weights.as_dict(),
        "chosen": {
            "region": problem.regions[c],
            "cluster": problem.clusters[c],
            "zone": problem.zones[c],
            "start_time": (now + pd.Timedelta(hours=int(s))).isoformat(),
            "kgco2e": round(float(cost), 6),
            "late": bool(late),
        },
        "alternatives": [],
        "counterfactuals": {
            "run_now_kgco2e": None,
            "greedy_carbon_kgco2e": None,
            "optimum_kgco2e": round(float(cost), 6),
        },
        "binding_constraints": ["none"],
        "forecast_version": problem.forecast_version,
        "power": {"limit_w": float(problem.limit_w[k, c]), "saving_kgco2e": None},
        "policy": "optimum",
    }
