"""Performance and energy measurements for the predictor and the power model.

Two ways to the same frames (columns as in docs/data-contracts.md):

* `load_throughput(db_path)` / `load_energy_profiles(db_path)` read the dbt marts `marts.gpu_throughput` and
  `marts.gpu_energy_profiles` through `warehouse.db.reader` (the production path);
* `throughput_from_files(data_dir)` / `energy_profiles_from_files(data_dir)` build the identical frames straight
  from the shared files (Gavel CSV/JSON, Zeus sweep CSV) — for development, tests, and as the fallback when the
  marts do not exist yet (`load_*(..., fallback=True)`, the default).

marts.gpu_throughput, one row per (measurement_set, gpu_type, consolidated, job, partner):
  measurement_set ∈ simulation | physical | oracle; gpu_type ∈ k80 | p100 | v100; consolidated BOOLEAN;
  job_type ("ResNet-18 (batch size 64)"), model_family, batch_size (NULL for A3C/CycleGAN), scale_factor,
  partner_job_type / partner_scale_factor (NULL for isolated rows), steps_per_s, isolated_steps_per_s,
  normalized_throughput (= steps_per_s / isolated_steps_per_s for pairs, 1.0 isolated), feasible BOOLEAN.
  Infeasible rows (Gavel's [0, 0]: OOM or never profiled, which includes every pair with a multi-GPU job) are
  kept with feasible = FALSE and steps_per_s = normalized_throughput = 0.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from warehouse.config import data_dir as configured_data_dir
from warehouse.db import reader

THROUGHPUT_COLUMNS = [
    "measurement_set",
    "gpu_type",
    "consolidated",
    "job_type",
    "model_family",
    "batch_size",
    "scale_factor",
    "partner_job_type",
    "partner_scale_factor",
    "steps_per_s",
    "isolated_steps_per_s",
    "normalized_throughput",
    "feasible",
]

ENERGY_COLUMNS = [
    "gpu_type",
    "dataset",
    "network",
    "workload",
    "batch_size",
    "optimizer",
    "power_limit_w",
    "time_per_epoch_s",
    "avg_power_w",
    "energy_per_epoch_j",
    "max_power_limit_w",
    "is_energy_optimal",
    "energy_optimal_limit_w",
    "slowdown_at_optimal",
    "energy_saving_at_optimal",
]

GAVEL_DIR = Path("interference") / "gavel"
ZEUS_SWEEP = Path("energy") / "zeus" / "zeus_power_limit_sweep.csv"

_JOB_RE = re.compile(r"^(?P<family>.+?) \(batch size (?P<bs>\d+)\)$")


def parse_job_type(job_type: str) -> tuple[str, float]:
    """'ResNet-18 (batch size 64)' -> ('ResNet-18', 64.0); 'A3C' -> ('A3C', nan)."""
    match = _JOB_RE.match(job_type)
    if match:
        return match.group("family"), float(match.group("bs"))
    return job_type, float("nan")


class PerfDataError(ValueError):
    """A measurement file is missing or malformed; the message names the file (and row/field where known)."""


def _require(path: Path) -> Path:
    if not path.exists():
        raise PerfDataError(f"{path}: file not found (DATA_DIR={path.parents[2] if len(path.parents) > 2 else path})")
    return path


def _read_csv(path: Path, required: list[str]) -> pd.DataFrame:
    frame = pd.read_csv(_require(path))
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise PerfDataError(f"{path}: missing column(s) {missing}")
    return frame


def _finish_throughput(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[THROUGHPUT_COLUMNS].copy()
    frame["consolidated"] = frame["consolidated"].astype(bool)
    frame["feasible"] = frame["feasible"].astype(bool)
    for column in ("batch_size", "steps_per_s", "isolated_steps_per_s", "normalized_throughput"):
        frame[column] = frame[column].astype("float64")
    frame["scale_factor"] = frame["scale_factor"].astype("int64")
    frame["partner_scale_factor"] = frame["partner_scale_factor"].astype("Int64")
    frame["partner_job_type"] = frame["partner_job_type"].astype(object)
    frame = frame.sort_values(
        ["measurement_set", "gpu_type", "consolidated", "job_type", "scale_factor", "partner_job_type"],
        na_position="first",
        kind="mergesort",
    )
    return frame.reset_index(drop=True)


def _gavel_csv_rows(gavel: Path, prefix: str, measurement_set: str) -> list[pd.DataFrame]:
    iso = _read_csv(
        gavel / f"gavel_{prefix}_isolated_throughputs.csv",
        ["gpu_type", "consolidated", "job_type", "model", "batch_size", "scale_factor", "steps_per_sec"],
    )
    pairs = _read_csv(
        gavel / f"gavel_{prefix}_colocated_pairs.csv",
        [
            "gpu_type",
            "consolidated",
            "job_a",
            "scale_factor_a",
            "job_b",
            "scale_factor_b",
            "steps_per_sec_a_colocated",
            "steps_per_sec_a_isolated",
            "norm_throughput_a",
            "feasible",
        ],
    )
    iso_rows = pd.DataFrame(
        {
            "measurement_set": measurement_set,
            "gpu_type": iso["gpu_type"].str.lower(),
            "consolidated": iso["consolidated"].astype(int) == 1,
            "job_type": iso["job_type"],
            "model_family": iso["model"],
            "batch_size": iso["batch_size"],
            "scale_factor": iso["scale_factor"],
            "partner_job_type": None,
            "partner_scale_factor": pd.NA,
            "steps_per_s": iso["steps_per_sec"],
            "isolated_steps_per_s": iso["steps_per_sec"],
            "normalized_throughput": np.where(iso["steps_per_sec"] > 0, 1.0, 0.0),
            "feasible": iso["steps_per_sec"] > 0,
        }
    )
    parsed = pairs["job_a"].map(parse_job_type)
    feasible = (pairs["feasible"].astype(int) == 1) & (pairs["steps_per_sec_a_colocated"] > 0)
    pair_rows = pd.DataFrame(
        {
            "measurement_set": measurement_set,
            "gpu_type": pairs["gpu_type"].str.lower(),
            "consolidated": pairs["consolidated"].astype(int) == 1,
            "job_type": pairs["job_a"],
            "model_family": parsed.map(lambda p: p[0]),
            "batch_size": parsed.map(lambda p: p[1]),
            "scale_factor": pairs["scale_factor_a"],
            "partner_job_type": pairs["job_b"],
            "partner_scale_factor": pairs["scale_factor_b"],
            "steps_per_s": pairs["steps_per_sec_a_colocated"].where(feasible, 0.0),
            "isolated_steps_per_s": pairs["steps_per_sec_a_isolated"],
            "normalized_throughput": pairs["norm_throughput_a"].where(feasible, 0.0),
            "feasible": feasible,
        }
    )
    return [iso_rows, pair_rows]


def _oracle_rows(path: Path) -> pd.DataFrame:
    try:
        raw = json.loads(_require(path).read_text())
    except json.JSONDecodeError as exc:
        raise PerfDataError(f"{path}: not valid JSON ({exc})") from None
    rows = []
    for gpu_type, jobs in raw.items():
        for job_type, cells in jobs.items():
            if "null" not in cells:
                raise PerfDataError(f"{path}: {gpu_type}/{job_type}: no isolated ('null') entry")
            family, batch = parse_job_type(job_type)
            iso = float(cells["null"])
            base = dict(
                measurement_set="oracle",
                gpu_type=gpu_type.lower(),
                consolidated=True,
                job_type=job_type,
                model_family=family,
                batch_size=batch,
                scale_factor=1,
                isolated_steps_per_s=iso,
            )
            rows.append(
                dict(
                    base,
                    partner_job_type=None,
                    partner_scale_factor=pd.NA,
                    steps_per_s=iso,
                    normalized_throughput=1.0 if iso > 0 else 0.0,
                    feasible=iso > 0,
                )
            )
            for partner, value in cells.items():
                if partner == "null":
                    continue
                if not (isinstance(value, list) and len(value) == 2):
                    raise PerfDataError(
                        f"{path}: {gpu_type}/{job_type}/{partner}: expected [this, other], got {value!r}"
                    )
                mine = float(value[0])
                feasible = mine > 0 and iso > 0
                rows.append(
                    dict(
                        base,
                        partner_job_type=partner,
                        partner_scale_factor=1,
                        steps_per_s=mine if feasible else 0.0,
                        normalized_throughput=mine / iso if feasible else 0.0,
                        feasible=feasible,
                    )
                )
    return pd.DataFrame(rows)


def throughput_from_files(
    data_dir: Path | str | None = None, measurement_sets=("simulation", "physical", "oracle")
) -> pd.DataFrame:
    """marts.gpu_throughput built from DATA_DIR/interference/gavel (sim + physical CSVs, oracle JSON)."""
    gavel = Path(data_dir or configured_data_dir()) / GAVEL_DIR
    parts: list[pd.DataFrame] = []
    if "simulation" in measurement_sets:
        parts += _gavel_csv_rows(gavel, "sim", "simulation")
    if "physical" in measurement_sets:
        parts += _gavel_csv_rows(gavel, "phys", "physical")
    if "oracle" in measurement_sets:
        parts.append(_oracle_rows(gavel / "oracle_throughputs.json"))
    return _finish_throughput(pd.concat([p for p in parts if len(p)], ignore_index=True))


def _read_mart(table: str, db_path) -> pd.DataFrame:
    with reader(db_path) as con:
        return con.execute(f"SELECT * FROM {table}").df()


def load_throughput(db_path: Path | str | None = None, fallback: bool = True, data_dir=None) -> pd.DataFrame:
    """marts.gpu_throughput from the warehouse; when the warehouse or the mart is missing and `fallback`, the same
    frame from the files (see module docstring)."""
    try:
        frame = _read_mart("marts.gpu_throughput", db_path)
    except Exception as exc:  # noqa: BLE001 - missing file, missing table (duckdb CatalogException), lock
        if not fallback or not _is_missing(exc):
            raise
        return throughput_from_files(data_dir)
    frame["gpu_type"] = frame["gpu_type"].str.lower()
    for column in THROUGHPUT_COLUMNS:
        if column not in frame.columns:
            raise PerfDataError(f"marts.gpu_throughput: missing column {column!r}")
    return _finish_throughput(frame)


def _is_missing(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, FileNotFoundError) or "does not exist" in text or "catalog" in text


# --- energy ----------------------------------------------------------------------------------------------------


def energy_profiles_from_files(data_dir: Path | str | None = None) -> pd.DataFrame:
    """marts.gpu_energy_profiles built from DATA_DIR/energy/zeus/zeus_power_limit_sweep.csv."""
    path = Path(data_dir or configured_data_dir()) / ZEUS_SWEEP
    sweep = _read_csv(
        path,
        [
            "gpu_type",
            "dataset",
            "network",
            "batch_size",
            "optimizer",
            "power_limit_w",
            "time_per_epoch_s",
            "avg_power_w",
            "energy_per_epoch_j",
        ],
    )
    bad = sweep[(sweep["time_per_epoch_s"] <= 0) | (sweep["avg_power_w"] <= 0) | (sweep["power_limit_w"] <= 0)]
    if len(bad):
        row = int(bad.index[0]) + 2
        raise PerfDataError(f"{path}: row {row}: non-positive time/power/limit")
    return derive_energy_columns(sweep)


def derive_energy_columns(sweep: pd.DataFrame) -> pd.DataFrame:
    """Add the mart's derived columns (workload, max limit, energy-optimal limit, slowdown, saving)."""
    frame = sweep.copy()
    frame["gpu_type"] = frame["gpu_type"].str.lower()
    frame["workload"] = frame["network"] + "/" + frame["dataset"]
    if "energy_per_epoch_j" not in frame:
        frame["energy_per_epoch_j"] = frame["time_per_epoch_s"] * frame["avg_power_w"]
    key = ["gpu_type", "workload", "batch_size", "optimizer"]
    grouped = frame.groupby(key, sort=False)
    frame["max_power_limit_w"] = grouped["power_limit_w"].transform("max")
    best = frame.loc[grouped["energy_per_epoch_j"].idxmin(), key + ["power_limit_w"]].rename(
        columns={"power_limit_w": "energy_optimal_limit_w"}
    )
    frame = frame.merge(best, on=key, how="left")
    at_max = frame[frame["power_limit_w"] == frame["max_power_limit_w"]][
        key + ["time_per_epoch_s", "energy_per_epoch_j"]
    ]
    at_opt = frame[frame["power_limit_w"] == frame["energy_optimal_limit_w"]][
        key + ["time_per_epoch_s", "energy_per_epoch_j"]
    ]
    ref = at_max.merge(at_opt, on=key, suffixes=("_max", "_opt"))
    ref["slowdown_at_optimal"] = ref["time_per_epoch_s_opt"] / ref["time_per_epoch_s_max"] - 1.0
    ref["energy_saving_at_optimal"] = 1.0 - ref["energy_per_epoch_j_opt"] / ref["energy_per_epoch_j_max"]
    frame = frame.merge(ref[key + ["slowdown_at_optimal", "energy_saving_at_optimal"]], on=key, how="left")
    frame["is_energy_optimal"] = frame["power_limit_w"] == frame["energy_optimal_limit_w"]
    frame["batch_size"] = frame["batch_size"].astype("int64")
    for column in ("power_limit_w", "max_power_limit_w", "energy_optimal_limit_w"):
        frame[column] = frame[column].astype("float64")
    frame = frame[ENERGY_COLUMNS].sort_values(key + ["power_limit_w"], kind="mergesort")
    return frame.reset_index(drop=True)


def load_energy_profiles(db_path: Path | str | None = None, fallback: bool = True, data_dir=None) -> pd.DataFrame:
    """marts.gpu_energy_profiles (gpu_type lower-cased); file fallback as for `load_throughput`."""
    try:
        frame = _read_mart("marts.gpu_energy_profiles", db_path)
    except Exception as exc:  # noqa: BLE001
        if not fallback or not _is_missing(exc):
            raise
        return energy_profiles_from_files(data_dir)
    frame["gpu_type"] = frame["gpu_type"].str.lower()
    for column in ENERGY_COLUMNS:
        if column not in frame.columns:
            raise PerfDataError(f"marts.gpu_energy_profiles: missing column {column!r}")
    return frame[ENERGY_COLUMNS].reset_index(drop=True)
