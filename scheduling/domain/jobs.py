"""Pending jobs from the traces: openb pods (resources, arrival pattern) + Philly durations + a Gavel job-type mix.

How a job is made (seeded, `generate_jobs(n, start, hours, fleet=..., seed=...)`):

* **Resources and arrival.** `n` GPU pods are drawn without replacement from an openb pod list (default
  `openb_pod_list_default.csv`; CPU-only pods are left out). CPU milli, memory, GPU count, per-GPU share (milli)
  and the GPU-model constraint (`gpu_spec`) come from the pod. Arrival times (`arrival=`):
  `"diurnal"` (default) keeps each pod's time of day from its creation time and spreads the days uniformly
  over the window (seeded), i.e. a stationary process with the trace's daily profile; `"trace"` maps the
  creation times (from their 1st percentile on) linearly onto the window, keeping the trace's multi-week ramp
  (its last week is about 1.5x as busy as its first, so a fleet sized for the mean is overloaded at the end);
  `"all-at-start"` submits every job at `start` (one-shot plans, benchmarks). A job's **submission time is the
  start of the hour in which it arrives**: the planner runs at each hour and sees everything that arrived during
  the previous hour (so running at submission meets the deadline, capacity permitting).
* **Class and job type.** Each job draws a job type uniformly from Gavel's 26 single-GPU job types (the
  Gavel generator's mix): ResNet-18/ResNet-50/CycleGAN -> vision (10/26), Transformer/LM -> language (10/26),
  Recommendation -> recommendation (5/26), A3C -> rl (1/26).
* **Duration.** A sample of Gavel's Philly job distribution (`philly_job_distribution.csv`, duration_s,
  num_gpus) conditioned on the GPU count (bucket 1, 2, 4, 8: the smallest bucket >= the pod's GPU count; shared
  pods use bucket 1), clipped to `max_duration_h` (default 48 h). It is read as the job's run time on a V100
  (`duration_h_ref`); the estimate on another GPU model divides it by the job type's speed on that model
  (`SpeedModel`: Gavel's isolated throughputs for K80/P100/V100, the fleet's `relative_speed` otherwise).
* **Deadline.** deadline = submission + d_home x (1 + flexibility), with d_home the estimated duration on the
  job's home cluster and flexibility drawn uniformly per class: language 20-40 %, vision 30-50 %, rl 40-60 %,
  recommendation 25-45 %.
* **Home region.** Drawn among the clusters that can host the job, in proportion to their GPUs (moving the job
  elsewhere costs a data transfer of `data_gb`, drawn per class).
* **Checkpointing.** A flag drawn per class (language 0.9, vision 0.8, recommendation 0.6, rl 0.5). The planner
  is non-preemptive: the flag is carried to the executors (schedule writers), not used to split jobs.

Durations are treated as exact in the simulator (estimate = actual run time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc_hour
from scheduling.packing.pods import MILLI, normalize_gpu_spec
from warehouse.config import data_dir as configured

WORKLOAD_CLASSES: dict[str, tuple[float, float]] = {
    "language": (0.20, 0.40),
    "vision": (0.30, 0.50),
    "rl": (0.40, 0.60),
    "recommendation": (0.25, 0.45),
}
FAMILY_CLASS = {
    "ResNet-18": "vision",
    "ResNet-50": "vision",
    "CycleGAN": "vision",
    "Transformer": "language",
    "LM": "language",
    "A3C": "rl",
    "Recommendation": "recommendation",
}
DATA_GB = {"vision": (50.0, 150.0), "language": (5.0, 50.0), "rl": (0.5, 2.0), "recommendation": (20.0, 100.0)}
CHECKPOINT_P = {"language": 0.9, "vision": 0.8, "recommendation": 0.6, "rl": 0.5}
PHILLY_BUCKETS = (1, 2, 4, 8)
GAVEL_JOB_TYPES = (
    "A3C",
    "CycleGAN",
    "LM (batch size 5)",
    "LM (batch size 10)",
    "LM (batch size 20)",
    "LM (batch size 40)",
    "LM (batch size 80)",
    "Recommendation (batch size 512)",
    "Recommendation (batch size 1024)",
    "Recommendation (batch size 2048)",
    "Recommendation (batch size 4096)",
    "Recommendation (batch size 8192)",
    "ResNet-18 (batch size 16)",
    "ResNet-18 (batch size 32)",
    "ResNet-18 (batch size 64)",
    "ResNet-18 (batch size 128)",
    "ResNet-18 (batch size 256)",
    "ResNet-50 (batch size 16)",
    "ResNet-50 (batch size 32)",
    "ResNet-50 (batch size 64)",
    "ResNet-50 (batch size 128)",
    "Transformer (batch size 16)",
    "Transformer (batch size 32)",
    "Transformer (batch size 64)",
    "Transformer (batch size 128)",
    "Transformer (batch size 256)",
)
JOB_COLUMNS = (
    "job_id",
    "source_pod",
    "submit_time",
    "deadline",
    "duration_h_ref",
    "duration_h_home",
    "num_gpu",
    "gpu_milli",
    "cpu_milli",
    "memory_mib",
    "gpu_spec",
    "qos",
    "workload_class",
    "job_type",
    "flexibility",
    "checkpointing",
    "home_region",
    "home_cluster",
    "data_gb",
)


def job_family(job_type: str) -> str:
    return str(job_type).split(" (")[0]


def job_class(job_type: str) -> str:
    return FAMILY_CLASS[job_family(job_type)]


def _data_dir(data_dir) -> Path:
    if data_dir is not None:
        return Path(data_dir)

    return configured()


# ---------------------------------------------------------------------------------------------------- speeds
class SpeedModel:
    """Throughput of a job type on a GPU model relative to a V100 at the default power limit (the reference of
    `duration_h_ref`).

    Models with a Gavel type (k80/p100/v100) use Gavel's isolated, consolidated, scale-1 throughputs of that job
    type (`gavel_sim_isolated_throughputs.csv`; the same numbers the predictor is trained on); other models use the
    fleet's `relative_speed`. Unknown job types get the median ratio of the GPU type.

    `table` (job_type x gpu_type) replaces the file: throughputs (only the ratios to its v100 column count), or, with
    `absolute=True`, speeds relative to the reference, whose v100 column is each job type's own V100 speed (1
    unless runtime feedback says otherwise); that factor then also scales the job type's other GPU types and the
    `relative_speed` models (`reference`; 1 for job types the table lacks)."""

    def __init__(self, data_dir=None, table: pd.DataFrame | None = None, absolute: bool = False):
        if table is None:
            path = _data_dir(data_dir) / "interference" / "gavel" / "gavel_sim_isolated_throughputs.csv"
            if path.exists():
                raw = pd.read_csv(path)
                raw = raw[(raw["consolidated"] == 1) & (raw["scale_factor"] == 1)]
                table = raw.pivot_table(index="job_type", columns="gpu_type", values="steps_per_sec")
            else:
                table = pd.DataFrame()
        self.ratio: dict[str, dict[str, float]] = {}
        self.median: dict[str, float] = {"v100": 1.0}
        self.reference: dict[str, float] = {}
        if not table.empty and "v100" in table.columns:
            for gpu in table.columns:
                r = (table[gpu] / table["v100"]).replace([np.inf, -np.inf], np.nan).dropna()
                r = r[r > 0]
                self.ratio[gpu] = r.to_dict()
                self.median[gpu] = float(r.median()) if len(r) else 1.0
            if absolute:
                v = table["v100"].replace([np.inf, -np.inf], np.nan).dropna()
                self.reference = v[v > 0].to_dict()
        self.source = "gavel-isolated-throughputs" if self.ratio else "relative_speed-only"

    def speed(self, job_type: str, model) -> float:
        factor = self.reference.get(job_type, 1.0)
        if model.gavel:
            gpu = str(model.gavel)
            if gpu == "v100":
                return float(factor)
            return float(self.ratio.get(gpu, {}).get(job_type, self.median.get(gpu, 1.0)) * factor)
        return float((model.relative_speed or 1.0) * factor)

    def matrix(self, job_types, fleet) -> np.ndarray:
        """(N, C) speed of each job on each cluster of the fleet."""
        job_types = list(job_types)
        uniq = {t: i for i, t in enumerate(dict.fromkeys(job_types))}
        per_type = np.array(
            [[self.speed(t, fleet.model_of(c)) for c in range(len(fleet))] for t in uniq], dtype=float
        ).reshape(len(uniq), len(fleet))
        return per_type[[uniq[t] for t in job_types]]


def durations(jobs: pd.DataFrame, fleet, speed_model: SpeedModel | None = None) -> np.ndarray:
    """(N, C) estimated run time in hours of each job on each cluster (default power limit)."""
    speed_model = speed_model or SpeedModel()
    speed = speed_model.matrix(jobs["job_type"], fleet)
    return jobs["duration_h_ref"].to_numpy(float)[:, None] / np.maximum(speed, 1e-6)


def region_set(value) -> frozenset[str]:
    """The regions of an `allowed_regions` value: a '|'-joined string or a list; empty (any region) for
    None/NaN/""."""
    if value is None or (isinstance(value, float) and value != value):
        return frozenset()
    if isinstance(value, str):
        return frozenset(part for part in value.split("|") if part)
    return frozenset(str(v) for v in value if str(v))


def hostable(jobs: pd.DataFrame, fleet) -> np.ndarray:
    """(N, C) bool: the cluster's GPU model satisfies the job's gpu_spec, some node shape can hold the job, and
    the cluster's region is one of the job's `allowed_regions` (data residency; the column is optional, and an
    empty value allows every region)."""
    n, C = len(jobs), len(fleet)
    out = np.zeros((n, C), dtype=bool)
    specs = jobs["gpu_spec"].fillna("").astype(str).map(normalize_gpu_spec).to_numpy()
    num_gpu = jobs["num_gpu"].to_numpy(np.int64)
    cpu = jobs["cpu_milli"].to_numpy(np.int64)
    mem = jobs["memory_mib"].to_numpy(np.int64)
    allowed = [region_set(v) for v in jobs["allowed_regions"]] if "allowed_regions" in jobs.columns else None
    for c, cl in enumerate(fleet.clusters):
        model = cl.config.gpu_model
        spec_ok = np.array([(not s) or (model in s.split("|")) for s in specs], dtype=bool)
        nodes = cl.nodes
        shape_ok = np.zeros(n, dtype=bool)
        for g, cp, m in nodes[["gpu", "cpu_milli", "memory_mib"]].drop_duplicates().itertuples(index=False):
            shape_ok |= (num_gpu <= g) & (cpu <= cp) & (mem <= m)
        out[:, c] = spec_ok & shape_ok
        if allowed is not None:
            region = cl.config.region
            out[:, c] &= np.array([(not a) or (region in a) for a in allowed], dtype=bool)
    return out


# ---------------------------------------------------------------------------------------------------- traces
def read_pods(pod_list: str = "default", data_dir=None) -> pd.DataFrame:
    """GPU pods of an openb pod list (`default`, `gpuspec10`, `multigpu20`, ... or a file name / path)."""
    root = _data_dir(data_dir)
    path = Path(pod_list)
    if not path.exists():
        name = pod_list if pod_list.startswith("openb_pod_list_") else f"openb_pod_list_{pod_list}"
        path = root / "openb" / (name if name.endswith(".csv") else name + ".csv")
    if not path.exists():
        raise FileNotFoundError(f"openb pod list not found: {path}")
    pods = pd.read_csv(path)
    required = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time")
    missing = [c for c in required if c not in pods.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}")
    for col in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time"):
        bad = pd.to_numeric(pods[col], errors="coerce").isna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise ValueError(f"{path}: row {row + 2}, field {col!r}: not a number ({pods[col].iloc[row]!r})")
    pods = pods[(pods["num_gpu"] > 0) & (pods["gpu_milli"] > 0)].copy()
    pods["gpu_milli"] = pods["gpu_milli"].clip(upper=MILLI).astype(np.int64)
    if "gpu_spec" not in pods.columns:
        pods["gpu_spec"] = ""
    pods["gpu_spec"] = pods["gpu_spec"].map(normalize_gpu_spec)
    if "qos" not in pods.columns:
        pods["qos"] = ""
    pods = pods.sort_values(["creation_time", "name"], kind="stable").reset_index(drop=True)
    pods.attrs["path"] = str(path)
    return pods


def read_philly(data_dir=None) -> pd.DataFrame:
    path = _data_dir(data_dir) / "interference" / "gavel" / "philly_job_distribution.csv"
    if not path.exists():
        raise FileNotFoundError(f"Philly job distribution not found: {path}")
    frame = pd.read_csv(path)
    for col in ("duration_s", "num_gpus"):
        if col not in frame.columns:
            raise ValueError(f"{path}: missing column {col!r}")
    frame = frame[(frame["duration_s"] > 0) & frame["num_gpus"].isin(PHILLY_BUCKETS)]
    return frame.reset_index(drop=True)


def philly_bucket(num_gpu: np.ndarray) -> np.ndarray:
    b = np.asarray(PHILLY_BUCKETS)
    idx = np.searchsorted(b, np.asarray(num_gpu), side="left")
    return b[np.minimum(idx, len(b) - 1)]


def generate_jobs(
    n: int,
    start,
    hours: int,
    fleet,
    *,
    seed: int = 0,
    data_dir=None,
    pod_list: str = "default",
    max_duration_h: float = 48.0,
    speed_model: SpeedModel | None = None,
    arrival: str = "diurnal",
) -> pd.DataFrame:
    """`n` jobs arriving in [start, start + hours) (see the module docstring). `arrival`: "diurnal", "trace" or
    "all-at-start".

    Jobs that no cluster of `fleet` can host (GPU model, node shape) are left out; `frame.attrs['dropped']`
    counts them."""
    if n <= 0:
        raise ValueError("n must be positive")
    start = utc_hour(start)
    rng = np.random.default_rng(seed)
    speed_model = speed_model or SpeedModel(data_dir)
    pods = read_pods(pod_list, data_dir)
    philly = read_philly(data_dir)
    pick = np.sort(rng.choice(len(pods), size=n, replace=n > len(pods)))
    sel = pods.iloc[pick].reset_index(drop=True)

    if arrival == "diurnal":
        tod_h = (sel["creation_time"].to_numpy(float) % 86400.0) / 3600.0
        n_days = max(1, int(np.ceil(hours / 24)))
        day = rng.integers(0, n_days, size=n)
        rel_h = np.floor(day * 24 + tod_h).astype(np.int64)
        rel_h = np.where(rel_h >= hours, rel_h % max(hours, 1), rel_h)
    elif arrival == "trace":
        t = sel["creation_time"].to_numpy(float)
        lo = float(np.quantile(pods["creation_time"].to_numpy(float), 0.01))
        t = np.maximum(t, lo)
        span = max(float(t.max() - lo), 1.0)
        rel_h = np.floor((t - lo) / span * (hours - 1e-9)).astype(np.int64)
    elif arrival == "all-at-start":
        rel_h = np.zeros(n, dtype=np.int64)
    else:
        raise ValueError(f"unknown arrival {arrival!r}")
    submit = start + pd.to_timedelta(rel_h, unit="h")

    num_gpu = sel["num_gpu"].to_numpy(np.int64)
    gpu_milli = sel["gpu_milli"].to_numpy(np.int64)
    bucket = philly_bucket(np.where(gpu_milli < MILLI, 1, num_gpu))
    dur_s = np.empty(n)
    for b in PHILLY_BUCKETS:
        m = bucket == b
        if m.any():
            pool = philly.loc[philly["num_gpus"] == b, "duration_s"].to_numpy(float)
            dur_s[m] = rng.choice(pool, size=int(m.sum()), replace=True)
    dur_h = np.clip(dur_s / 3600.0, 1.0, max_duration_h)

    job_type = np.array(GAVEL_JOB_TYPES, dtype=object)[rng.integers(0, len(GAVEL_JOB_TYPES), size=n)]
    klass = np.array([job_class(t) for t in job_type], dtype=object)
    lo_f = np.array([WORKLOAD_CLASSES[k][0] for k in klass])
    hi_f = np.array([WORKLOAD_CLASSES[k][1] for k in klass])
    flex = lo_f + (hi_f - lo_f) * rng.random(n)
    checkpoint = rng.random(n) < np.array([CHECKPOINT_P[k] for k in klass])
    gb_lo = np.array([DATA_GB[k][0] for k in klass])
    gb_hi = np.array([DATA_GB[k][1] for k in klass])
    data_gb = gb_lo + (gb_hi - gb_lo) * rng.random(n)
    u_home = rng.random(n)

    jobs = pd.DataFrame(
        {
            "job_id": [f"job-{i:05d}" for i in range(n)],
            "source_pod": sel["name"].astype(str).to_numpy(),
            "submit_time": submit,
            "duration_h_ref": dur_h,
            "num_gpu": num_gpu,
            "gpu_milli": gpu_milli,
            "cpu_milli": sel["cpu_milli"].to_numpy(np.int64),
            "memory_mib": sel["memory_mib"].to_numpy(np.int64),
            "gpu_spec": sel["gpu_spec"].astype(str).to_numpy(),
            "qos": sel["qos"].astype(str).to_numpy(),
            "workload_class": klass,
            "job_type": job_type,
            "flexibility": flex,
            "checkpointing": checkpoint,
            "data_gb": data_gb,
        }
    )
    host = hostable(jobs, fleet)
    ok = host.any(axis=1)
    gpus = np.array([c.n_gpus for c in fleet.clusters], dtype=float)
    w = host * gpus[None, :]
    w = w / np.maximum(w.sum(axis=1, keepdims=True), 1e-12)
    home = np.minimum((np.cumsum(w, axis=1) < u_home[:, None]).sum(axis=1), len(fleet) - 1)
    d = durations(jobs, fleet, speed_model)
    d_home = d[np.arange(n), home]
    jobs["home_cluster"] = np.array(fleet.names, dtype=object)[home]
    jobs["home_region"] = np.array(fleet.cluster_regions, dtype=object)[home]
    jobs["duration_h_home"] = d_home
    jobs["deadline"] = jobs["submit_time"] + pd.to_timedelta(d_home * (1.0 + flex), unit="h")
    dropped = int((~ok).sum())
    jobs = jobs.loc[ok, list(JOB_COLUMNS)].reset_index(drop=True)
    jobs.attrs.update(
        {
            "dropped": dropped,
            "pod_list": pods.attrs.get("path"),
            "seed": seed,
            "max_duration_h": max_duration_h,
            "speed_source": speed_model.source,
        }
    )
    return jobs


def validate_jobs(jobs: pd.DataFrame) -> None:
    """Raise ValueError naming the row and field of the first bad value of a job frame."""
    missing = [c for c in JOB_COLUMNS if c not in jobs.columns and c not in ("source_pod", "qos")]
    if missing:
        raise ValueError(f"job frame lacks column(s) {missing}")
    checks = (
        ("duration_h_ref", lambda s: s > 0),
        ("num_gpu", lambda s: s > 0),
        ("gpu_milli", lambda s: (s > 0) & (s <= MILLI)),
        ("flexibility", lambda s: s >= 0),
        ("data_gb", lambda s: s >= 0),
    )
    for col, fn in checks:
        ok = fn(jobs[col]).to_numpy()
        if not ok.all():
            row = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"job row {row} ({jobs['job_id'].iloc[row]}): bad {col} {jobs[col].iloc[row]!r}")
    late = (jobs["deadline"] < jobs["submit_time"]).to_numpy()
    if late.any():
        row = int(np.flatnonzero(late)[0])
        raise ValueError(f"job row {row} ({jobs['job_id'].iloc[row]}): deadline before submission")
