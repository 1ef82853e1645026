"""Job and GPU features, and the training tables built from marts.gpu_throughput.

A *job* is (job_type, scale_factor, resource shape): the same model at 2 GPUs consolidated on one server and 2 GPUs
spread over servers are different jobs. For 1-GPU jobs Gavel's consolidated and unconsolidated measurements are
identical, so 1-GPU jobs are always keyed as consolidated (the duplicate rows are dropped, which also keeps a pair
from leaking into its own held-out fold through its duplicate).

Targets are logarithms: log steps/s for isolated throughput (spans 4 orders of magnitude, and a log error of e
is a relative error of about e), log normalized throughput for a job co-located with a partner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduling.models.measured import parse_job_type

FAMILIES = ("A3C", "CycleGAN", "LM", "Recommendation", "ResNet-18", "ResNet-50", "Transformer")
GPU_TYPES = ("k80", "p100", "v100")
N_TYPE_FEATURES = len(FAMILIES) + 2  # family one-hot, log2 batch size, no-batch-size flag
N_CELL_FEATURES = len(GPU_TYPES) + 1 + len(FAMILIES) + 2 + 1  # the refiner's placement features
MULTI_GPU_SHAPES = ("x2c", "x2u", "x4c", "x4u", "x8c", "x8u")
N_JOB_FEATURES = N_TYPE_FEATURES + 3 + len(MULTI_GPU_SHAPES)  # + log2 scale, spread flag, 1/scale, shape one-hot


def job_key(job_type: str, scale_factor: int, consolidated: bool) -> str:
    scale = int(scale_factor)
    shape = "c" if (bool(consolidated) or scale == 1) else "u"
    return f"{job_type}|x{scale}{shape}"


def family_of(job_type: str, model_family: str | None = None) -> str:
    if isinstance(model_family, str) and model_family:
        return model_family
    return parse_job_type(job_type)[0]


def job_features(jobs: pd.DataFrame) -> np.ndarray:
    """Numeric features of jobs: family one-hot (unknown family: all zero), log2 batch size (0 and a missing flag
    where the job has none, e.g. A3C), log2 scale factor, spread-over-servers flag, 1/scale, and a one-hot of the
    measured multi-GPU resource shapes (x2/x4/x8, consolidated or spread; all zero for 1 GPU or other shapes)."""
    n = len(jobs)
    out = np.zeros((n, N_JOB_FEATURES), dtype=np.float32)
    families = [family_of(t, f) for t, f in zip(jobs["job_type"], jobs.get("model_family", [None] * n))]
    for i, fam in enumerate(families):
        if fam in FAMILIES:
            out[i, FAMILIES.index(fam)] = 1.0
    batch = pd.to_numeric(jobs["batch_size"], errors="coerce").to_numpy(dtype=float)
    has = np.isfinite(batch) & (batch > 0)
    k = len(FAMILIES)
    out[:, k] = np.where(has, (np.log2(np.where(has, batch, 1.0)) - 6.0) / 3.0, 0.0)
    out[:, k + 1] = (~has).astype(np.float32)
    scale = jobs["scale_factor"].to_numpy(dtype=float)
    out[:, k + 2] = np.log2(scale) / 3.0
    consolidated = jobs["consolidated"].to_numpy(dtype=bool) | (scale == 1)
    out[:, k + 3] = (~consolidated).astype(np.float32)
    out[:, k + 4] = 1.0 / scale
    for i, (s, c) in enumerate(zip(scale, consolidated)):
        name = f"x{int(s)}{'c' if c else 'u'}"
        if name in MULTI_GPU_SHAPES:
            out[i, k + 5 + MULTI_GPU_SHAPES.index(name)] = 1.0
    return out


def cell_features(cells: pd.DataFrame) -> np.ndarray:
    """Features of a placement, deliberately free of the job's identity (the kernel must transfer to job types
    never seen in feedback): GPU one-hot, co-located flag, partner family one-hot + log2 batch size + missing
    flag (all zero for isolated cells), network 1's log normalized throughput of the placement.

    cells: gpu_type, partner_job_type (None for isolated), prior_log_norm."""
    n = len(cells)
    out = np.zeros((n, N_CELL_FEATURES), dtype=np.float32)
    gpu = cells["gpu_type"].to_numpy()
    for i, g in enumerate(GPU_TYPES):
        out[:, i] = gpu == g
    col = len(GPU_TYPES)
    partner = cells["partner_job_type"].to_numpy(dtype=object)
    co = np.array([isinstance(p, str) and p != "" for p in partner])
    out[:, col] = co
    col += 1
    for r, p in enumerate(partner):
        if co[r]:
            fam, bs = parse_job_type(p)
            if fam in FAMILIES:
                out[r, col + FAMILIES.index(fam)] = 1.0
            if np.isfinite(bs):
                out[r, col + len(FAMILIES)] = (np.log2(bs) - 6.0) / 3.0
            else:
                out[r, col + len(FAMILIES) + 1] = 1.0
    col += len(FAMILIES) + 2
    out[:, col] = cells["prior_log_norm"].to_numpy(dtype=float)
    return out


def normalise_jobs(jobs: pd.DataFrame) -> pd.DataFrame:
    """Normalise a job description frame: needs job_type, batch_size, scale_factor, consolidated (model_family
    optional); adds job_key."""
    frame = jobs.copy()
    if "model_family" not in frame:
        frame["model_family"] = None
    if "scale_factor" not in frame:
        frame["scale_factor"] = 1
    if "consolidated" not in frame:
        frame["consolidated"] = True
    if "batch_size" not in frame:
        frame["batch_size"] = np.nan
    frame["job_key"] = [job_key(t, s, c) for t, s, c in zip(frame.job_type, frame.scale_factor, frame.consolidated)]
    return frame


@dataclass
class Vocab:
    """Network 1's vocabularies: job types and job keys with a learnt embedding (any other gets the padding index,
    one past the last, whose embedding is zero) and the GPU types."""

    types: list[str]
    keys: list[str]
    gpus: list[str] = field(default_factory=lambda: list(GPU_TYPES))

    def type_index(self, values) -> np.ndarray:
        lookup = {v: i for i, v in enumerate(self.types)}
        return np.array([lookup.get(v, len(self.types)) for v in values], dtype=np.int64)

    def key_index(self, values) -> np.ndarray:
        lookup = {v: i for i, v in enumerate(self.keys)}
        return np.array([lookup.get(v, len(self.keys)) for v in values], dtype=np.int64)

    def gpu_index(self, values) -> np.ndarray:
        lookup = {v: i for i, v in enumerate(self.gpus)}
        try:
            return np.array([lookup[str(v).lower()] for v in values], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(
                f"unknown GPU type {exc.args[0]!r}; network 1 knows {self.gpus} "
                "(map other models with scheduling.domain.gpus.map_gpu_type)"
            ) from None


@dataclass
class PerfTables:
    """Training/evaluation tables of one measurement set.

    jobs:  one row per job key (index), columns job_type, model_family, batch_size, scale_factor, consolidated.
    iso:   job_key, gpu_type, steps_per_s, log_y (feasible isolated measurements).
    pairs: job_key, partner_key, gpu_type, steps_per_s (this job co-located), isolated_steps_per_s,
           normalized_throughput, log_norm, pair_id (unordered pair, same id for both directions and all GPUs).
    """

    jobs: pd.DataFrame
    iso: pd.DataFrame
    pairs: pd.DataFrame


def _with_keys(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["job_key"] = [job_key(t, s, c) for t, s, c in zip(frame.job_type, frame.scale_factor, frame.consolidated)]
    return frame


def build_tables(throughput: pd.DataFrame, measurement_set: str = "simulation") -> PerfTables:
    frame = throughput[throughput["measurement_set"] == measurement_set]
    frame = frame[frame["gpu_type"].isin(GPU_TYPES)]
    # 1-GPU jobs: drop the (identical) unconsolidated duplicates.
    frame = frame[frame["consolidated"].astype(bool) | (frame["scale_factor"] > 1)]
    frame = _with_keys(frame)
    jobs = (
        frame[["job_key", "job_type", "model_family", "batch_size", "scale_factor", "consolidated"]]
        .drop_duplicates("job_key")
        .set_index("job_key")
        .sort_index()
    )
    jobs["consolidated"] = jobs["consolidated"].astype(bool) | (jobs["scale_factor"] == 1)
    isolated = frame[frame["partner_job_type"].isna() & frame["feasible"] & (frame["steps_per_s"] > 0)]
    iso = isolated[["job_key", "job_type", "gpu_type", "steps_per_s"]].copy()
    iso["log_y"] = np.log(iso["steps_per_s"].to_numpy())
    paired = frame[frame["partner_job_type"].notna() & frame["feasible"] & (frame["normalized_throughput"] > 0)]
    pairs = paired[
        [
            "job_key",
            "job_type",
            "partner_job_type",
            "partner_scale_factor",
            "gpu_type",
            "steps_per_s",
            "isolated_steps_per_s",
            "normalized_throughput",
        ]
    ].copy()
    pairs["partner_key"] = [
        job_key(t, int(s), True) for t, s in zip(pairs["partner_job_type"], pairs["partner_scale_factor"].fillna(1))
    ]
    pairs["log_norm"] = np.log(pairs["normalized_throughput"].to_numpy())
    pairs["pair_id"] = [" & ".join(sorted((a, b))) for a, b in zip(pairs["job_key"], pairs["partner_key"])]
    # Partners that never appear as jobs (should not happen with Gavel) still need a feature row.
    missing = sorted(set(pairs["partner_key"]) - set(jobs.index))
    if missing:
        extra = pd.DataFrame(
            [
                dict(
                    job_key=k,
                    job_type=k.split("|")[0],
                    model_family=parse_job_type(k.split("|")[0])[0],
                    batch_size=parse_job_type(k.split("|")[0])[1],
                    scale_factor=1,
                    consolidated=True,
                )
                for k in missing
            ]
        ).set_index("job_key")
        jobs = pd.concat([jobs, extra]).sort_index()
    return PerfTables(jobs=jobs, iso=iso.reset_index(drop=True), pairs=pairs.reset_index(drop=True))


def mape(pred, true) -> float:
    pred = np.asarray(pred, dtype=float)
    true = np.asarray(true, dtype=float)
    return float(np.mean(np.abs(pred - true) / np.abs(true)) * 100.0)
