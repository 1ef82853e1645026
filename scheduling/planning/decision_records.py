"""The explanation record of each decision (docs/data-contracts.md, "Planning"): priority and its parts, the top
five alternatives with their carbon, the counterfactuals, the binding constraints, the forecast and power limit."""

from __future__ import annotations

import numpy as np

from scheduling.planning.candidates import CandidateBatch, CandidateView, Evaluator, last_start
from scheduling.planning.job_priority import PriorityParts
from scheduling.planning.problem import PlanningProblem


def explain_choice(
    p: PlanningProblem,
    policy_name: str,
    j: int,
    v: CandidateView,
    score: np.ndarray,
    kk: int,
    ss: int,
    cc: int,
    is_late: bool,
    rejected: np.ndarray,
    prio: PriorityParts,
    ev: Evaluator,
    optimum_kg: float | None = None,
) -> dict:
    """The explanation of one decision: `explain_batch` of a batch of one."""
    b, sc = CandidateBatch.stack([v], [score])
    return explain_batch(
        p,
        policy_name,
        b,
        sc,
        np.array([kk]),
        np.array([ss]),
        np.array([cc]),
        np.array([is_late]),
        np.asarray(rejected)[None],
        prio,
        ev,
        None if optimum_kg is None else np.array([optimum_kg]),
    )[0]


def explain_batch(
    p: PlanningProblem,
    policy_name: str,
    b: CandidateBatch,
    score: np.ndarray,
    kk: np.ndarray,
    ss: np.ndarray,
    cc: np.ndarray,
    is_late: np.ndarray,
    rejected: np.ndarray,
    prio: PriorityParts,
    ev: Evaluator,
    optimum_kg: np.ndarray | None = None,
) -> list[dict]:
    """The explanations (EXPLANATION_KEYS) of the decisions on the jobs of batch `b` (job i at option kk[i], start
    ss[i], cluster cc[i]; `score` (B, K, n, C) the policy's own score, `rejected` (B, C) the clusters whose agent
    refused it): priority and its parts, the top five alternatives by forecast carbon (ties by start hour, then
    cluster), counterfactuals (run now at home, greedy-carbon, and `optimum_kg` where the policy has the LP's
    value), binding constraints judged on the policy's own score, forecast version, power limit. Each job sees only
    its own start hours [0, b.ns[i]). The arithmetic runs over the batch at once; only the records are built per
    job."""
    H, C = p.hours, p.n_clusters
    J = b.J
    B = len(J)
    rows = np.arange(B)
    valid = b.s < np.asarray(b.ns)[:, None, None, None]  # (B, 1, n, 1): the job's own start hours
    feasible = b.base_ok & b.cap_ok & b.timely & valid
    fc = np.where(feasible, b.cost, np.inf)
    chosen_cost = b.cost[rows, kk, ss, cc]
    best_default = fc[:, 0].min(axis=(1, 2))
    per_sc = fc.min(axis=1)  # (B, n, C) best option per (start, cluster)
    per_sc[rows, ss, cc] = np.inf
    flat = per_sc.reshape(B, -1)
    # the five cheapest per job: every cell up to the fifth-smallest value (ties included), by value then index
    L = flat.shape[1]
    fifth = np.partition(flat, 4, axis=1)[:, 4] if L > 5 else np.full(B, np.inf)
    r_idx, c_idx = np.nonzero((flat <= fifth[:, None]) & np.isfinite(flat))
    vals = flat[r_idx, c_idx]
    o = np.lexsort((c_idx, vals, r_idx))
    r_idx, c_idx, vals = r_idx[o], c_idx[o], vals[o]
    first = np.searchsorted(r_idx, rows)
    last = np.minimum(np.searchsorted(r_idx, rows, side="right"), first + 5)
    # counterfactuals at the default power limit, capacity ignored: run at release at home; greedy-carbon
    r = np.clip(p.release[J], 0, H - 1).astype(np.int64)
    ok0 = b.base_ok[rows, 0, r]  # (B, C)
    has_ok = ok0.any(axis=1)
    home = p.home[J].astype(np.int64)
    home_ok = (home >= 0) & ok0[rows, np.maximum(home, 0)]
    fastest = np.argmin(np.where(ok0, p.dur[J, 0], np.inf), axis=1)
    home = np.where(home_ok, home, np.where(has_ok, fastest, -1))
    run_now = b.cost[rows, 0, r, np.maximum(home, 0)]
    greedy_c = b.cost[rows, 0, r, np.argmin(np.where(ok0, p.forecast[r], np.inf), axis=1)]
    # binding constraints, judged on the policy's own score
    chosen_score = score[rows, kk, ss, cc]
    tol = 1e-9 + 1e-9 * np.abs(chosen_score)

    def cheaper(mask):
        return np.where(mask & valid, score, np.inf).min(axis=(1, 2, 3)) < chosen_score - tol

    capacity = rejected.any(axis=1) | cheaper(b.base_ok & b.timely & ~b.cap_ok)
    deadline = np.asarray(is_late, dtype=bool) | cheaper(b.base_ok & b.cap_ok & ~b.timely)
    host_no = ~p.allowed[J]  # (B, C)
    gpu_model = np.zeros(B, dtype=bool)
    if host_no.any():
        fin = np.isfinite(p.dur[J]) & host_no[:, None, :]  # (B, K, C)
        m = (
            (b.s <= last_start(b.occ, H)[:, :, None, :])
            & (b.s >= p.release[J][:, None, None, None])
            & fin[:, :, None, :]
            & b.cap_ok
            & b.timely
        )
        gpu_model = host_no.any(axis=1) & cheaper(m)
    weights = prio.weights.as_dict()
    out = []
    for i in range(B):
        j, k_i, s_i, c_i = int(J[i]), int(kk[i]), int(ss[i]), int(cc[i])
        alts = []
        for t in range(first[i], last[i]):
            hs, hc = divmod(int(c_idx[t]), C)
            alts.append(
                {
                    "region": p.regions[hc],
                    "cluster": p.clusters[hc],
                    "start_time": ev.iso(hs),
                    "kgco2e": round(float(vals[t]), 6),
                }
            )
        binding = [
            name
            for name, on in (("capacity", capacity[i]), ("deadline", deadline[i]), ("gpu_model", gpu_model[i]))
            if on
        ] or ["none"]
        saving = best_default[i] - chosen_cost[i] if np.isfinite(best_default[i]) else None
        out.append(
            {
                "job_id": ev.job_ids[j],
                "priority": float(prio.priority[j]),
                "urgency": float(prio.urgency[j]),
                "flexibility": float(prio.flexibility[j]),
                "opportunity": float(prio.opportunity[j]),
                "weights": dict(weights),
                "chosen": {
                    "region": p.regions[c_i],
                    "cluster": p.clusters[c_i],
                    "zone": p.zones[c_i],
                    "start_time": ev.iso(s_i),
                    "kgco2e": round(float(chosen_cost[i]), 6),
                    "late": bool(is_late[i]),
                },
                "alternatives": alts,
                "counterfactuals": {
                    "run_now_kgco2e": round(float(run_now[i]), 6) if home[i] >= 0 else None,
                    "greedy_carbon_kgco2e": round(float(greedy_c[i]), 6) if has_ok[i] else None,
                    "optimum_kgco2e": None if optimum_kg is None else round(float(optimum_kg[i]), 6),
                },
                "binding_constraints": binding,
                "forecast_version": p.forecast_version,
                "power": {
                    "limit_w": float(p.limit_w[k_i, c_i]),
                    "saving_kgco2e": None if saving is None else round(max(float(saving), 0.0), 6),
                },
                "policy": policy_name,
                "agent_rejections": [p.clusters[x] for x in np.flatnonzero(rejected[i])],
            }
        )
    return out
