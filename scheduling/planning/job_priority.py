"""The priority of each job, P = w_U U + w_F F + w_O O: urgency U = (deadline - now) / duration, flexibility F,
opportunity O = (C_max - C_min) / C_max of the forecast over the job's window. Low P = few good candidates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduling.planning.problem import PlanningProblem, PriorityWeights

EPS = 1e-9


def range_extrema(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each query i, the max and min of values[lo[i]:hi[i]+1, :] per column (sparse tables, O(H log H C)
    to build, O(N C) to answer). values (H, C); lo, hi (N,) inclusive, lo <= hi."""
    H = values.shape[0]
    mx, mn = [values], [values]
    span = 1
    while 2 * span <= H:
        a, b = mx[-1], mn[-1]
        mx.append(np.maximum(a[:-span], a[span:]))
        mn.append(np.minimum(b[:-span], b[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    out_max = np.empty((len(lo), values.shape[1]))
    out_min = np.empty_like(out_max)
    for lv in np.unique(level):
        sel = level == lv
        w = 1 << int(lv)
        a, b = lo[sel], hi[sel] - w + 1
        out_max[sel] = np.maximum(mx[lv][a], mx[lv][b])
        out_min[sel] = np.minimum(mn[lv][a], mn[lv][b])
    return out_max, out_min


@dataclass
class PriorityParts:
    urgency: np.ndarray
    flexibility: np.ndarray
    opportunity: np.ndarray
    priority: np.ndarray
    weights: PriorityWeights


def priority_parts(problem: PlanningProblem, weights: PriorityWeights) -> PriorityParts:
    """U = (deadline - now) / duration, F = flexibility, O = (C_max - C_min) / C_max of the forecast over the
    job's window [release, deadline] and the clusters that can host it; P = w_U U + w_F F + w_O O."""
    N, H = problem.n_jobs, problem.hours
    if N == 0:
        z = np.zeros(0)
        return PriorityParts(z, z, z, z, weights)
    d_ref = problem.ref_duration()
    U = problem.deadline_rel / np.maximum(d_ref, EPS)
    Fx = problem.jobs["flexibility"].to_numpy(float)
    lo = np.clip(problem.release, 0, H - 1)
    hi = np.clip(np.ceil(problem.deadline_rel).astype(np.int64) - 1, 0, H - 1)
    hi = np.maximum(hi, lo)
    cmax, cmin = range_extrema(problem.forecast, lo, hi)
    allowed = problem.allowed
    cmax = np.where(allowed, cmax, -np.inf).max(axis=1)
    cmin = np.where(allowed, cmin, np.inf).min(axis=1)
    O = np.where(np.isfinite(cmax) & (cmax > 0), (cmax - cmin) / np.maximum(cmax, EPS), 0.0)
    P = weights.urgency * U + weights.flexibility * Fx + weights.opportunity * O
    return PriorityParts(U, Fx, O, P, weights)
