"""Bounds and where a policy's gap to them comes from.

The bound (`solve_optimum`) is the LP relaxation of `scheduling.planning.lp.solve_lp` with every job of the trace
known at the start, the actual intensity and an empty fleet: no schedule that meets as many deadlines emits less,
whatever it knew. `solve_preemptive_optimum` is the same if checkpointing jobs could stop and resume;
`gap_by_job_shape` splits a policy's carbon above the bound by job GPU shape; `replay_optimum` executes the bound's
schedule through the cluster agents (what node packing costs it).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from scheduling.evaluation.ablations import ReplayPlan
from scheduling.evaluation.scenario_record import Scenario
from scheduling.evaluation.simulator import by_cluster, simulate
from scheduling.planning.lp import solve_lp, solve_preemptive_lp
from scheduling.planning.problem import abs_hours

PER_JOB_KEY = "_per_job_kgco2e"  # `solve_optimum(per_job=True)`: each job's carbon in the bound (not JSON)


def optimum_problem(sc: Scenario):
    """The bound's problem: every job of the trace known at the start, actual intensity, empty fleet."""
    tbl = sc.table
    T0 = abs_hours(sc.start)
    d = np.where(np.isfinite(tbl.dur), tbl.dur, 0).max(axis=(1, 2))
    H = int(np.ceil(max((tbl.deadline_h - T0).max(), (tbl.submit_h - T0 + d).max()) + 48))
    t0g, ci = sc.actual("ci")
    _, ren = sc.actual("renewable")
    a = T0 - t0g
    if a + H > ci.shape[0]:
        H = ci.shape[0] - a
    free = np.repeat(sc.fleet.resource_capacity[:, None, :], H, axis=1)  # (3, H, C)
    prob = tbl.problem(
        sc.start,
        np.arange(tbl.n),
        free,
        ci[a : a + H],
        power_aware=True,
        forecast_version="actual (perfect knowledge)",
        renewable=ren[a : a + H],
        release=np.maximum(tbl.submit_h - T0, 0),
    )
    return prob


class BoundNotSolved(RuntimeError):
    """The bound's LP stopped before optimality (time limit, numerical trouble): its value bounds nothing."""


def _require_solved(name: str, result, time_limit_s: float, *, has_schedule: bool = False) -> None:
    """An LP that stopped early is no bound (HiGHS then returns no solution: it would read as 0 kg, and every
    policy's share as if measured against zero emissions). A time-limited MILP is accepted with a whole schedule
    (`has_schedule`). `result`: an LPResult or PreemptiveBound."""
    if result.status == "optimal" or has_schedule:
        return
    raise BoundNotSolved(
        f"{name}: HiGHS stopped with status {result.status!r} after {result.solve_s:.0f} s (time limit "
        f"{time_limit_s:.0f} s; {result.n_vars} variables): no bound. Give it more time (evaluate --lp-time-limit) "
        "or a quieter machine."
    )


def solve_optimum(sc: Scenario, time_limit_s: float = 600.0, integral: bool = False, per_job: bool = False) -> dict:
    """The bound (LP relaxation); `integral=True`: the same model with whole jobs (MILP, time-limited);
    `per_job=True`: also each job's carbon in the bound (array under `PER_JOB_KEY`, not JSON). Raises
    `BoundNotSolved` when the solver stops before it has a bound (LP) or a schedule (MILP)."""
    t = time.perf_counter()
    prob = optimum_problem(sc)
    lp = solve_lp(prob, time_limit_s=time_limit_s, integral=integral)
    _require_solved(
        "the optimum's " + ("MILP" if integral else "LP"),
        lp,
        time_limit_s,
        has_schedule=integral and float(lp.x.sum() + lp.u.sum()) > 0.5,
    )
    n = prob.n_jobs
    x, u = lp.x, lp.u
    late_delay = np.where(lp.late_start >= 0, lp.late_start - prob.release, 0)
    delay = float(((x * (lp.s - prob.release[lp.job])).sum() + (u * late_delay).sum()) / max(n, 1))
    energy = float(x @ lp.energy_kwh + u @ lp.late_energy_kwh)
    renew = float(x @ lp.renewable_kwh + u @ lp.late_renewable_kwh)
    # allocated GPU-milli per hour of the period from the fractional solution (timely part)
    H, C = prob.hours, prob.n_clusters
    occ = np.ceil(prob.dur[lp.job, lp.k, lp.c] - 1e-9).astype(np.int64)
    diff = np.zeros((H + 1, C))
    g = prob.gpu_total[lp.job] * x
    np.add.at(diff, (lp.s, lp.c), g)
    np.add.at(diff, (np.minimum(lp.s + occ, H), lp.c), -g)
    alloc = np.cumsum(diff, axis=0)[: sc.hours]
    cap = sc.fleet.capacity_milli
    out = {
        "kgco2e": lp.objective_kg,
        "energy_kwh": energy,
        "renewable_share": renew / max(energy, 1e-12),
        "deadline_satisfaction": float(1.0 - u.sum() / max(n, 1)),
        "mean_delay_h": delay,
        "unallocated_gpus": float(((cap[None, :] - alloc).sum(axis=1) / 1000.0).mean()),
        "utilization": float(alloc.sum() / (cap.sum() * sc.hours)),
        "by_cluster": by_cluster(sc, alloc),
        "lp": lp.summary(),
        "runtime_s": round(time.perf_counter() - t, 2),
    }
    if per_job:
        out[PER_JOB_KEY] = lp.job_carbon(n)  # (N,) in the job table's order
    return out


def solve_preemptive_optimum(sc: Scenario, time_limit_s: float = 600.0) -> dict:
    """The bound if the checkpointing jobs (the trace's `checkpointing` flag) could be preempted and resumed
    (`solve_preemptive_lp`): the reference a policy that preempts would be measured against, and the most that
    preempting could save over the non-preemptive bound (`solve_optimum`)."""
    t = time.perf_counter()
    prob = optimum_problem(sc)
    bound = solve_preemptive_lp(prob, prob.jobs["checkpointing"].to_numpy(bool), time_limit_s=time_limit_s)
    _require_solved("the preemptive bound's LP", bound, time_limit_s)
    return {
        "kgco2e": bound.objective_kg,
        "deadline_satisfaction": 1.0 - bound.late_job_share,
        "preemptible_share": bound.n_preemptible / max(prob.n_jobs, 1),
        "lp": bound.summary(),
        "runtime_s": round(time.perf_counter() - t, 2),
    }


def job_shape(jobs: pd.DataFrame) -> np.ndarray:
    """Per job its GPU shape for the gap breakdown: "<1" (a share of one GPU) or the whole-GPU count."""
    whole = jobs["gpu_milli"].to_numpy() >= 1000
    return np.where(whole, jobs["num_gpu"].astype(int).astype(str).to_numpy(), "<1")


def gap_by_job_shape(sc: Scenario, records: pd.DataFrame, optimum_per_job: np.ndarray, base_kg: float) -> dict:
    """Where a policy's carbon above the bound comes from, by job GPU shape: per shape the jobs, the policy's and
    the bound's carbon, the gap and its share of the whole gap, the share of late jobs, and the share of the
    optimum's reduction the policy would capture if that shape alone ran at the bound's carbon."""
    shape = job_shape(sc.jobs)
    by_job = records.set_index("job_id").reindex(sc.jobs["job_id"])
    kg = by_job["kgco2e"].to_numpy()
    met = by_job["met_deadline"].to_numpy(dtype=bool)
    total_gap = float(kg.sum() - optimum_per_job.sum())
    reduction = base_kg - float(optimum_per_job.sum())
    out = {}
    for s in sorted(set(shape), key=lambda v: (v != "<1", int(v) if v != "<1" else 0)):
        m = shape == s
        gap = float(kg[m].sum() - optimum_per_job[m].sum())
        out[s] = {
            "jobs": int(m.sum()),
            "kgco2e": float(kg[m].sum()),
            "optimum_kgco2e": float(optimum_per_job[m].sum()),
            "gap_kg": gap,
            "gap_share_pct": 100.0 * gap / total_gap if abs(total_gap) > 1e-9 else None,
            "late_share": float(1.0 - met[m].mean()),
            "share_if_at_optimum_pct": (
                100.0 * (base_kg - float(kg.sum()) + gap) / reduction if reduction > 1e-9 else None
            ),
        }
    return out


def replay_optimum(sc: Scenario, integral: bool = False, time_limit_s: float = 600.0) -> dict:
    """Diagnostic: the offline optimum's schedule (LP rounded to each job's heaviest candidate, or the whole-job MILP
    with `integral=True`) executed hour by hour through the cluster agents (`ReplayPlan`): how much of the bound's
    reduction a schedule that knew everything reaches once jobs must fit on nodes. Returns the optimum's carbon, the
    replay's metrics, the share of jobs that started at their planned hour and cluster, and the excess carbon of
    the displaced ones."""
    prob = optimum_problem(sc)
    glp = solve_lp(prob, time_limit_s=time_limit_s, integral=integral)
    n = prob.n_jobs
    best, k, s, c = glp.heaviest(n)
    T0 = abs_hours(sc.start)
    ids = sc.jobs["job_id"].astype(str).tolist()
    plan = {ids[j]: (int(k[j]), T0 + int(s[j]), int(c[j])) for j in range(n) if best[j] > 1e-9}
    res = simulate(sc, ReplayPlan(plan))
    rec = res.records
    start_h = rec["start_time"].astype("int64").to_numpy() // 3_600_000_000_000
    names = np.array(sc.fleet.names, dtype=object)
    on_plan = np.array(
        [
            i in plan
            and rec["started"].iat[j]
            and plan[i][1] == start_h[j]
            and names[plan[i][2]] == rec["cluster"].iat[j]
            for j, i in enumerate(ids)
        ]
    )
    opt_job = glp.job_carbon(n)
    excess = rec["kgco2e"].to_numpy() - opt_job
    return {
        "optimum_kgco2e": glp.objective_kg,
        "optimum": glp.summary(),
        "integral": integral,
        "fractional_jobs": int((best < 0.999).sum()),
        "replay": res.metrics,
        "on_plan_share": float(on_plan.mean()),
        "excess_kg_on_plan": float(excess[on_plan].sum()),
        "excess_kg_displaced": float(excess[~on_plan].sum()),
    }
