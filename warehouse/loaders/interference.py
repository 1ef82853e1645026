"""Gavel (OSDI'20) throughputs per GPU type: isolated and pairwise co-located (space-sharing).

Tables, each row tagged with `measurement_set`:
- raw.gavel_isolated(measurement_set, gpu_type, consolidated, job_type, model_family, batch_size, scale_factor,
  steps_per_s)
- raw.gavel_colocated(measurement_set, gpu_type, consolidated, job_a, scale_factor_a, job_b, scale_factor_b,
  steps_per_s_a_colocated, steps_per_s_b_colocated, steps_per_s_a_isolated, steps_per_s_b_isolated,
  norm_throughput_a, norm_throughput_b, feasible)

Sources of rows:
- simulation: gavel_sim_isolated_throughputs.csv, gavel_sim_colocated_pairs.csv (flattened simulation_throughputs.json)
- physical: gavel_phys_*.csv (flattened physical_cluster_throughputs.json)
- oracle: oracle_throughputs.json, parsed here: {gpu: {job: {"null": isolated, partner: [this, partner]}}}; job keys
  are either plain job types ("ResNet-18 (batch size 64)") or the tuple form "('ResNet-18 (batch size 64)', 1)".
The raw simulation/physical JSON files are not loaded: the derived CSVs hold the same values.
Throughput unit: training steps (iterations) per second of the whole job.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from warehouse.db import Batch, Rejection
from warehouse.loaders.base import Column, LoadError, Source, _sniff_text
from warehouse.loaders.cluster import batch_id, glob_files, read_csv_batch, with_constants

SOURCE = "gavel"
GAVEL_DIR = "interference/gavel"
ISOLATED_TABLE = "raw.gavel_isolated"
COLOCATED_TABLE = "raw.gavel_colocated"
MEASUREMENT_SETS = {"sim": "simulation", "phys": "physical"}
JOB_TYPE = re.compile(r"^(?P<model>.*?) \(batch size (?P<batch>\d+)\)$")

ISOLATED_COLUMNS = [
    Column("gpu_type", "str"),
    Column("consolidated", "bool"),
    Column("job_type", "str"),
    Column("model", "str", rename="model_family"),
    Column("batch_size", "int", nullable=True, min_value=1),  # NULL for A3C, CycleGAN
    Column("scale_factor", "int", min_value=1),
    Column("steps_per_sec", "float", min_value=0, rename="steps_per_s"),  # 0: not runnable
]
ISOLATED_KEY = ["gpu_type", "consolidated", "job_type", "scale_factor"]
COLOCATED_COLUMNS = [
    Column("gpu_type", "str"),
    Column("consolidated", "bool"),
    Column("job_a", "str"),
    Column("scale_factor_a", "int", min_value=1),
    Column("job_b", "str"),
    Column("scale_factor_b", "int", min_value=1),
    Column("steps_per_sec_a_colocated", "float", min_value=0, rename="steps_per_s_a_colocated"),
    Column("steps_per_sec_b_colocated", "float", min_value=0, rename="steps_per_s_b_colocated"),
    Column("steps_per_sec_a_isolated", "float", min_value=0, rename="steps_per_s_a_isolated"),
    Column("steps_per_sec_b_isolated", "float", min_value=0, rename="steps_per_s_b_isolated"),
    # NULL where the isolated throughput is 0 (not runnable alone)
    Column("norm_throughput_a", "float", nullable=True, min_value=0),
    Column("norm_throughput_b", "float", nullable=True, min_value=0),
    Column("feasible", "bool"),
]
COLOCATED_KEY = ["gpu_type", "consolidated", "job_a", "scale_factor_a", "job_b", "scale_factor_b"]
ORACLE_FILE = "oracle_throughputs.json"


def _measurement_set(path: Path) -> str:
    part = path.stem.split("_")[1] if path.stem.startswith("gavel_") else ""
    if part not in MEASUREMENT_SETS:
        raise LoadError(path, "file name is not gavel_{sim,phys}_...csv")
    return MEASUREMENT_SETS[part]


def split_job_type(job_type: str) -> tuple[str, int | None]:
    """'ResNet-18 (batch size 64)' -> ('ResNet-18', 64); 'A3C' -> ('A3C', None)."""
    match = JOB_TYPE.match(job_type)
    if match:
        return match["model"], int(match["batch"])
    return job_type, None


def parse_job_key(key: str) -> tuple[str, int]:
    """A Gavel job key: "('ResNet-18 (batch size 64)', 1)" -> (job type, scale factor); a plain job type -> scale 1."""
    text = key.strip()
    if text.startswith("("):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"job key {key!r} is not a (job type, scale factor) tuple") from None
        if (
            not isinstance(value, tuple)
            or len(value) != 2
            or not isinstance(value[0], str)
            or not isinstance(value[1], int)
            or value[1] < 1
        ):
            raise ValueError(f"job key {key!r} is not a (job type, scale factor) tuple")
        return value[0], value[1]
    if not text:
        raise ValueError("empty job key")
    return text, 1


def _worker(worker_type: str) -> tuple[str, bool]:
    gpu, _, rest = worker_type.partition("_")
    return gpu, rest != "unconsolidated"


def _throughput(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def parse_oracle(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, list[Rejection], list[Rejection]]:
    """oracle_throughputs.json -> (isolated rows, pair rows, isolated rejections, pair rejections). Bad entries are
    quarantined with the JSON path of the entry (worker/job/partner) as `field`; a file that is not a JSON object
    raises LoadError."""
    path = Path(path)
    text = _sniff_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoadError(path, f"malformed JSON: {exc.msg} (column {exc.colno})", row=exc.lineno) from None
    if not isinstance(data, dict) or not data:
        raise LoadError(path, "expected a JSON object {gpu type: {job: {...}}}")
    iso_rejections: list[Rejection] = []
    pair_rejections: list[Rejection] = []

    def reject(field: str, value: object, reason: str, pair: bool = False) -> None:
        target = pair_rejections if pair else iso_rejections
        target.append(Rejection(reason, str(path), None, field, json.dumps(value, default=str)[:500]))

    isolated: list[dict] = []
    pairs: list[dict] = []
    for worker_type, jobs in data.items():
        gpu, consolidated = _worker(worker_type)
        if not isinstance(jobs, dict):
            reject(worker_type, jobs, "expected an object of jobs")
            continue
        iso: dict[tuple[str, int], float] = {}
        for job_key, entry in jobs.items():
            field = f"{worker_type}/{job_key}"
            try:
                job, scale = parse_job_key(job_key)
            except ValueError as exc:
                reject(field, job_key, str(exc))
                continue
            if not isinstance(entry, dict):
                reject(field, entry, "expected an object with 'null' and partner entries")
                continue
            value = _throughput(entry.get("null"))
            if value is None:
                reject(f"{field}/null", entry.get("null"), "isolated throughput missing, negative or not a number")
                continue
            if (job, scale) in iso:
                reject(field, job_key, "duplicate job key")
                continue
            iso[(job, scale)] = value
            model, batch = split_job_type(job)
            isolated.append(
                dict(
                    gpu_type=gpu,
                    consolidated=consolidated,
                    job_type=job,
                    model_family=model,
                    batch_size=batch,
                    scale_factor=scale,
                    steps_per_s=value,
                )
            )
        for job_key, entry in jobs.items():
            if not isinstance(entry, dict):
                continue
            try:
                job, scale = parse_job_key(job_key)
            except ValueError:
                continue
            if (job, scale) not in iso:
                continue
            for partner_key, values in entry.items():
                if partner_key == "null":
                    continue
                field = f"{worker_type}/{job_key}/{partner_key}"
                try:
                    partner, partner_scale = parse_job_key(partner_key)
                except ValueError as exc:
                    reject(field, partner_key, str(exc), pair=True)
                    continue
                if not isinstance(values, list) or len(values) != 2:
                    reject(field, values, "expected [steps_per_s this job, steps_per_s partner]", pair=True)
                    continue
                a, b = _throughput(values[0]), _throughput(values[1])
                if a is None or b is None:
                    reject(field, values, "co-located throughput negative or not a number", pair=True)
                    continue
                if (partner, partner_scale) not in iso:
                    reject(field, partner_key, "partner job has no isolated throughput on this GPU type", pair=True)
                    continue
                iso_a, iso_b = iso[(job, scale)], iso[(partner, partner_scale)]
                pairs.append(
                    dict(
                        gpu_type=gpu,
                        consolidated=consolidated,
                        job_a=job,
                        scale_factor_a=scale,
                        job_b=partner,
                        scale_factor_b=partner_scale,
                        steps_per_s_a_colocated=a,
                        steps_per_s_b_colocated=b,
                        steps_per_s_a_isolated=iso_a,
                        steps_per_s_b_isolated=iso_b,
                        norm_throughput_a=a / iso_a if iso_a > 0 else None,
                        norm_throughput_b=b / iso_b if iso_b > 0 else None,
                        feasible=not (a == 0 and b == 0),
                    )
                )
    iso_frame = _typed(pd.DataFrame(isolated, columns=[c.rename or c.name for c in ISOLATED_COLUMNS]), ISOLATED_COLUMNS)
    pair_frame = _typed(pd.DataFrame(pairs, columns=[c.rename or c.name for c in COLOCATED_COLUMNS]), COLOCATED_COLUMNS)
    return iso_frame, pair_frame, iso_rejections, pair_rejections


def _typed(frame: pd.DataFrame, columns: list[Column]) -> pd.DataFrame:
    dtypes = {"int": "Int64", "float": "Float64", "bool": "boolean", "str": "string"}
    out = pd.DataFrame(index=frame.index)
    for col in columns:
        name = col.rename or col.name
        values = frame[name]
        if col.kind == "float":
            out[name] = pd.to_numeric(values).astype("float64").astype("Float64")  # None -> NaN -> <NA>
        else:
            out[name] = values.astype(dtypes[col.kind])
    return out


def _files(data_dir: Path) -> list[Path]:
    return glob_files(
        data_dir,
        [
            f"{GAVEL_DIR}/gavel_*_isolated_throughputs.csv",
            f"{GAVEL_DIR}/gavel_*_colocated_pairs.csv",
            f"{GAVEL_DIR}/{ORACLE_FILE}",
        ],
    )


def _batches(data_dir: Path) -> Iterator[Batch]:
    for path in _files(data_dir):
        if path.name == ORACLE_FILE:
            iso, pairs, iso_rej, pair_rej = parse_oracle(path)
            key = batch_id(SOURCE, path, data_dir)
            yield Batch(ISOLATED_TABLE, key, SOURCE, with_constants(iso, {"measurement_set": "oracle"}), iso_rej)
            yield Batch(COLOCATED_TABLE, key, SOURCE, with_constants(pairs, {"measurement_set": "oracle"}), pair_rej)
            continue
        measurement = _measurement_set(path)
        if path.name.endswith("_isolated_throughputs.csv"):
            table, columns, key_cols = ISOLATED_TABLE, ISOLATED_COLUMNS, ISOLATED_KEY
        else:
            table, columns, key_cols = COLOCATED_TABLE, COLOCATED_COLUMNS, COLOCATED_KEY
        yield read_csv_batch(
            SOURCE,
            table,
            path,
            data_dir,
            columns,
            key=key_cols,
            constants=lambda _p, m=measurement: {"measurement_set": m},
        )


gavel = Source(
    "gavel",
    "interference",
    "Gavel (OSDI'20) isolated and co-located throughputs, K80/P100/V100, simulation/physical/oracle sets "
    "-> raw.gavel_isolated, raw.gavel_colocated",
    _batches,
    _files,
)

SOURCES: list[Source] = [gavel]
