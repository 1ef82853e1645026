"""Demo jobs from the traces, written as an intake file, so that demos feed the queue through the same intake as
operators do (`python -m scheduling jobs from-trace --day 2021-07-15 --n 300 --out demo.yaml`, then
`jobs submit demo.yaml`).

The jobs are `scheduling.domain.jobs.generate_jobs(n, day, 24, fleet, seed)` (seed = the day as yyyymmdd unless
given), one intake job each: tenant `demo`, job_id `<yyyymmdd>-job-NNNNN`, submitted_at = the trace submission, the
pod's GPUs, share, GPU models, CPU and memory (at least the queue's minimum requests), the Gavel job type and its
class, est_duration_h = the run time on the home cluster, the generator's absolute deadline,
checkpoint_interval_min 30 for checkpointing jobs, input_gb = the job's data, and a Kubernetes payload
(`registry.example/train:latest`, `python train.py --job-type <type>`). Every job it writes passes the intake.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from common.timeutil import iso_z, utc
from scheduling.domain.jobs import SpeedModel, durations, generate_jobs, hostable
from scheduling.queue.estimate import home_indices
from scheduling.queue.spec import MIN_CPU_MILLI, MIN_MEMORY_MIB

DEMO_TENANT = "demo"
DEMO_IMAGE = "registry.example/train:latest"
CHECKPOINT_INTERVAL_MIN = 30


def trace_frame(day, n: int, fleet, *, seed: int | None = None, data_dir=None) -> pd.DataFrame:
    """The generator's job frame behind `trace_jobs` (what the simulator replays for the same jobs)."""
    day = utc(day).floor("D")
    seed = int(day.strftime("%Y%m%d")) if seed is None else int(seed)
    jobs = generate_jobs(n, day, 24, fleet, seed=seed, data_dir=data_dir)
    # a trace pod that requests no CPU or memory (openb has one asking 0 MiB) asks for the least the queue takes
    jobs["cpu_milli"] = jobs["cpu_milli"].clip(lower=MIN_CPU_MILLI)
    jobs["memory_mib"] = jobs["memory_mib"].clip(lower=MIN_MEMORY_MIB)
    return home_by_region(jobs, fleet, data_dir)


def home_by_region(jobs: pd.DataFrame, fleet, data_dir=None) -> pd.DataFrame:
    """The jobs homed as the queue homes a job it is given with a home region (`estimate.home_indices`: the
    region's first cluster that hosts it), their home run time and deadline (home run time x (1 + flexibility))
    taken there. The generator draws a home cluster; where a region has several (a declared H100 cluster beside a
    sampled one), the intake's `est_duration_h` must be the run time on the cluster the queue calls home."""
    host = hostable(jobs, fleet)
    home = home_indices(list(jobs["home_region"]), host, np.array(fleet.cluster_regions, dtype=object))
    names = np.array(fleet.names, dtype=object)
    moved = (home >= 0) & (names[np.maximum(home, 0)] != jobs["home_cluster"].to_numpy(object))
    if not moved.any():
        return jobs
    d = durations(jobs, fleet, SpeedModel(data_dir))[np.arange(len(jobs)), np.maximum(home, 0)]
    jobs = jobs.copy()
    jobs.loc[moved, "home_cluster"] = names[home[moved]]
    jobs.loc[moved, "duration_h_home"] = d[moved]
    deadline = jobs["submit_time"] + pd.to_timedelta(d * (1.0 + jobs["flexibility"].to_numpy(float)), unit="h")
    jobs.loc[moved, "deadline"] = deadline[moved]
    return jobs


def trace_jobs(day, n: int, fleet, *, seed: int | None = None, data_dir=None) -> list[dict]:
    """`n` trace jobs arriving over the UTC day `day` as intake mappings (fewer when the generator drops jobs no
    cluster of `fleet` can host)."""
    day = utc(day).floor("D")
    jobs = trace_frame(day, n, fleet, seed=seed, data_dir=data_dir)
    prefix = day.strftime("%Y%m%d")
    out = []
    for r in jobs.itertuples(index=False):
        job = {
            "tenant": DEMO_TENANT,
            "job_id": f"{prefix}-{r.job_id}",
            "submitted_at": iso_z(r.submit_time),
            "gpus": int(r.num_gpu),
            "gpu_milli": int(r.gpu_milli),
            "gpu_models": [m for m in str(r.gpu_spec).split("|") if m],
            "cpu_milli": int(r.cpu_milli),
            "memory_mib": int(r.memory_mib),
            "workload_class": str(r.workload_class),
            "job_type": str(r.job_type),
            "est_duration_h": round(float(r.duration_h_home), 4),
            "deadline": iso_z(pd.Timestamp(r.deadline).ceil("s")),
            "checkpoint_interval_min": CHECKPOINT_INTERVAL_MIN if bool(r.checkpointing) else None,
            "home_region": str(r.home_region),
            "input_gb": round(float(r.data_gb), 3),
            "image": DEMO_IMAGE,
            "command": ["python", "train.py", "--job-type", str(r.job_type)],
        }
        out.append({k: v for k, v in job.items() if v is not None and v != []})
    return out


def write_trace_file(path, day, n: int, fleet, *, seed: int | None = None, data_dir=None) -> dict:
    """Write `trace_jobs(...)` as a YAML intake file (atomically); returns {path, jobs, day, seed}."""
    path = Path(path)
    day = utc(day).floor("D")
    jobs = trace_jobs(day, n, fleet, seed=seed, data_dir=data_dir)
    header = (
        f"# {len(jobs)} demo jobs from the traces (openb pods, Philly durations, Gavel job types), arriving on "
        f"{day.date()}.\n# Submit with: python -m scheduling jobs submit {path.name}\n"
    )
    text = header + yaml.safe_dump({"jobs": jobs}, sort_keys=False, allow_unicode=True, width=120)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return {
        "path": str(path),
        "jobs": len(jobs),
        "day": str(day.date()),
        "seed": int(day.strftime("%Y%m%d")) if seed is None else int(seed),
    }


def job_gpu_hours(jobs: list[dict]) -> float:
    """GPU-hours the intake mappings ask for: GPUs x per-GPU share x estimated run time."""
    return float(sum(j["gpus"] * j.get("gpu_milli", 1000) / 1000.0 * j["est_duration_h"] for j in jobs))
