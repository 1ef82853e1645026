"""The planner's data types: `Plan` (the contract of docs/data-contracts.md, "Planning"), the priority weights and
the numeric `PlanningProblem` every placement policy works on."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# Contract columns of Plan.assignments, then the extras this planner adds (kept by the plan store).
ASSIGNMENT_COLUMNS = (
    "job_id", "cluster", "region", "node", "gpu_devices", "gpu_milli", "gpu_count", "start_time", "end_time",
    "power_limit_w", "expected_energy_kwh", "expected_kgco2e", "priority",
)
EXTRA_ASSIGNMENT_COLUMNS = (
    "zone", "gpu_model", "status", "submit_time", "deadline", "cpu_milli", "memory_mib", "workload_class",
    "checkpointing", "late",
)
UNPLACED_COLUMNS = ("job_id", "reason")
EXPLANATION_KEYS = (
    "job_id", "priority", "urgency", "flexibility", "opportunity", "weights", "chosen", "alternatives",
    "counterfactuals", "binding_constraints", "forecast_version", "power",
)
BINDING_CONSTRAINTS = ("capacity", "deadline", "gpu_model", "none")
# Assignment status: dispatched = starts at plan_time and is bound to a node/devices by the cluster agent;
# tentative = starts later (node is the agent's tentative choice at the start hour, re-planned every hour).
STATUSES = ("dispatched", "tentative")


def utc_hour(value) -> pd.Timestamp:
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts


def empty_assignments() -> pd.DataFrame:
    cols = {c: pd.Series(dtype=object) for c in ASSIGNMENT_COLUMNS + EXTRA_ASSIGNMENT_COLUMNS}
    for c in ("start_time", "end_time", "submit_time", "deadline"):
        cols[c] = pd.Series(dtype="datetime64[us, UTC]")
    for c in ("gpu_milli", "gpu_count", "cpu_milli", "memory_mib"):
        cols[c] = pd.Series(dtype="int64")
    for c in ("power_limit_w", "expected_energy_kwh", "expected_kgco2e", "priority"):
        cols[c] = pd.Series(dtype="float64")
    for c in ("checkpointing", "late"):
        cols[c] = pd.Series(dtype=bool)
    return pd.DataFrame(cols)


def empty_unplaced() -> pd.DataFrame:
    return pd.DataFrame({"job_id": pd.Series(dtype=object), "reason": pd.Series(dtype=object)})


@dataclass
class Plan:
    """One hourly plan (contract): `plan_time` (UTC, from the DAG's data interval or `as_of`, never the wall
    clock), `policy`, `forecast_version`, `assignments` (DataFrame, ASSIGNMENT_COLUMNS + extras),
    `explanations` (one dict per assigned job, EXPLANATION_KEYS), `unplaced` (job_id, reason).

    `stats` (not in the contract) carries timings and counters (agent rejections, tentative packings)."""

    plan_time: pd.Timestamp
    policy: str
    forecast_version: str | None = None
    assignments: pd.DataFrame = field(default_factory=empty_assignments)
    explanations: list[dict] = field(default_factory=list)
    unplaced: pd.DataFrame = field(default_factory=empty_unplaced)
    stats: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.plan_time = utc_hour(self.plan_time)
        if self.assignments is None:
            self.assignments = empty_assignments()
        if self.unplaced is None:
            self.unplaced = empty_unplaced()
        if self.explanations is None:
            self.explanations = []

    @property
    def n_jobs(self) -> int:
        return int(len(self.assignments) + len(self.unplaced))

    @property
    def n_assigned(self) -> int:
        return int(len(self.assignments))

    @property
    def expected_kgco2e(self) -> float:
        return float(self.assignments["expected_kgco2e"].sum()) if len(self.assignments) else 0.0

    def dispatched(self) -> pd.DataFrame:
        """Assignments that start at plan_time (bound to nodes now)."""
        a = self.assignments
        return a[a["status"] == "dispatched"] if "status" in a.columns else a[a["start_time"] == self.plan_time]

    def explanation(self, job_id: str) -> dict:
        for e in self.explanations:
            if e["job_id"] == job_id:
                return e
        raise KeyError(job_id)

    def summary(self) -> dict:
        a = self.assignments
        return {
            "plan_time": self.plan_time.isoformat(),
            "policy": self.policy,
            "forecast_version": self.forecast_version,
            "n_jobs": self.n_jobs,
            "n_assigned": self.n_assigned,
            "n_dispatched": int(len(self.dispatched())),
            "n_unplaced": int(len(self.unplaced)),
            "expected_kgco2e": round(self.expected_kgco2e, 4),
            "expected_energy_kwh": round(float(a["expected_energy_kwh"].sum()), 4) if len(a) else 0.0,
            "by_region": ({str(k): int(v) for k, v in a.groupby("region").size().items()} if len(a) else {}),
            "unplaced_reasons": ({str(k): int(v) for k, v in self.unplaced.groupby("reason").size().items()}
                                 if len(self.unplaced) else {}),
            "stats": _jsonable(self.stats),
        }

    def to_dict(self) -> dict:
        """JSON-ready dict of the whole plan (assignments as records)."""
        return {
            "plan_time": self.plan_time.isoformat(),
            "policy": self.policy,
            "forecast_version": self.forecast_version,
            "assignments": _jsonable(self.assignments.to_dict(orient="records")),
            "explanations": _jsonable(self.explanations),
            "unplaced": _jsonable(self.unplaced.to_dict(orient="records")),
            "stats": _jsonable(self.stats),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


@dataclass(frozen=True)
class Preemption:
    """When a policy may preempt running checkpointing jobs (the trace's `checkpointing` flag) to start a job that is
    due now, and what a preemption costs. A preempted job stops at the hour boundary, loses `overhead_h` hours of
    work (since its last checkpoint, plus the restart), and is pending again from the next hour with the rest of its
    work; it is evictable only while, resumed an hour later on its current cluster, it would still finish by its
    deadline with `slack_factor` x its remaining run time plus `slack_h` hours to spare, and at most `max_per_job`
    times. `restart_others`: jobs without checkpoints may be preempted too (Kubernetes' default: the pod is killed
    and starts again), losing all the work of the run, under the same slack rule for the whole job. `for_carbon`:
    an evictable job is also stopped when resuming it later (on capacity the plan leaves free) emits at least
    `min_saving` less than running on, overhead included (forecast)."""

    overhead_h: float = 0.25
    slack_factor: float = 1.1
    slack_h: float = 1.0
    max_per_job: int = 2
    restart_others: bool = False
    for_carbon: bool = False
    min_saving: float = 0.1


@dataclass(frozen=True)
class PriorityWeights:
    """P = urgency*U + flexibility*F + opportunity*O (defaults 0.35, 0.40, 0.25).

    U = (deadline - now) / duration, F = flexibility (fraction), O = (C_max - C_min) / C_max over the job's window.
    A high P means a job with slack, flexibility and a clean window ahead: it can wait for (or move to) low-carbon
    hours, whereas a low-P job has few candidates. `order="ascending"` (default) plans low P first, so the jobs
    with the fewest options take their capacity before the flexible ones fill the clean hours; "descending"
    applies the formula literally (high P first)."""

    urgency: float = 0.35
    flexibility: float = 0.40
    opportunity: float = 0.25
    order: str = "ascending"

    def __post_init__(self) -> None:
        if self.order not in ("ascending", "descending"):
            raise ValueError(f"order must be ascending or descending, not {self.order!r}")

    def as_dict(self) -> dict:
        return {"urgency": self.urgency, "flexibility": self.flexibility, "opportunity": self.opportunity,
                "order": self.order}


@dataclass
class PlanningProblem:
    """Everything numeric one plan needs; hour indices are relative to `now` (0 = the planning hour).

    Shapes: N jobs, K power options, H hours, C clusters.

    * `forecast` (H, C) gCO2e/kWh of each cluster's zone (the forecast known at `now`); `renewable` (H, C) or None.
    * `free` (H, C) int64 GPU-milli free per cluster and hour (capacity minus running/committed jobs);
      `free_other` (R, H, C) the same for CPU milli-cores and memory MiB, `req_other` (N, R) the requests
      (aggregate per cluster: node-level fit is the agents' job).
    * `release` (N,) earliest start hour (>= 0); `deadline_rel` (N,) deadline in hours from now (float).
    * `gpu_total` (N,) GPU-milli a job occupies (num_gpu x gpu_milli).
    * `dur` (N, K, C) run time in hours per power option and cluster (inf where the option does not exist);
      `kw` (N, K, C) the job's draw in kW incl. PUE; `limit_w` (K, C) the per-GPU power limit of an option.
    * `allowed` (N, C) the cluster can host the job (GPU model constraint and node shape).
    * `transfer_kwh` (N, C) network energy if the job runs on that cluster (0 in its home region); `home` (N,)
      home cluster index (-1: not in this fleet).
    """

    now: pd.Timestamp
    hours: int
    clusters: list[str]
    regions: list[str]
    zones: list[str]
    gpu_models: list[str]
    capacity: np.ndarray
    forecast: np.ndarray
    free: np.ndarray
    jobs: pd.DataFrame
    release: np.ndarray
    deadline_rel: np.ndarray
    gpu_total: np.ndarray
    dur: np.ndarray
    kw: np.ndarray
    limit_w: np.ndarray
    allowed: np.ndarray
    transfer_kwh: np.ndarray
    home: np.ndarray
    forecast_version: str = "unknown"
    renewable: np.ndarray | None = None
    free_other: np.ndarray | None = None  # (R, H, C) free CPU milli-cores and memory MiB (None: not tracked)
    req_other: np.ndarray | None = None  # (N, R) the jobs' CPU and memory requests
    capacity_price: np.ndarray | None = None  # (H, C) kgCO2e per GPU-milli-hour a job's window is charged
    expected: "PlanningProblem | None" = None  # jobs expected to arrive (rolling-lp plans their capacity only)
    release_c: np.ndarray | None = None  # (N, C) earliest start per cluster (None: `release` everywhere)
    postpone_margin_h: float = 0.0  # a start after now must leave this many hours before the latest start
    pods: list | None = None  # scheduling.packing.Pod per job (built lazily by the agents)
    # running checkpointing jobs that may be preempted now (job id -> what evicting it costs: GPU-milli x hours of
    # work left); None or empty: no preemption
    evictable: dict | None = None
    # `Preemption.for_carbon`: the evictable running jobs as a problem of their own (their work left after a
    # preemption, release 1: they would resume from the next hour), with `runs_on` (N, 3): the option, cluster and
    # hours left of each one's current run
    running: "PlanningProblem | None" = None
    runs_on: np.ndarray | None = None

    @property
    def n_jobs(self) -> int:
        return int(len(self.release))

    @property
    def n_options(self) -> int:
        return int(self.dur.shape[1])

    @property
    def n_clusters(self) -> int:
        return len(self.clusters)

    def ref_duration(self) -> np.ndarray:
        """(N,) the job's duration for the priority's urgency: on its home cluster at the default limit (the
        fastest allowed cluster when the home cluster is not in the fleet)."""
        d0 = np.where(self.allowed, self.dur[:, 0, :], np.inf)
        fastest = d0.min(axis=1)
        idx = np.arange(self.n_jobs)
        home = np.where(self.home >= 0, self.dur[idx, 0, np.maximum(self.home, 0)], fastest)
        return np.where(np.isfinite(home), home, fastest)
