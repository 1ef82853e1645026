"""Model registry and forecast store in the warehouse, plus the model factory by name.

Tables (created idempotently through `warehouse.db.writer`):

* `model.registry(model_name, target, version, trained_at, params JSON, metrics JSON, artifact_path, status,
  created_at)`: one row per trained version. `trained_at` is the training-data cut-off (the first hour the model
  did **not** see), never the wall clock, so `latest_good(..., as_of=T)` only returns models that could have
  existed at T when history is replayed. `created_at` is the wall clock of registration (bookkeeping only).
  `status` ∈ good|failed; failed trainings are recorded with their error in `metrics`.
* `forecast.forecasts(issued_at, target_time, region, target, p10, p50, p90, model, model_version, is_fallback,
  fallback_reason)`: written per (issued_at, region, target, model) by delete-insert in one transaction, so
  issuing the same forecast again replaces it (idempotent).

Artifacts live under `MODELS_DIR` (default `var/models`) as `<model>/<target>/<version>/`, with `artifact.json`
naming the class, the storage format (the model's own `save`/`load`, else pickle) and a SHA-256 per file; a
missing or altered file raises `ArtifactError` on load.
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
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from warehouse.config import var_dir

DDL = """
CREATE SCHEMA IF NOT EXISTS model;
CREATE SCHEMA IF NOT EXISTS forecast;
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
CREATE TABLE IF NOT EXISTS forecast.forecasts (
    issued_at TIMESTAMPTZ NOT NULL,
    target_time TIMESTAMPTZ NOT NULL,
    region VARCHAR NOT NULL,
    target VARCHAR NOT NULL,
    p10 DOUBLE,
    p50 DOUBLE,
    p90 DOUBLE,
    model VARCHAR NOT NULL,
    model_version VARCHAR,
    is_fallback BOOLEAN NOT NULL DEFAULT FALSE,
    fallback_reason VARCHAR,
    PRIMARY KEY (issued_at, target_time, region, target, model)
);
"""
FORECAST_COLUMNS = (
    "issued_at",
    "target_time",
    "region",
    "target",
    "p10",
    "p50",
    "p90",
    "model",
    "model_version",
    "is_fallback",
    "fallback_reason",
)
MANIFEST = "artifact.json"


class ArtifactError(RuntimeError):
    """A model artifact is missing, altered or unreadable."""


class ModelUnavailable(RuntimeError):
    """A model name whose implementation is not installed / not written yet."""


# ------------------------------------------------------------------------------------------------ model factory

_FACTORIES: dict[str, Callable[..., Any]] = {}


def register_factory(name: str, factory: Callable[..., Any]) -> None:
    """Make `make_model(name, ...)` build models with `factory(target=..., tiny=..., **kwargs)`."""
    _FACTORIES[name] = factory


def _prophet(target: str = "carbon_intensity", tiny: bool = False, **kwargs):
    from forecasting.models.prophet_model import ProphetForecaster

    horizon = kwargs.pop("horizon", None)
    if horizon and horizon > kwargs.get("max_horizon", 168):
        kwargs["max_horizon"] = int(horizon)
    if tiny:
        kwargs.setdefault("history_days", 120)
        kwargs.setdefault("max_horizon", 96)
    return ProphetForecaster(**kwargs)


def _tft(target: str = "carbon_intensity", tiny: bool = False, settings=None, **kwargs):
    from forecasting.models.tft_model import TFTForecaster, TFTSettings

    horizon = kwargs.pop("horizon", None)
    if settings is None:
        settings = TFTSettings.tiny(**kwargs) if tiny else TFTSettings.full(**kwargs)
    if horizon and horizon > settings.max_prediction_length:
        settings.max_prediction_length = int(horizon)
    return TFTForecaster(settings)


register_factory("prophet", _prophet)
register_factory("tft", _tft)

# The other package's models (forecasting.models.make_model) by name; looked up lazily.
PACKAGE_MODELS = ("naive-24", "naive-168", "lgbm", "mix", "ensemble")
ALL_MODELS = PACKAGE_MODELS + ("prophet", "tft")


def make_model(name: str, target: str = "carbon_intensity", tiny: bool = False, **kwargs):
    """A fresh, unfitted forecaster by name: prophet, tft (here) or naive-24/naive-168/lgbm/mix/ensemble
    (`forecasting.models.make_model`). Raises ModelUnavailable when the implementation is not there."""
    if name in _FACTORIES:
        return _FACTORIES[name](target=target, tiny=tiny, **kwargs)
    try:
        from forecasting import models as package
    except ImportError as exc:  # the package or one of its modules is missing
        raise ModelUnavailable(f"model {name!r}: forecasting.models is not importable ({exc})") from exc
    factory = getattr(package, "make_model", None)
    if factory is None:
        raise ModelUnavailable(f"model {name!r}: forecasting.models has no make_model")
    import inspect

    try:
        if "tiny" in inspect.signature(factory).parameters:
            kwargs["tiny"] = tiny
        return factory(name, target, **kwargs)
    except KeyError as exc:
        raise ModelUnavailable(f"unknown model {name!r}; known here: {', '.join(ALL_MODELS)}") from exc
    except ImportError as exc:
        raise ModelUnavailable(f"model {name!r} is not available: {exc}") from exc


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


def load_artifact(directory: Path | str):
    """Read a model written by `save_artifact`; ArtifactError when anything is missing or altered."""
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
    model_name: str
    target: str
    version: str
    trained_at: pd.Timestamp
    params: dict
    metrics: dict
    artifact_path: str | None
    status: str
    created_at: pd.Timestamp

    def load(self):
        if self.status != "good":
            raise ArtifactError(f"{self.model_name}/{self.target} {self.version} has status {self.status}")
        if not self.artifact_path:
            raise ArtifactError(f"{self.model_name}/{self.target} {self.version} has no artifact")
        return load_artifact(self.artifact_path)

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


def _utc(value) -> pd.Timestamp:
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


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
    con.execute(DDL)


def _has_table(con, schema: str, name: str) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
            [schema, name],
        ).fetchone()[0]
    )


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
    from warehouse.db import writer

    trained_at = _utc(trained_at)
    created = _utc(created_at) if created_at is not None else pd.Timestamp.now(tz="UTC")
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
    return ModelRecord(model_name, target, version, trained_at, json.loads(_dumps(params)),
                       json.loads(_dumps(metrics)), artifact, status, created)


def _records(frame: pd.DataFrame) -> list[ModelRecord]:
    out = []
    for row in frame.itertuples(index=False):
        out.append(
            ModelRecord(
                model_name=row.model_name,
                target=row.target,
                version=row.version,
                trained_at=_utc(row.trained_at),
                params=json.loads(row.params) if row.params else {},
                metrics=json.loads(row.metrics) if row.metrics else {},
                artifact_path=row.artifact_path,
                status=row.status,
                created_at=_utc(row.created_at),
            )
        )
    return out


def list_models(model_name: str | None = None, target: str | None = None, status: str | None = None,
                db_path=None) -> list[ModelRecord]:
    """Registry rows, newest cut-off first."""
    from warehouse.db import reader

    where, params = [], []
    for col, value in (("model_name", model_name), ("target", target), ("status", status)):
        if value is not None:
            where.append(f"{col} = ?")
            params.append(value)
    sql = "SELECT * FROM model.registry" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY trained_at DESC, created_at DESC, version DESC"
    try:
        with reader(db_path) as con:
            if not _has_table(con, "model", "registry"):
                return []
            frame = con.execute(sql, params).df()
    except FileNotFoundError:
        return []
    return _records(frame)


def latest_good(model_name: str, target: str, as_of=None, db_path=None) -> ModelRecord | None:
    """The newest good version (by training cut-off, then registration time); with `as_of`, only versions whose
    cut-off is at or before `as_of` (a replay must not use a model that has seen its future)."""
    for record in list_models(model_name, target, "good", db_path):
        if as_of is None or record.trained_at <= _utc(as_of):
            return record
    return None


def get_version(model_name: str, target: str, version: str, db_path=None) -> ModelRecord | None:
    for record in list_models(model_name, target, None, db_path):
        if record.version == version:
            return record
    return None


# ------------------------------------------------------------------------------------------------ forecast store

def _forecast_frame(frame: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in ("issued_at", "target_time", "region", "target", "p10", "p50", "p90", "model")
               if c not in frame.columns]
    if missing:
        raise ValueError(f"forecast rows lack column(s) {missing}")
    out = frame.copy()
    if "model_version" not in out:
        out["model_version"] = None
    if "is_fallback" not in out:
        out["is_fallback"] = False
    if "fallback_reason" not in out:
        out["fallback_reason"] = None
    out = out[list(FORECAST_COLUMNS)].copy()
    for col in ("issued_at", "target_time"):
        out[col] = pd.to_datetime(out[col], utc=True).dt.as_unit("us")
    for col in ("p10", "p50", "p90"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    for col in ("region", "target", "model"):
        out[col] = out[col].astype(str)
    out["model_version"] = out["model_version"].astype(object).where(out["model_version"].notna(), None)
    out["fallback_reason"] = out["fallback_reason"].astype(object).where(out["fallback_reason"].notna(), None)
    out["is_fallback"] = out["is_fallback"].fillna(False).astype(bool)
    if out.duplicated(["issued_at", "target_time", "region", "target", "model"]).any():
        raise ValueError("forecast rows repeat (issued_at, target_time, region, target, model)")
    return out


def write_forecasts(frame: pd.DataFrame, db_path=None, con=None) -> int:
    """Replace the rows of every (issued_at, region, target, model) present in `frame` with `frame`'s rows,
    in one transaction. Returns the number of rows written."""
    rows = _forecast_frame(frame)
    if rows.empty:
        return 0
    if con is None:
        from warehouse.db import writer

        with writer(db_path) as own:
            return write_forecasts(rows, con=own)
    ensure_tables(con)
    keys = rows[["issued_at", "region", "target", "model"]].drop_duplicates()
    con.execute("BEGIN TRANSACTION")
    try:
        con.register("_forecast_keys", keys)
        con.register("_forecast_rows", rows)
        con.execute(
            "DELETE FROM forecast.forecasts AS f USING _forecast_keys AS k "
            "WHERE f.issued_at = k.issued_at AND f.region = k.region AND f.target = k.target AND f.model = k.model"
        )
        con.execute(
            f"INSERT INTO forecast.forecasts ({', '.join(FORECAST_COLUMNS)}) "
            f"SELECT {', '.join(FORECAST_COLUMNS)} FROM _forecast_rows"
        )
        con.unregister("_forecast_keys")
        con.unregister("_forecast_rows")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def read_forecasts(
    model: str | None = None,
    target: str | None = None,
    regions: Iterable[str] | None = None,
    issued_at=None,
    issued_before=None,
    target_from=None,
    target_until=None,
    include_fallback: bool = True,
    db_path=None,
) -> pd.DataFrame:
    """Stored forecast rows, ordered by model, target, region, issued_at, target_time."""
    from warehouse.db import reader

    where, params = [], []
    if model is not None:
        where.append("model = ?")
        params.append(model)
    if target is not None:
        where.append("target = ?")
        params.append(target)
    if regions is not None:
        regions = list(regions)
        where.append(f"region IN ({', '.join('?' for _ in regions)})")
        params += regions
    for col, op, value in (
        ("issued_at", "=", issued_at),
        ("issued_at", "<", issued_before),
        ("target_time", ">=", target_from),
        ("target_time", "<", target_until),
    ):
        if value is not None:
            where.append(f"{col} {op} ?")
            params.append(_utc(value).to_pydatetime())
    if not include_fallback:
        where.append("NOT is_fallback")
    sql = f"SELECT {', '.join(FORECAST_COLUMNS)} FROM forecast.forecasts"
    sql += (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY model, target, region, issued_at, target_time"
    empty = pd.DataFrame(columns=list(FORECAST_COLUMNS))
    try:
        with reader(db_path) as con:
            if not _has_table(con, "forecast", "forecasts"):
                return empty
            frame = con.execute(sql, params).df()
    except FileNotFoundError:
        return empty
    for col in ("issued_at", "target_time"):
        frame[col] = pd.to_datetime(frame[col], utc=True).dt.as_unit("us")
    return frame


def last_good_forecast(model: str, target: str, regions: Iterable[str], before, target_from, target_until,
                       db_path=None) -> pd.DataFrame:
    """For each region and target hour in [target_from, target_until): the non-fallback row of `model` from the
    most recent issue strictly before `before` that covers that hour."""
    rows = read_forecasts(model, target, regions, issued_before=before, target_from=target_from,
                          target_until=target_until, include_fallback=False, db_path=db_path)
    if rows.empty:
        return rows
    rows = rows.sort_values(["region", "target_time", "issued_at"])
    return rows.groupby(["region", "target_time"], sort=True).tail(1).reset_index(drop=True)
