"""`Plan`, the planner's output contract (docs/data-contracts.md, "Planning"): assignments, explanations and
unplaced jobs of one planning hour, with the column names the plan store and the schedule writers rely on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from common.timeutil import utc

# Contract columns of Plan.assignments, then the extras this planner adds (kept by the plan store).
ASSIGNMENT_COLUMNS = (
    "job_id",
    "cluster",
    "region",
    "node",
    "gpu_devices",
    "gpu_milli",
    "gpu_count",
    "start_time",
    "end_time",
    "power_limit_w",
    "expected_energy_kwh",
    "expected_kgco2e",
    "priority",
)
EXTRA_ASSIGNMENT_COLUMNS = (
    "zone",
    "gpu_model",
    "status",
    "submit_time",
    "deadline",
    "cpu_milli",
    "memory_mib",
    "workload_class",
    "checkpointing",
    # what the carbon ledger needs to value the run and its run-now counterfactual at the actual intensity:
    "draw_kw",  # the job's draw at the chosen option, PUE included
    "transfer_kwh",  # data moved when the job runs outside its home region
    "home_cluster",  # where running now would have put it: its home cluster (else the fastest that hosts it)
    "home_zone",
    "run_now_kw",  # draw at the default power limit on that cluster, PUE included
    "run_now_duration_h",  # estimated run time there at the default limit
    "late",
    # the speed the plan assumed on the chosen cluster, relative to a V100 at the default limit (duration_h_ref /
    # run time at the default limit): with the run's actual time, what runtime feedback learns from
    "speed",
    # when a long checkpointing job's run stops after its chunk, its checkpoint written (`planning.chunks`); NaT:
    # it runs to the job's end (`end_time`, the whole rest)
    "chunk_end",
)
UNPLACED_COLUMNS = ("job_id", "reason")
EXPLANATION_KEYS = (
    "job_id",
    "priority",
    "urgency",
    "flexibility",
    "opportunity",
    "weights",
    "chosen",
    "alternatives",
    "counterfactuals",
    "binding_constraints",
    "forecast_version",
    "power",
)
BINDING_CONSTRAINTS = ("capacity", "deadline", "gpu_model", "none")
# Assignment status: dispatched = starts at plan_time and is bound to a node/devices by the cluster agent;
# tentative = starts later (node is the agent's tentative choice at the start hour, re-planned every hour).
STATUSES = ("dispatched", "tentative")


def empty_assignments() -> pd.DataFrame:
    cols = {c: pd.Series(dtype=object) for c in ASSIGNMENT_COLUMNS + EXTRA_ASSIGNMENT_COLUMNS}
    for c in ("start_time", "end_time", "submit_time", "deadline", "chunk_end"):
        cols[c] = pd.Series(dtype="datetime64[us, UTC]")
    for c in ("gpu_milli", "gpu_count", "cpu_milli", "memory_mib"):
        cols[c] = pd.Series(dtype="int64")
    for c in ("power_limit_w", "expected_energy_kwh", "expected_kgco2e", "priority", "speed"):
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
        self.plan_time = utc(self.plan_time)
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
            "unplaced_reasons": (
                {str(k): int(v) for k, v in self.unplaced.groupby("reason").size().items()}
                if len(self.unplaced)
                else {}
            ),
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
    if value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value
