"""Model registry: versioned model artifacts on disk and their rows in `model.registry`.

`model.registry(model_name, target, version, trained_at, params JSON, metrics JSON, artifact_path, status,
created_at)` holds one row per trained version. `trained_at` is the training-data cut-off (the first hour the model
did **not** see), never the wall clock, so `latest_good(..., as_of=T)` only returns models that could have existed at
T when history is replayed. `created_at` is the wall clock of registration (bookkeeping only). `status` is good or
failed; a failed training is recorded with its error in `metrics`.

Artifacts live under `MODELS_DIR` (default `var/models`) as `<model>/<target>/<version>/`, with `artifact.json`
naming the class, the storage format (the model's own `save`/`load`, else pickle) and a SHA-256 per file; a missing
or altered file raises `ArtifactError` on load. Forecasters and the scheduler's predictor and power model all
register here.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc
from warehouse.config import var_dir
from warehouse.db import create_tables, reader, table_exists, writer

DDL = """
CREATE SCHEMA IF NOT EXISTS model;
CREATE TABLE IF NOT EXISTS model.registry (
    model_name VARCHAR NOT NULL,
    target VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    trained_at TIMESTAMPTZ NOT NULL,
    params JSON,
    metrics JSON,
    artifact_path VARCHAR,
    status VARCHAR NOT NULL CHECK (status IN ('good', 'failed')),
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (model_name, target, version)
);
"""
MANIFEST = "artifact.json"


class ArtifactError(RuntimeError):
    """A model artifact is missing, altered or unreadable."""


# ------------------------------------------------------------------------------------------------ artifacts


def models_dir() -> Path:
    """Artifact root: MODELS_DIR, default var/models."""
    raw = os.environ.get("MODELS_DIR")
    path = Path(raw) if raw else var_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_artifact(model, directory: Path | str) -> Path:
    """Write `model` into `directory` (its own `save` when it has one, else pickle) plus the manifest."""
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    cls = type(model)
    if callable(getattr(model, "save", None)) and callable(getattr(cls, "load", None)):
        model.save(directory)
        fmt = "save"
    else:
        with open(directory / "model.pkl", "wb") as handle:
            pickle.dump(model, handle, protocol=pickle.HIGHEST_PROTOCOL)
        fmt = "pickle"
    files = {p.name: _sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"class": f"{cls.__module__}:{cls.__qualname__}", "format": fmt, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return directory


def load_artifact(directory: Path | str, loader=None):
    """Read a model written by `save_artifact`; ArtifactError when anything is missing or altered. `loader`
    (directory -> model), when given, reads a "save"-format artifact instead of the class named in the manifest,
    e.g. a lighter runtime of the same files; the checksums are verified either way."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"artifact {directory}: no readable {MANIFEST} ({exc})") from exc
    for name, digest in manifest.get("files", {}).items():
        path = directory / name
        if not path.exists():
            raise ArtifactError(f"artifact {directory}: file {name} is missing")
        if _sha256(path) != digest:
            raise ArtifactError(f"artifact {directory}: file {name} is corrupted (checksum mismatch)")
    try:
        if manifest["format"] == "pickle":
            with open(directory / "model.pkl", "rb") as handle:
                return pickle.load(handle)
        if loader is not None:
            return loader(directory)
        module_name, qualname = manifest["class"].split(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj.load(directory)
    except ArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to rebuild the model is an artifact problem
        raise ArtifactError(f"artifact {directory}: cannot load ({type(exc).__name__}: {exc})") from exc


# ------------------------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class ModelRecord:
    """One row of `model.registry`; `load()` reads its artifact."""

    model_name: str
    target: str
    version: str
    trained_at: pd.Timestamp
    params: dict
    metrics: dict
    artifact_path: str | None
    status: str
    created_at: pd.Timestamp

    def load(self, loader=None):
        """The model of this version (`load_artifact`, with its optional `loader`)."""
        if self.status != "good":
            raise ArtifactError(f"{self.model_name}/{self.target} {self.version} has status {self.status}")
        if not self.artifact_path:
            raise ArtifactError(f"{self.model_name}/{self.target} {self.version} has no artifact")
        return load_artifact(self.artifact_path, loader)

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "target": self.target,
            "version": self.version,
            "trained_at": self.trained_at.isoformat(),
            "params": self.params,
            "metrics": self.metrics,
            "artifact_path": self.artifact_path,
            "status": self.status,
            "created_at": self.created_at.isoformat(),
        }


# The registry's own JSON rules, not common.jsonutil: these are the bytes already stored in model.registry
# (timestamps as isoformat with +00:00, non-ASCII escaped, repr() of unknown objects); canonical_json writes others.
def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, (pd.Timestamp,)):
        return value.isoformat()
    if isinstance(value, (np.ndarray,)):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _clean(value):
    """JSON-safe: NaN/inf → null (DuckDB's JSON type rejects NaN)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _dumps(value) -> str:
    return json.dumps(_clean(json.loads(json.dumps(value or {}, default=_json_default))), sort_keys=True)


def ensure_tables(con) -> None:
    """Create `model.registry` if it does not exist (idempotent)."""
    create_tables(con, DDL)


def _version_for(con, model_name: str, target: str, trained_at: pd.Timestamp) -> str:
    stem = trained_at.strftime("%Y%m%dT%H%MZ")
    taken = {
        row[0]
        for row in con.execute(
            "SELECT version FROM model.registry WHERE model_name = ? AND target = ? AND version LIKE ?",
            [model_name, target, f"{stem}.%"],
        ).fetchall()
    }
    n = 1
    while f"{stem}.{n}" in taken:
        n += 1
    return f"{stem}.{n}"


def register_model(
    model,
    model_name: str,
    target: str,
    trained_at,
    params: dict | None = None,
    metrics: dict | None = None,
    status: str = "good",
    db_path=None,
    created_at=None,
) -> ModelRecord:
    """Allocate a version, save the artifact (for a good model) and insert the registry row, under the write lock.

    `model` may be None for a failed training (status 'failed'; put the error into `metrics`)."""
    if status not in ("good", "failed"):
        raise ValueError("status must be 'good' or 'failed'")
    if status == "good" and model is None:
        raise ValueError("a good registry entry needs a model")
    trained_at = utc(trained_at)
    created = utc(created_at) if created_at is not None else pd.Timestamp.now(tz="UTC")
    if params is None and model is not None and hasattr(model, "get_params"):
        try:
            params = model.get_params()
        except Exception:  # noqa: BLE001
            params = {}
    with writer(db_path) as con:
        ensure_tables(con)
        version = _version_for(con, model_name, target, trained_at)
        artifact = None
        if model is not None and status == "good":
            artifact = str(save_artifact(model, models_dir() / model_name / target / version).resolve())
        con.execute(
            "INSERT INTO model.registry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                model_name,
                target,
                version,
                trained_at.to_pydatetime(),
                _dumps(params),
                _dumps(metrics),
                artifact,
                status,
                created.to_pydatetime(),
            ],
        )
    return ModelRecord(
        model_name,
        target,
        version,
        trained_at,
        json.loads(_dumps(params)),
        json.loads(_dumps(metrics)),
        artifact,
        status,
        created,
    )


def _records(frame: pd.DataFrame) -> list[ModelRecord]:
    out = []
    for row in frame.itertuples(index=False):
        out.append(
            ModelRecord(
                model_name=row.model_name,
                target=row.target,
                version=row.version,
                trained_at=utc(row.trained_at),
                params=json.loads(row.params) if row.params else {},
                metrics=json.loads(row.metrics) if row.metrics else {},
                artifact_path=row.artifact_path,
                status=row.status,
                created_at=utc(row.created_at),
            )
        )
    return out


def list_models(
    model_name: str | None = None, target: str | None = None, status: str | None = None, db_path=None
) -> list[ModelRecord]:
    """Registry rows, newest cut-off first."""
    where, params = [], []
    for col, value in (("model_name", model_name), ("target", target), ("status", status)):
        if value is not None:
            where.append(f"{col} = ?")
            params.append(value)
    sql = "SELECT * FROM model.registry" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY trained_at DESC, created_at DESC, version DESC"
    try:
        with reader(db_path) as con:
            if not table_exists(con, "model.registry"):
                return []
            frame = con.execute(sql, params).df()
    except FileNotFoundError:
        return []
    return _records(frame)


def latest_good(model_name: str, target: str, as_of=None, db_path=None) -> ModelRecord | None:
    """The newest good version (by training cut-off, then registration time); with `as_of`, only versions whose
    cut-off is at or before `as_of` (a replay must not use a model that has seen its future)."""
    for record in list_models(model_name, target, "good", db_path):
        if as_of is None or record.trained_at <= utc(as_of):
            return record
    return None


def get_version(model_name: str, target: str, version: str, db_path=None) -> ModelRecord | None:
    """The registry row of one version, or None."""
    for record in list_models(model_name, target, None, db_path):
        if record.version == version:
            return record
    return None
