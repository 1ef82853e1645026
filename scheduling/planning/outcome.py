"""`PlanOutcome`: the per-job decisions of one plan (option, start, cluster, node, devices, status) and the
`Plan` frame built from them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduling.domain.plan import ASSIGNMENT_COLUMNS, EXTRA_ASSIGNMENT_COLUMNS, Plan, empty_assignments
from scheduling.planning.job_priority import PriorityParts
from scheduling.planning.problem import PlanningProblem

HOUR = pd.Timedelta(hours=1)


def empty_decisions(n: int) -> tuple:
    """The per-job decision arrays a plan fills in: option k, start hour s, cluster c, cost, late, placed, reason,
    node, gpus, status, rejections (-1 / NaN / False / None: not decided yet)."""
    return (
        np.full(n, -1, dtype=np.int64),
        np.full(n, -1, dtype=np.int64),
        np.full(n, -1, dtype=np.int64),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
        np.zeros(n, dtype=bool),
        [None] * n,
        [None] * n,
        [None] * n,
        [None] * n,
        np.zeros(n, dtype=np.int64),
    )


def _hosted(p: PlanningProblem, j: int) -> np.ndarray:
    """(K, C) the power options and clusters that host job j (GPU model, node shape; the option exists)."""
    return p.allowed[j][None, :] & np.isfinite(p.dur[j])


def unplaced_reason(p: PlanningProblem, j: int, rejections: int, *, now_only: bool) -> str:
    """Why job j of `p` got no start, for a caller that found no candidate with room (at hour 0 where `now_only`,
    else at any start hour of the horizon); each reason names what is true of the problem:

    * `no_hostable_cluster`: no cluster hosts the job (GPU model, node shape) at any power option;
    * `rejected_by_agents`: a cluster had room in its GPU-milli view, but no node took the job;
    * `released_later` (`now_only`) / `release_after_horizon`: the job may not start before a later hour / before
      the horizon's end (a run may end after the horizon, but it starts within it);
    * else `no_capacity_now` / `no_capacity_in_horizon`: it could start, but no hosting cluster has the free GPUs
      (CPU, memory) for its run from now / from any start hour."""
    host = _hosted(p, j)
    if not host.any():
        return "no_hostable_cluster"
    if rejections:
        return "rejected_by_agents"
    release = np.full(p.n_clusters, int(p.release[j]))
    if p.release_c is not None:
        release = np.maximum(release, p.release_c[j])
    first = int(release[host.any(axis=0)].min())
    if now_only:
        return "released_later" if first > 0 else "no_capacity_now"
    return "release_after_horizon" if first >= p.hours else "no_capacity_in_horizon"


def lp_unplaced_reason(p: PlanningProblem, j: int, latest_start: int) -> str:
    """Why the LP leaves job j without a start (its weight on running late), given its latest timely start
    (`Evaluator.latest_start`): `no_hostable_cluster`; `no_capacity_in_horizon` where its deadline allows a start
    after the horizon (the LP found no room inside it, and nothing says the job will be late); else `lp_late`."""
    if not _hosted(p, j).any():
        return "no_hostable_cluster"
    return "no_capacity_in_horizon" if latest_start >= p.hours else "lp_late"


def run_now_cluster(p: PlanningProblem, jobs: np.ndarray) -> np.ndarray:
    """The cluster each job would run on if started now at the default power limit (the run-now counterfactual):
    its home cluster when that can host it, else the fastest cluster that can."""
    d0 = np.where(p.allowed[jobs], p.dur[jobs, 0, :], np.inf)
    home = p.home[jobs]
    home_ok = (home >= 0) & np.isfinite(d0[np.arange(len(jobs)), np.maximum(home, 0)])
    return np.where(home_ok, home, np.argmin(d0, axis=1))


@dataclass
class PlanOutcome:
    """What one plan decided, as arrays over the problem's jobs (index j), plus explanations."""

    problem: PlanningProblem
    policy: str
    order: np.ndarray
    k: np.ndarray
    s: np.ndarray
    c: np.ndarray
    cost: np.ndarray
    late: np.ndarray
    placed: np.ndarray
    reason: list
    node: list
    gpus: list
    status: list
    rejections: np.ndarray
    priority: PriorityParts
    explanations: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    # running jobs this plan preempts for a job due now (`problem.evictable`): [(job id, cluster index, the job id
    # it made room for)]
    evicted: list = field(default_factory=list)
    # hours each job's run takes until it stops after its chunk (`scheduling.planning.chunks`): its checkpoint
    # written; NaN (or None for all): the run goes on to the job's end
    chunk_run_h: np.ndarray | None = None

    def energy_kwh(self) -> np.ndarray:
        p = self.problem
        j = np.arange(p.n_jobs)
        kk, cc = np.maximum(self.k, 0), np.maximum(self.c, 0)
        e = p.kw[j, kk, cc] * p.dur[j, kk, cc] + p.transfer_kwh[j, cc]
        return np.where(self.placed, e, 0.0)

    def _chunk_run_h(self) -> np.ndarray:
        n = self.problem.n_jobs
        return np.full(n, np.nan) if self.chunk_run_h is None else np.asarray(self.chunk_run_h, dtype=float)

    def to_plan(self) -> Plan:
        p = self.problem
        jobs = p.jobs
        sel = np.flatnonzero(self.placed)
        if len(sel):
            kk, ss, cc = self.k[sel], self.s[sel], self.c[sel]
            dur = p.dur[sel, kk, cc]
            start = p.now + pd.to_timedelta(ss, unit="h")
            home = run_now_cluster(p, sel)
            a = pd.DataFrame(
                {
                    "job_id": jobs["job_id"].to_numpy()[sel],
                    "cluster": np.array(p.clusters, dtype=object)[cc],
                    "region": np.array(p.regions, dtype=object)[cc],
                    "node": [self.node[i] for i in sel],
                    "gpu_devices": [
                        ",".join(str(g) for g in self.gpus[i]) if self.gpus[i] is not None else None for i in sel
                    ],
                    "gpu_milli": jobs["gpu_milli"].to_numpy(np.int64)[sel],
                    "gpu_count": jobs["num_gpu"].to_numpy(np.int64)[sel],
                    "start_time": start,
                    "end_time": start + pd.to_timedelta(dur, unit="h"),
                    "power_limit_w": p.limit_w[kk, cc],
                    "expected_energy_kwh": p.kw[sel, kk, cc] * dur + p.transfer_kwh[sel, cc],
                    "expected_kgco2e": self.cost[sel],
                    "priority": self.priority.priority[sel],
                    "zone": np.array(p.zones, dtype=object)[cc],
                    "gpu_model": np.array(p.gpu_models, dtype=object)[cc],
                    "status": [self.status[i] for i in sel],
                    "submit_time": pd.to_datetime(jobs["submit_time"].to_numpy()[sel], utc=True),
                    "deadline": pd.to_datetime(jobs["deadline"].to_numpy()[sel], utc=True),
                    "cpu_milli": jobs["cpu_milli"].to_numpy(np.int64)[sel],
                    "memory_mib": jobs["memory_mib"].to_numpy(np.int64)[sel],
                    "workload_class": jobs["workload_class"].to_numpy()[sel],
                    "checkpointing": jobs["checkpointing"].to_numpy(bool)[sel],
                    "late": self.late[sel],
                    "draw_kw": p.kw[sel, kk, cc],
                    "transfer_kwh": p.transfer_kwh[sel, cc],
                    "home_cluster": np.array(p.clusters, dtype=object)[home],
                    "home_zone": np.array(p.zones, dtype=object)[home],
                    "run_now_kw": p.kw[sel, 0, home],
                    "run_now_duration_h": (p.dur[:, 0] if p.run_now_dur is None else p.run_now_dur)[sel, home],
                    "speed": p.speed[sel, cc] if p.speed is not None else np.full(len(sel), np.nan),
                    "chunk_end": start + pd.to_timedelta(self._chunk_run_h()[sel], unit="h"),
                }
            )
            a = a[list(ASSIGNMENT_COLUMNS + EXTRA_ASSIGNMENT_COLUMNS)]
        else:
            a = empty_assignments()
        un = np.flatnonzero(~self.placed)
        unplaced = pd.DataFrame(
            {"job_id": jobs["job_id"].to_numpy()[un].astype(object), "reason": [self.reason[i] for i in un]}
        )
        return Plan(
            plan_time=p.now,
            policy=self.policy,
            forecast_version=p.forecast_version,
            assignments=a,
            explanations=self.explanations,
            unplaced=unplaced,
            stats=dict(self.stats),
        )
