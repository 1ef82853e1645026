"""The least carbon any hourly power-limit schedule could emit on a set of runs within a run-time budget: the
frontier that `bench-recap` sets its measured figures (and Chase's) against.

Each run keeps its start, its cluster and its work (`work_h`, hours at the maximum limit) and may run each hour at
any limit of its GPU's measured curve (`PowerTable.curve_options`), knowing the actual intensity. A linear program
over hour slots: x[r, h, l] = hours of run r in slot h at limit l,

    min  sum x[r,h,l] * kw[r,l] * ci[r,h]
    s.t. sum_l x[r,h,l] = slot length       for the slots before start + work_h (a run cannot end sooner)
         sum_l x[r,h,l] <= slot length      for the slots after (up to start + work_h * slowest time factor)
         sum_h,l x[r,h,l] / t[r,l] = work_h
         sum_r (time after start + work_h) <= budget * sum_r work_h   (or, `per_run`, each run's own)

Every real schedule (contiguous, one limit at a time, run time within the budget overall) is a solution, so the
optimum is a lower bound on its carbon: no hourly policy, however well informed, saves more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix


@dataclass(frozen=True)
class FrontierRun:
    """One run: its start (hours after the intensity series' origin), its work in hours at the maximum limit,
    its options' time factors and draws (kW, first = the maximum limit) and its zone's hourly intensity (g/kWh)."""

    start_h: float
    work_h: float
    time_factors: tuple[float, ...]
    draws_kw: tuple[float, ...]
    intensity: np.ndarray


def _slots(start: float, end: float) -> list[tuple[int, float, float]]:
    """(hour index, slot start, slot end) covering [start, end)."""
    out, a = [], start
    while a < end - 1e-9:
        h = int(np.floor(a + 1e-9))
        b = min(float(h + 1), end)
        out.append((h, a, b))
        a = b
    return out


def frontier_kg(runs: list[FrontierRun], runtime_budget: float, per_run: bool = False) -> float:
    """The least kgCO2e of `runs` with their total run time at most (1 + `runtime_budget`) x their total work
    (`per_run`: every run's at most (1 + `runtime_budget`) x its work)."""
    cost, tail_cols = [], []  # tail_cols: (run, column) of the hours after start + work_h
    bounds = {"eq": [], "ub": []}  # right-hand sides per constraint kind
    entries = {"eq": ([], [], []), "ub": ([], [], [])}  # (row, column, value) per kind
    n = 0  # variables so far

    def add_row(kind: str, bound: float) -> int:
        bounds[kind].append(bound)
        return len(bounds[kind]) - 1

    for r, run in enumerate(runs):
        t = np.asarray(run.time_factors, float)
        kw = np.asarray(run.draws_kw, float)
        ok = np.isfinite(t) & (kw > 0)
        t, kw = t[ok], kw[ok]
        head_end = run.start_h + run.work_h
        work_row = add_row("eq", run.work_h)
        head_slots = _slots(run.start_h, head_end)
        for i, (h, a, b) in enumerate(head_slots + _slots(head_end, run.start_h + run.work_h * float(t.max()))):
            head = i < len(head_slots)
            slot_row = add_row("eq" if head else "ub", b - a)
            ci = float(run.intensity[h]) if h < len(run.intensity) else float(run.intensity[-1])
            for k in range(len(t)):
                cost.append(kw[k] * ci / 1000.0)
                kind = "eq" if head else "ub"
                entries[kind][0].append(slot_row)
                entries[kind][1].append(n)
                entries[kind][2].append(1.0)
                entries["eq"][0].append(work_row)
                entries["eq"][1].append(n)
                entries["eq"][2].append(1.0 / t[k])
                if not head:
                    tail_cols.append((r, n))
                n += 1
    if per_run:
        budget_rows = [add_row("ub", runtime_budget * run.work_h) for run in runs]
    else:
        budget_rows = [add_row("ub", runtime_budget * sum(run.work_h for run in runs))] * len(runs)
    for r, col in tail_cols:
        entries["ub"][0].append(budget_rows[r])
        entries["ub"][1].append(col)
        entries["ub"][2].append(1.0)
    a_eq, a_ub = (coo_matrix((v, (r, c)), shape=(len(bounds[kind]), n)).tocsr() for kind, (r, c, v) in entries.items())
    res = linprog(
        np.asarray(cost), A_ub=a_ub, b_ub=bounds["ub"], A_eq=a_eq, b_eq=bounds["eq"], bounds=(0, None), method="highs"
    )
    if res.status != 0:
        raise RuntimeError(f"frontier LP: {res.message}")
    return float(res.fun)
