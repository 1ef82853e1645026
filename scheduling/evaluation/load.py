"""How busy a fleet is: the GPUs each job counts for and the load the jobs place on a fleet.

A job sharing a GPU counts either for the GPU-milli it asks for (`gpu-milli`) or for the share of a device it holds
when jobs of its size share the device (`device-share`, `held_milli`: an 810-milli job holds the whole device).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scheduling.packing.pods import MILLI, held_milli

# How much of a device a job's GPU share counts for in the load (per-GPU milli -> milli counted).
LOAD_BASES = {
    "gpu-milli": lambda milli: np.asarray(milli, dtype=float),  # what the job asks for
    "device-share": held_milli,  # what it holds of a device shared by jobs of its size
}
DEFAULT_LOAD_BASIS = "gpu-milli"


def job_gpus(jobs: pd.DataFrame, basis: str = DEFAULT_LOAD_BASIS) -> np.ndarray:
    """(N,) GPUs each job counts for in the load: num_gpu x its per-GPU share on `basis` (`LOAD_BASES`) / MILLI."""
    if basis not in LOAD_BASES:
        raise ValueError(f"unknown load basis {basis!r}; known: {', '.join(LOAD_BASES)}")
    share = LOAD_BASES[basis](jobs["gpu_milli"].to_numpy(float))
    return jobs["num_gpu"].to_numpy(float) * share / MILLI


def placed_load(jobs: pd.DataFrame, dur_h, fleet, hours: int, basis: str = DEFAULT_LOAD_BASIS) -> float:
    """The GPU-hours the jobs ran with (`dur_h` per job, as a policy ran them) on `basis`, over the fleet's GPU-hours
    of the period."""
    return float((job_gpus(jobs, basis) * np.asarray(dur_h, dtype=float)).sum() / max(fleet.total_gpus * hours, 1e-12))
