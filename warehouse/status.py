"""Per-table row counts and time spans of the warehouse."""

from __future__ import annotations

from pathlib import Path

from warehouse.db import reader

_TIME_TYPES = ("TIMESTAMP WITH TIME ZONE", "TIMESTAMP", "DATE", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S")
# Preferred time column names, in order, when a table has several.
# Columns whose per-value counts status reports (the first one a table has).
_BREAKDOWN = ("variant", "region", "measurement_set", "gpu_type", "table_name")
_PREFERRED = ("hour_utc", "ts_utc", "timestamp_utc", "target_time", "issued_at", "plan_time", "start_time")


def table_status(db_path: Path | None = None, breakdown: bool = True) -> list[dict]:
    out: list[dict] = []
    with reader(db_path) as con:
        tables = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' OR table_type = 'VIEW' ORDER BY 1, 2"
        ).fetchall()
        for schema, name in tables:
            cols = con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
                [schema, name],
            ).fetchall()
            time_cols = [c for c, t in cols if t in _TIME_TYPES and not c.startswith("_")]
            time_col = next((p for p in _PREFERRED if p in time_cols), time_cols[0] if time_cols else None)
            fq = f'"{schema}"."{name}"'
            if time_col:
                rows, tmin, tmax = con.execute(
                    f'SELECT count(*), min("{time_col}"), max("{time_col}") FROM {fq}'
                ).fetchone()
            else:
                rows, tmin, tmax = con.execute(f"SELECT count(*) FROM {fq}").fetchone()[0], None, None
            entry = {
                "table": f"{schema}.{name}",
                "rows": int(rows),
                "time_column": time_col,
                "min_time": None if tmin is None else str(tmin),
                "max_time": None if tmax is None else str(tmax),
            }
            names = [c for c, _ in cols]
            by = next((b for b in _BREAKDOWN if b in names), None)
            if by and breakdown:
                counts = con.execute(f'SELECT "{by}", count(*) FROM {fq} GROUP BY 1 ORDER BY 1').fetchall()
                entry["by"] = {"column": by, "rows": {str(k): int(v) for k, v in counts}}
            out.append(entry)
    return out
