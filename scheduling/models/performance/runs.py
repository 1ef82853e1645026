"""Finished runs -> observations for the predictor's refiner (network 2), and what a plan records of them.

A run of job type j on a cluster of GPU model m was planned to take P hours (its assignment's end - start) at the
speed s the plan assumed (the assignment's `speed`, relative to a V100 at the default power limit) and took A hours
(the executor's started -> finished). P and A are both at the chosen power limit, so its slowdown cancels and the
realized speed is s x P / A. As an observation of the predictor's isolated throughput:

* gpu_type = m's Gavel type (k80 | p100 | v100); a model known only by its `relative_speed` r counts as a V100 with
  r divided out;
* steps_per_s = realized speed [/ r] x T0(j), with T0(j) the registered version's own isolated V100 throughput of j
  (before any runtime observation), the throughput the reference run time `duration_h_ref` stands for.

Only the newest `per_key` runs of each (job type, GPU type) are kept, so the refiner's Gaussian process stays small
and follows recent behaviour. Each run is one observation. The runs are isolated observations: a run that shared
its GPU is compared with the isolated estimate the plan used.

Pure functions of their inputs (no warehouse, no torch import): the plan service reads the runs
(`scheduling.executors.runs`) and turns the observations into speeds
(`scheduling.models.registered.predictor_speed_table`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

FEEDBACK_RUNS_PER_KEY = 50
GPU_TYPES = ("k80", "p100", "v100")
RUN_COLUMNS = ("job_id", "job_type", "gpu_model", "speed", "planned_h", "actual_h", "finished_at")
OBSERVATION_COLUMNS = (
    "job_id",
    "job_type",
    "gpu_type",
    "partner_job_type",
    "steps_per_s",
    "realized_speed",
    "finished_at",
)


def reference_throughput(predictor, job_types: Iterable[str]) -> dict[str, float]:
    """T0: job type -> the predictor's isolated V100 steps/s (as registered: call it before `observe`)."""
    types = sorted({str(t) for t in job_types})
    if not types:
        return {}
    values = predictor.isolated(pd.DataFrame({"job_type": types}), "v100")
    return {t: float(v) for t, v in zip(types, values)}


def run_observations(
    runs: pd.DataFrame,
    t0: Mapping[str, float],
    gpu_models: Mapping[str, object],
    per_key: int = FEEDBACK_RUNS_PER_KEY,
) -> pd.DataFrame:
    """Observations (OBSERVATION_COLUMNS; `PerformancePredictor.observe` reads job_type, gpu_type,
    partner_job_type, steps_per_s) of finished `runs` (RUN_COLUMNS), oldest first. `gpu_models`: fleet GPU model
    name -> an object with `gavel` and `relative_speed`. Runs that cannot be converted are left out: an unknown GPU
    model or job type (no T0), a missing or non-positive speed, planned or actual run time."""
    frame = pd.DataFrame(runs).copy()
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in OBSERVATION_COLUMNS})
    for col in ("speed", "planned_h", "actual_h"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame["job_type"] = frame["job_type"].astype(str)
    models = {str(name): model for name, model in gpu_models.items()}
    gavel = frame["gpu_model"].map(lambda m: getattr(models.get(str(m)), "gavel", None))
    relative = frame["gpu_model"].map(lambda m: getattr(models.get(str(m)), "relative_speed", None))
    known = frame["gpu_model"].astype(str).isin(models.keys())
    gpu_type = gavel.where(gavel.notna(), "v100").astype(str).str.lower()
    scale = pd.to_numeric(relative.where(gavel.isna(), 1.0), errors="coerce")
    ref = pd.to_numeric(frame["job_type"].map(lambda j: t0.get(j, np.nan)), errors="coerce")
    realized = frame["speed"] * frame["planned_h"] / frame["actual_h"]
    steps = realized / scale * ref
    ok = (
        known
        & gpu_type.isin(GPU_TYPES)
        & (frame["speed"] > 0)
        & (frame["planned_h"] > 0)
        & (frame["actual_h"] > 0)
        & (scale > 0)
        & (ref > 0)
        & np.isfinite(steps)
    )
    out = pd.DataFrame(
        {
            "job_id": frame["job_id"].astype(str),
            "job_type": frame["job_type"],
            "gpu_type": gpu_type,
            "partner_job_type": None,
            "steps_per_s": steps.astype(float),
            "realized_speed": realized.astype(float),
            "finished_at": pd.to_datetime(frame["finished_at"], utc=True),
        }
    )[ok.to_numpy()]
    out = out.sort_values(["finished_at", "job_id"], ascending=False, kind="mergesort")
    out = out.groupby(["job_type", "gpu_type"], sort=False).head(max(int(per_key), 0))
    out = out.sort_values(["finished_at", "job_id"], kind="mergesort").reset_index(drop=True)
    out["partner_job_type"] = out["partner_job_type"].astype(object)
    return out[list(OBSERVATION_COLUMNS)]


def feedback_summary(observations: pd.DataFrame) -> dict:
    """What a plan records of the refiner state it used: runs observed, job types, the newest finish."""
    if observations is None or not len(observations):
        return {"runs": 0, "job_types": 0, "latest_finished_at": None}
    latest = pd.to_datetime(observations["finished_at"], utc=True).max()
    return {
        "runs": int(len(observations)),
        "job_types": int(observations["job_type"].nunique()),
        "latest_finished_at": latest.strftime("%Y-%m-%dT%H:%M:%SZ") if pd.notna(latest) else None,
    }
