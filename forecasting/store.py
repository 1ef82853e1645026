"""Issued forecasts in the warehouse: `forecast.forecasts`.

`forecast.forecasts(issued_at, target_time, region, target, p10, p50, p90, model, model_version, is_fallback,
fallback_reason)` is written per (issued_at, region, target, model) by delete-insert in one transaction, so issuing
the same forecast again replaces it (idempotent). The table is created on first write through `warehouse.db.writer`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from common.timeutil import utc
from warehouse.db import create_tables, reader, table_exists, writer

DDL = """
CREATE SCHEMA IF NOT EXISTS forecast;
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
# model_version prefix of stored backtests (`python -m forecasting backtest --store`): the planner's evaluation
# prefers them.
STORED_PREFIX = "backtest-"


def ensure_tables(con) -> None:
    """Create `forecast.forecasts` if it does not exist (idempotent)."""
    create_tables(con, DDL)


def forecast_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as the rows of forecast.forecasts: the table's columns and types, optional columns defaulted.

    Raises ValueError when a required column is missing or a key repeats."""
    missing = [
        c
        for c in ("issued_at", "target_time", "region", "target", "p10", "p50", "p90", "model")
        if c not in frame.columns
    ]
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
    rows = forecast_frame(frame)
    if rows.empty:
        return 0
    if con is None:
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
            params.append(utc(value).to_pydatetime())
    if not include_fallback:
        where.append("NOT is_fallback")
    sql = f"SELECT {', '.join(FORECAST_COLUMNS)} FROM forecast.forecasts"
    sql += " WHERE " + " AND ".join(where) if where else ""
    sql += " ORDER BY model, target, region, issued_at, target_time"
    empty = pd.DataFrame(columns=list(FORECAST_COLUMNS))
    try:
        with reader(db_path) as con:
            if not table_exists(con, "forecast.forecasts"):
                return empty
            frame = con.execute(sql, params).df()
    except FileNotFoundError:
        return empty
    for col in ("issued_at", "target_time"):
        frame[col] = pd.to_datetime(frame[col], utc=True).dt.as_unit("us")
    return frame


def last_good_forecast(
    model: str, target: str, regions: Iterable[str], before, target_from, target_until, db_path=None
) -> pd.DataFrame:
    """For each region and target hour in [target_from, target_until): the non-fallback row of `model` from the
    most recent issue strictly before `before` that covers that hour."""
    rows = read_forecasts(
        model,
        target,
        regions,
        issued_before=before,
        target_from=target_from,
        target_until=target_until,
        include_fallback=False,
        db_path=db_path,
    )
    if rows.empty:
        return rows
    rows = rows.sort_values(["region", "target_time", "issued_at"])
    return rows.groupby(["region", "target_time"], sort=True).tail(1).reset_index(drop=True)
