"""GPU energy measurements: Zeus power-limit sweeps and profiles, ML.ENERGY leaderboards v2/v3, AcmeTrace.

Tables (one batch per file, batch_id = "<source>:<path relative to DATA_DIR>"):
- raw.zeus_power_sweep: energy/zeus/zeus_power_limit_sweep.csv (the union of the 4 summary_power_<gpu>.csv files with
  gpu_type and energy). Only when that derived file is absent are the 4 summary_power files read instead (gpu_type
  from the file name, energy = time x power), never both, so nothing is counted twice.
- raw.zeus_train_summary: zeus/summary_train.csv (target_epoch NULL where the target metric was never reached).
- raw.zeus_profile_windows: zeus/profile_data/<GPU>+<model>+gpu<ids>.csv, long: one row per (window, GPU).
- raw.mlenergy_v2_legacy / raw.mlenergy_v2_llm_runs / raw.mlenergy_v2_diffusion_runs: ML.ENERGY leaderboard v2.
- raw.mlenergy_v3_configurations: ML.ENERGY benchmark v3 (H100/B200) configurations.
- raw.acme_cluster_summary / raw.acme_utilization_cdfs: AcmeTrace (NSDI'24) summaries and CDFs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from warehouse.db import Batch, Rejection
from warehouse.loaders.base import Column, LoadError, Source, _sniff_text, read_checked_csv
from warehouse.loaders.cluster import batch_id, csv_source, glob_files, read_csv_batch, with_constants

# --- Zeus power-limit sweep --------------------------------------------------------------------------------------

SWEEP_DERIVED = "energy/zeus/zeus_power_limit_sweep.csv"
SWEEP_SUMMARIES = "energy/zeus/summary_power_*.csv"
SWEEP_KEY = ["gpu_type", "dataset", "network", "batch_size", "optimizer", "power_limit_w"]
_SWEEP_CONFIG = [
    Column("dataset", "str"),
    Column("network", "str"),
    Column("batch_size", "int", min_value=1),
    Column("optimizer", "str"),
]
SWEEP_DERIVED_COLUMNS = [
    Column("gpu_type", "str"),
    *_SWEEP_CONFIG,
    Column("power_limit_w", "float", min_value=0),
    Column("time_per_epoch_s", "float", min_value=0),
    Column("avg_power_w", "float", min_value=0),
    Column("energy_per_epoch_j", "float", min_value=0),
]
SWEEP_SUMMARY_COLUMNS = [
    *_SWEEP_CONFIG,
    Column("power_limit", "float", min_value=0, rename="power_limit_w"),
    Column("time_per_epoch", "float", min_value=0, rename="time_per_epoch_s"),
    Column("average_power", "float", min_value=0, rename="avg_power_w"),
]
# summary_power_<suffix>.csv -> the gpu_type the derived file uses
SWEEP_GPU_NAMES = {"a40": "A40", "v100": "V100", "p100": "P100", "rtx6000": "RTX6000"}


def _sweep_files(data_dir: Path) -> list[Path]:
    derived = Path(data_dir) / SWEEP_DERIVED
    if derived.is_file():
        return [derived]
    return glob_files(data_dir, [SWEEP_SUMMARIES])


def _summary_gpu(path: Path) -> str:
    suffix = path.stem.removeprefix("summary_power_")
    return SWEEP_GPU_NAMES.get(suffix.lower(), suffix.upper())


def _sweep_batches(data_dir: Path) -> Iterator[Batch]:
    for path in _sweep_files(data_dir):
        if path.name == Path(SWEEP_DERIVED).name:
            frame, rejections = read_checked_csv(path, SWEEP_DERIVED_COLUMNS, key=SWEEP_KEY)
        else:
            frame, rejections = read_checked_csv(path, SWEEP_SUMMARY_COLUMNS, key=SWEEP_KEY[1:])
            frame = with_constants(frame, {"gpu_type": _summary_gpu(path)})
            frame["energy_per_epoch_j"] = frame["time_per_epoch_s"] * frame["avg_power_w"]
        yield Batch(
            "raw.zeus_power_sweep", batch_id("zeus_power_sweep", path, data_dir), "zeus_power_sweep", frame, rejections
        )


zeus_power_sweep = Source(
    "zeus_power_sweep",
    "energy",
    "Zeus (NSDI'23) time/power per epoch vs GPU power limit, A40/V100/RTX6000/P100 -> raw.zeus_power_sweep",
    _sweep_batches,
    _sweep_files,
)

TRAIN_COLUMNS = [
    *_SWEEP_CONFIG,
    Column("learning_rate", "float", min_value=0),
    Column("run", "int", min_value=0),
    Column("target_metric", "float"),
    Column("target_epoch", "str", nullable=True),  # "nan" in the file: target never reached -> NULL
]
TRAIN_KEY = ["dataset", "network", "batch_size", "optimizer", "learning_rate", "run", "target_metric"]
NAN_TOKENS = {"nan", "NaN", "NAN"}


def load_zeus_train_summary(path: Path, data_dir: Path) -> Batch:
    """summary_train.csv; target_epoch is written as `nan` where the target metric was never reached (NULL here)."""
    frame, rejections = read_checked_csv(path, TRAIN_COLUMNS, key=TRAIN_KEY, line_column="_line")
    raw = frame["target_epoch"]
    missing = raw.isna() | raw.isin(NAN_TOKENS)
    epoch = pd.to_numeric(raw.where(~missing), errors="coerce").astype("float64")
    not_number = ~missing & (epoch.isna() | ~np.isfinite(epoch))
    reasons = pd.Series(pd.NA, index=frame.index, dtype="string")
    reasons[not_number] = "not a number (expected an integer, or nan when the target was not reached)"
    reasons[reasons.isna() & ~missing & (epoch != np.floor(epoch))] = "not an integer"
    reasons[reasons.isna() & (epoch < 0)] = "below minimum 0"
    bad = reasons.notna()
    for idx in np.flatnonzero(bad.to_numpy()):
        row = frame.iloc[idx]
        rejections.append(
            Rejection(
                str(reasons.iloc[idx]),
                str(path),
                int(row["_line"]),
                "target_epoch",
                str(raw.iloc[idx]),
                {k: str(v) for k, v in row.items() if k != "_line"},
            )
        )
    epoch = epoch.where(~bad & ~missing)
    frame = frame.assign(target_epoch=epoch.astype("Int64")).loc[~bad.to_numpy()].drop(columns="_line")
    return Batch(
        "raw.zeus_train_summary",
        batch_id("zeus_train_summary", path, data_dir),
        "zeus_train_summary",
        frame.reset_index(drop=True),
        rejections,
    )


def _train_files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, ["energy/zeus/summary_train.csv"])


zeus_train_summary = Source(
    "zeus_train_summary",
    "energy",
    "Zeus train trace: epochs to target metric per config and seed -> raw.zeus_train_summary",
    lambda data_dir: (load_zeus_train_summary(p, data_dir) for p in _train_files(data_dir)),
    _train_files,
)

# --- Zeus profile windows ----------------------------------------------------------------------------------------

PROFILE_NAME = re.compile(r"^(?P<gpu>[^+]+)\+(?P<model>[^+]+)\+gpu(?P<ids>\d+(?:,\d+)*)$")
PROFILE_GPU_COLUMN = re.compile(r"^gpu(\d+)_energy$")
WINDOW_POWER_LIMIT = re.compile(r"_(\d+(?:\.\d+)?)$")


def _csv_header(path: Path) -> list[str]:
    lines = _sniff_text(path).lstrip().splitlines()
    if not lines:  # empty, or only whitespace / separator characters (str.splitlines splits on \x1c too)
        raise LoadError(path, "no header row (the file is empty)", row=1)
    return [h.strip().strip('"') for h in lines[0].split(",")]


def load_zeus_profile(path: Path, data_dir: Path) -> Batch:
    """One Zeus profile_data file as long rows: (window, gpu_index) -> energy_j, with the power limit of the window."""
    path = Path(path)
    match = PROFILE_NAME.match(path.stem)
    if not match:
        raise LoadError(path, "file name is not <GPU>+<model>+gpu<ids>.csv")
    gpu_columns = [h for h in _csv_header(path) if PROFILE_GPU_COLUMN.match(h)]
    if not gpu_columns:
        raise LoadError(path, "no gpu<i>_energy column", row=1, field="gpu<i>_energy")
    columns = [
        Column("start_time", "float", min_value=0, rename="start_time_s"),
        Column("window_name", "str"),
        Column("elapsed_time", "float", min_value=0, rename="elapsed_time_s"),
        *[Column(c, "float", min_value=0) for c in gpu_columns],
    ]
    frame, rejections = read_checked_csv(path, columns, key=["window_name"], line_column="_line")
    limit = frame["window_name"].str.extract(WINDOW_POWER_LIMIT, expand=False)
    no_limit = limit.isna().to_numpy()
    for idx in np.flatnonzero(no_limit):
        rejections.append(
            Rejection(
                "window_name does not end in _<power limit W>",
                str(path),
                int(frame["_line"].iloc[idx]),
                "window_name",
                str(frame["window_name"].iloc[idx]),
                {k: str(v) for k, v in frame.iloc[idx].items() if k != "_line"},
            )
        )
    frame = frame.loc[~no_limit].reset_index(drop=True)
    frame["power_limit_w"] = pd.to_numeric(limit[~no_limit]).astype("Float64").to_numpy()
    frame["window_index"] = pd.Series(np.arange(len(frame)), dtype="Int64")
    long = frame.melt(
        id_vars=["window_index", "start_time_s", "window_name", "power_limit_w", "elapsed_time_s"],
        value_vars=gpu_columns,
        var_name="gpu_column",
        value_name="energy_j",
    )
    long["gpu_index"] = long["gpu_column"].str.extract(PROFILE_GPU_COLUMN, expand=False).astype("Int64")
    long["energy_j"] = long["energy_j"].astype("Float64")
    long["avg_power_w"] = long["energy_j"] / long["elapsed_time_s"].where(long["elapsed_time_s"] > 0)
    long = long.drop(columns="gpu_column").sort_values(["window_index", "gpu_index"]).reset_index(drop=True)
    ids = match["ids"].split(",")
    long = with_constants(
        long, {"gpu_model": match["gpu"], "model_name": match["model"], "gpu_ids": ",".join(ids), "num_gpus": len(ids)}
    )
    order = [
        "gpu_model",
        "model_name",
        "gpu_ids",
        "num_gpus",
        "window_index",
        "window_name",
        "power_limit_w",
        "start_time_s",
        "elapsed_time_s",
        "gpu_index",
        "energy_j",
        "avg_power_w",
    ]
    return Batch(
        "raw.zeus_profile_windows", batch_id("zeus_profiles", path, data_dir), "zeus_profiles", long[order], rejections
    )


def _profile_files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, ["energy/zeus/profile_data/*.csv"])


zeus_profiles = Source(
    "zeus_profiles",
    "energy",
    "Zeus power-limit profiling windows (A40/V100, 1-4 GPUs), energy per GPU -> raw.zeus_profile_windows",
    lambda data_dir: (load_zeus_profile(p, data_dir) for p in _profile_files(data_dir)),
    _profile_files,
)

# --- ML.ENERGY leaderboard v2 ------------------------------------------------------------------------------------

V2 = "energy/mlenergy_leaderboard_v2"
LEGACY_NAME = re.compile(r"^(?P<gpu>[^_]+)_(?P<task>.+)_benchmark$")
LEGACY_COLUMNS = [
    Column("model", "str"),
    Column("throughput", "float", min_value=0, rename="throughput_tokens_per_s"),
    Column("response_length", "float", min_value=0, rename="response_length_tokens"),
    Column("latency", "float", min_value=0, rename="latency_s"),
    Column("energy", "float", min_value=0, rename="energy_per_response_j"),
]
# the columns naming a v2 run (folder path + the model and GPU the run reports), shared by LLM and diffusion runs
RUN_ID_COLUMNS = [
    Column("task_family", "str"),
    Column("task", "str"),
    Column("gpu_dir", "str"),
    Column("config", "str"),
    Column("Model", "str", rename="model"),
    Column("GPU", "str", rename="gpu"),
]
LLM_RUN_COLUMNS = RUN_ID_COLUMNS + [
    Column("TP", "int", min_value=1, rename="tensor_parallel"),
    Column("PP", "int", min_value=1, rename="pipeline_parallel"),
    Column("Energy/req (J)", "float", min_value=0, rename="energy_per_request_j"),
    Column("Avg TPOT (s)", "float", min_value=0, rename="avg_tpot_s"),
    Column("Token tput (tok/s)", "float", min_value=0, rename="token_throughput_tokens_per_s"),
    Column("Avg Output Tokens", "float", min_value=0, rename="avg_output_tokens"),
    Column("Avg BS (reqs)", "float", min_value=0, rename="avg_batch_size_reqs"),
    Column("Max BS (reqs)", "int", min_value=0, rename="max_batch_size_reqs"),
]
DIFFUSION_COLUMNS = RUN_ID_COLUMNS + [
    Column("Energy/image (J)", "float", nullable=True, min_value=0, rename="energy_per_image_j", required=False),
    Column("Energy/video (J)", "float", nullable=True, min_value=0, rename="energy_per_video_j", required=False),
    Column("Batch latency (s)", "float", min_value=0, rename="batch_latency_s"),
    Column("Batch size", "int", min_value=1, rename="batch_size"),
    Column("Denoising steps", "int", min_value=0, rename="denoising_steps"),
    Column("Frames", "int", nullable=True, min_value=0, rename="frames", required=False),
]
RUN_KEY = ["task", "gpu_dir", "config", "model"]


def _legacy_constants(path: Path) -> dict[str, object]:
    match = LEGACY_NAME.match(path.stem)
    if not match:
        raise LoadError(path, "file name is not <GPU>_<task>_benchmark.csv")
    return {"gpu": match["gpu"], "task": match["task"]}


def _v2_files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, [f"{V2}/legacy/*_benchmark.csv", f"{V2}/llm_runs.csv", f"{V2}/diffusion_runs.csv"])


def _v2_batches(data_dir: Path) -> Iterator[Batch]:
    for path in _v2_files(data_dir):
        if path.name == "llm_runs.csv":
            yield read_csv_batch(
                "mlenergy_v2", "raw.mlenergy_v2_llm_runs", path, data_dir, LLM_RUN_COLUMNS, key=RUN_KEY
            )
        elif path.name == "diffusion_runs.csv":
            yield read_csv_batch(
                "mlenergy_v2", "raw.mlenergy_v2_diffusion_runs", path, data_dir, DIFFUSION_COLUMNS, key=RUN_KEY
            )
        else:
            yield read_csv_batch(
                "mlenergy_v2",
                "raw.mlenergy_v2_legacy",
                path,
                data_dir,
                LEGACY_COLUMNS,
                key=["model"],
                constants=_legacy_constants,
            )


mlenergy_v2 = Source(
    "mlenergy_v2",
    "energy",
    "ML.ENERGY leaderboard v2: legacy per-GPU/task CSVs, LLM and diffusion runs -> raw.mlenergy_v2_*",
    _v2_batches,
    _v2_files,
)

# --- ML.ENERGY benchmark v3 --------------------------------------------------------------------------------------

mlenergy_v3 = csv_source(
    "mlenergy_v3",
    "energy",
    "ML.ENERGY benchmark v3 (H100/B200) LLM/MLLM configurations -> raw.mlenergy_v3_configurations",
    "raw.mlenergy_v3_configurations",
    ["energy/mlenergy_leaderboard_v3/llm_mllm_configurations.csv"],
    [
        Column("task", "str"),
        Column("model_id", "str"),
        Column("nickname", "str", nullable=True),
        Column("architecture", "str", nullable=True),
        Column("total_params_billions", "float", nullable=True, min_value=0),
        Column("activated_params_billions", "float", nullable=True, min_value=0),
        Column("weight_precision", "str", nullable=True),
        Column("gpu_model", "str"),
        Column("num_gpus", "int", min_value=1),
        Column("tensor_parallel", "int", min_value=1),
        Column("data_parallel", "int", min_value=1),
        Column("expert_parallel", "int", min_value=1),
        Column("max_num_seqs", "int", min_value=1),
        Column("avg_batch_size", "float", min_value=0),
        Column("avg_output_len", "float", min_value=0, rename="avg_output_len_tokens"),
        # total over num_gpus (SOURCE.md)
        Column("avg_power_watts", "float", min_value=0, rename="avg_power_total_w"),
        Column("energy_per_request_joules", "float", min_value=0, rename="energy_per_request_j"),
        Column("energy_per_token_joules", "float", min_value=0, rename="energy_per_token_j"),
        Column("output_throughput_tokens_per_sec", "float", min_value=0, rename="output_throughput_tokens_per_s"),
        Column("median_itl_ms", "float", min_value=0),
        Column("p90_itl_ms", "float", min_value=0),
        Column("p95_itl_ms", "float", min_value=0),
        Column("p99_itl_ms", "float", min_value=0),
    ],
    # No key: 3 configurations appear twice with different measurements (repeated runs), all kept.
)

# --- AcmeTrace ---------------------------------------------------------------------------------------------------

_RATE = dict(kind="float", nullable=True, min_value=0, max_value=1)
ACME_SUMMARY_COLUMNS = [
    Column("id", "str", rename="cluster"),
    Column("job_num", "int", min_value=0),
    Column("cpu_job_num", "int", min_value=0),
    Column("gpu_job_num", "int", min_value=0),
    Column("avg_run_time_gpu", "float", nullable=True, min_value=0, rename="avg_run_time_gpu_s"),
    Column("avg_que_time_gpu", "float", nullable=True, min_value=0, rename="avg_queue_time_gpu_s"),
    Column("avg_gpu_num", "float", nullable=True, min_value=0),
    Column("med_run_time_gpu", "float", nullable=True, min_value=0, rename="med_run_time_gpu_s"),
    Column("med_que_time_gpu", "float", nullable=True, min_value=0, rename="med_queue_time_gpu_s"),
    Column("med_gpu_num", "float", nullable=True, min_value=0),
    Column("max_run_time_gpu", "float", nullable=True, min_value=0, rename="max_run_time_gpu_s"),
    Column("max_gpu", "float", nullable=True, min_value=0, rename="max_gpu_num"),
    Column("complete_rate_gpu", **_RATE),
    Column("cancel_rate_gpu", **_RATE),
    Column("fail_rate_gpu", **_RATE),
    # GPU time = GPU-seconds
    Column("complete_gpu_time", "float", nullable=True, min_value=0, rename="complete_gpu_time_gpu_s"),
    Column("cancel_gpu_time", "float", nullable=True, min_value=0, rename="cancel_gpu_time_gpu_s"),
    Column("fail_gpu_time", "float", nullable=True, min_value=0, rename="fail_gpu_time_gpu_s"),
    Column("complete_rate_gpu_time", **_RATE),
    Column("cancel_rate_gpu_time", **_RATE),
    Column("fail_rate_gpu_time", **_RATE),
    Column("avg_run_time_cpu", "float", nullable=True, min_value=0, rename="avg_run_time_cpu_s"),
    Column("avg_que_time_cpu", "float", nullable=True, min_value=0, rename="avg_queue_time_cpu_s"),
    Column("med_run_time_cpu", "float", nullable=True, min_value=0, rename="med_run_time_cpu_s"),
    Column("med_que_time_cpu", "float", nullable=True, min_value=0, rename="med_queue_time_cpu_s"),
    Column("complete_rate_cpu", **_RATE),
    Column("cancel_rate_cpu", **_RATE),
    Column("fail_rate_cpu", **_RATE),
]
ACME_CDF_COLUMNS = [
    Column("cluster", "str"),
    Column("metric", "str"),  # the unit is in the metric name (gpu_power_w, gpu_temp_c, sm_active_pct, ...)
    Column("value", "float", min_value=0),
    Column("cdf_pct", "float", min_value=0, max_value=100),
]


def _acme_files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, ["energy/acmetrace/cluster_summary.csv", "energy/acmetrace/acme_utilization_cdfs.csv"])


def _acme_batches(data_dir: Path) -> Iterator[Batch]:
    for path in _acme_files(data_dir):
        if path.name == "cluster_summary.csv":
            yield read_csv_batch(
                "acmetrace", "raw.acme_cluster_summary", path, data_dir, ACME_SUMMARY_COLUMNS, key=["cluster"]
            )
        else:
            yield read_csv_batch(
                "acmetrace",
                "raw.acme_utilization_cdfs",
                path,
                data_dir,
                ACME_CDF_COLUMNS,
                key=["cluster", "metric", "cdf_pct"],
            )


acmetrace = Source(
    "acmetrace",
    "energy",
    "AcmeTrace (NSDI'24) cluster summaries and GPU power/utilisation CDFs -> raw.acme_*",
    _acme_batches,
    _acme_files,
)

SOURCES: list[Source] = [zeus_power_sweep, zeus_train_summary, zeus_profiles, mlenergy_v2, mlenergy_v3, acmetrace]
