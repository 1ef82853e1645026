"""What the planner needs of a queued job and the operator may leave out: its job type as the speed tables know
it, the clusters that can host it, its home cluster, its run time and its deadline. One set of rules, used by
the intake's fleet checks (a deadline shorter than the fastest run is refused) and by the planner's job frame.

* **Planner job type.** The submitted `job_type` when the profiles know it (Gavel's job types,
  `scheduling.domain.jobs.GAVEL_JOB_TYPES`, the ones the predictor is trained on); otherwise the class profile
  `CLASS_PROFILE_JOB_TYPE[workload_class]` (a mid-size job type of the class) and the flag `unknown_job_type`.
* **Hostable clusters.** `scheduling.domain.jobs.hostable`: GPU model in `gpu_models`, a node shape that holds the
  GPUs, CPU and memory, region in `allowed_regions`.
* **Home cluster.** The first hostable cluster (fleet order) in `home_region`; when the home region has none, its
  first cluster (whose grid prices the data transfer), and the fastest hostable cluster stands in as the reference
  for `est_duration_h` (the job then always moves its `input_gb`).
* **Run time.** `duration_h_ref` is the run time on a V100 at full power (the planner's reference). With
  `est_duration_h` (the run time on the home cluster at full power): est x speed(planner job type, home GPU). Without:
  the median of Gavel's Philly job durations (`philly_job_distribution.csv`, the distribution the trace generator
  samples) for the job's GPU-count bucket (1, 2, 4, 8: the smallest >= gpus; shares use 1), clipped to [1, 48] h,
  and the flag `estimated_duration`. Speeds: `SpeedModel` (Gavel's isolated throughputs, or the registered
  predictor's table where the caller passes one). `duration_h_home` = duration_h_ref / speed on the home cluster;
  `fastest_h` = the least over the hostable clusters.
* **Deadline and flexibility.** A given `deadline` is kept and `flexibility` = max(0, (deadline - submitted_at) /
  duration_h_home - 1). A given `flexibility` sets deadline = submitted_at + duration_h_home x (1 + flexibility), the
  trace generator's rule. Neither: the class default flexibility (the middle of the class's range in
  `scheduling.domain.jobs.WORKLOAD_CLASSES`: language 0.30, vision 0.40, rl 0.50, recommendation 0.35) and the flag
  `default_deadline`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from scheduling.domain.jobs import (
    FAMILY_CLASS,
    GAVEL_JOB_TYPES,
    PHILLY_BUCKETS,
    WORKLOAD_CLASSES,
    SpeedModel,
    hostable,
    job_family,
    philly_bucket,
    read_philly,
)
from scheduling.packing.pods import MILLI
from scheduling.queue.spec import JobSpec

KNOWN_JOB_TYPES = frozenset(GAVEL_JOB_TYPES)
CLASS_PROFILE_JOB_TYPE = {
    "language": "Transformer (batch size 64)",
    "vision": "ResNet-50 (batch size 64)",
    "rl": "A3C",
    "recommendation": "Recommendation (batch size 2048)",
}
DEFAULT_FLEXIBILITY = {k: round((lo + hi) / 2, 4) for k, (lo, hi) in WORKLOAD_CLASSES.items()}
PROFILE_MIN_H, PROFILE_MAX_H = 1.0, 48.0


def known_class(job_type: str) -> str | None:
    """The workload class of a job type the profiles know, else None."""
    return FAMILY_CLASS.get(job_family(job_type)) if job_type in KNOWN_JOB_TYPES else None


def workload_class_of(spec: JobSpec) -> str | None:
    """The job's class: as given, else that of its known job type (None for an unknown type without one)."""
    return spec.workload_class or known_class(spec.job_type)


def planner_job_type(job_type: str, workload_class: str | None) -> str:
    if job_type in KNOWN_JOB_TYPES or workload_class not in CLASS_PROFILE_JOB_TYPE:
        return job_type
    return CLASS_PROFILE_JOB_TYPE[workload_class]


class DurationProfile:
    """Median run time (hours, on a V100) per GPU-count bucket of Gavel's Philly job distribution."""

    def __init__(self, data_dir=None):
        philly = read_philly(data_dir)
        self.median_h = {
            int(b): float(
                np.clip(
                    philly.loc[philly["num_gpus"] == b, "duration_s"].median() / 3600.0, PROFILE_MIN_H, PROFILE_MAX_H
                )
            )
            for b in PHILLY_BUCKETS
        }

    def duration_h_ref(self, gpus: np.ndarray, gpu_milli: np.ndarray) -> np.ndarray:
        bucket = philly_bucket(np.where(np.asarray(gpu_milli) < MILLI, 1, np.asarray(gpus)))
        return np.array([self.median_h[int(b)] for b in bucket], dtype=float)


def spec_frame(specs: Sequence[JobSpec]) -> pd.DataFrame:
    """The columns `hostable` and `SpeedModel` read, one row per spec (planner job type already resolved)."""
    return pd.DataFrame(
        {
            "job_id": [s.planner_id for s in specs],
            "num_gpu": np.array([s.gpus for s in specs], dtype=np.int64),
            "gpu_milli": np.array([s.gpu_milli for s in specs], dtype=np.int64),
            "cpu_milli": np.array([s.cpu_milli for s in specs], dtype=np.int64),
            "memory_mib": np.array([s.memory_mib for s in specs], dtype=np.int64),
            "gpu_spec": ["|".join(s.gpu_models) for s in specs],
            "allowed_regions": ["|".join(s.allowed_regions) for s in specs],
            "job_type": [planner_job_type(s.job_type, workload_class_of(s)) for s in specs],
        }
    )


def derive(
    specs: Sequence[JobSpec],
    fleet,
    speed_model: SpeedModel | None = None,
    profile: DurationProfile | None = None,
    data_dir=None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """(frame, host) for `specs` on `fleet` (see the module doc). `host` is the (N, C) hostable matrix; the frame
    has one row per spec: planner_job_type, unknown_job_type, hostable_any, home_cluster (None without a hostable
    cluster), duration_h_ref, duration_h_home, estimated_duration, fastest_h, fastest_cluster, deadline,
    flexibility, default_deadline. A job no cluster can host gets its run times against the fleet's first cluster
    (finite, so the planner can report it unplaced) and NaN `fastest_h`."""
    n = len(specs)
    base = spec_frame(specs)
    host = hostable(base, fleet) if n else np.zeros((0, len(fleet)), dtype=bool)
    speed_model = speed_model or SpeedModel(data_dir)
    speed = speed_model.matrix(base["job_type"], fleet) if n else np.zeros((0, len(fleet)))
    speed = np.maximum(speed, 1e-6)
    regions = np.array(fleet.cluster_regions, dtype=object)
    names = np.array(fleet.names, dtype=object)
    home = home_indices([s.home_region for s in specs], host, regions)
    inv = np.where(host, 1.0 / speed, np.inf)  # hours per reference hour on each cluster; inf where not hostable
    fastest = np.argmin(inv, axis=1) if n else np.zeros(0, dtype=np.int64)
    hostable_any = host.any(axis=1)
    ref_idx = np.where(home >= 0, home, fastest)
    speed_ref = speed[np.arange(n), ref_idx] if n else np.zeros(0)
    est = np.array([np.nan if s.est_duration_h is None else s.est_duration_h for s in specs], dtype=float)
    profile_h = None
    if np.isnan(est).any():
        profile = profile or DurationProfile(data_dir)
        profile_h = profile.duration_h_ref(base["num_gpu"].to_numpy(), base["gpu_milli"].to_numpy())
    d_ref = np.where(np.isnan(est), profile_h if profile_h is not None else np.nan, est * speed_ref)
    d_home = d_ref / speed_ref if n else np.zeros(0)
    fastest_h = d_ref * inv[np.arange(n), fastest] if n else np.zeros(0)
    fastest_h = np.where(hostable_any, fastest_h, np.nan)

    deadlines, flex, default_deadline = [], [], []
    for i, s in enumerate(specs):
        submitted = pd.Timestamp(s.submitted_at)
        dh = d_home[i]
        if s.deadline is not None:
            deadline = pd.Timestamp(s.deadline)
            window_h = (deadline - submitted).total_seconds() / 3600.0
            f = max(0.0, window_h / dh - 1.0) if np.isfinite(dh) and dh > 0 else np.nan
            default_deadline.append(False)
        else:
            default = DEFAULT_FLEXIBILITY.get(workload_class_of(s) or "", np.nan)
            f = s.flexibility if s.flexibility is not None else default
            default_deadline.append(s.flexibility is None)
            deadline = submitted + pd.Timedelta(hours=float(dh * (1.0 + f))) if np.isfinite(dh * f) else pd.NaT
        deadlines.append(deadline)
        flex.append(f)
    frame = pd.DataFrame(
        {
            "planner_job_type": base["job_type"].to_numpy(object),
            "unknown_job_type": [s.job_type not in KNOWN_JOB_TYPES for s in specs],
            "hostable_any": hostable_any,
            "home_cluster": [_home_cluster(s.home_region, h, names, regions) for s, h in zip(specs, home)],
            "duration_h_ref": d_ref,
            "duration_h_home": d_home,
            "estimated_duration": np.isnan(est),
            "fastest_h": fastest_h,
            "fastest_cluster": [names[f] if ok else None for f, ok in zip(fastest, hostable_any)],
            "deadline": pd.to_datetime(pd.Series(deadlines, dtype=object), utc=True),
            "flexibility": np.array(flex, dtype=float),
            "default_deadline": np.array(default_deadline, dtype=bool),
        }
    )
    return frame, host


def home_indices(home_regions: Sequence[str], host: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """Per job, the index of its home cluster: the first cluster (fleet order) of its home region that can host it;
    -1 where none can. What "home" means for a job's run time estimate and its run-now counterfactual."""
    home = np.full(len(home_regions), -1, dtype=np.int64)
    for i, region in enumerate(home_regions):
        hits = np.flatnonzero(host[i] & (regions == region))
        if len(hits):
            home[i] = hits[0]
    return home


def _home_cluster(region: str, hostable_home: int, names: np.ndarray, regions: np.ndarray) -> str | None:
    """The job's home cluster: the first hostable cluster of its home region, else the region's first cluster
    (its grid prices the data transfer), else None (a region without clusters in this fleet)."""
    if hostable_home >= 0:
        return str(names[hostable_home])
    hits = np.flatnonzero(regions == region)
    return str(names[hits[0]]) if len(hits) else None
