"""A service's request rate hour by hour, from its rate source (`service_spec.RATE_SOURCES`), as output-token demand.

* `servegen:<model>`: ServeGen's hourly rates (`forecasting.data.service_load_hourly`, day 1 laid onto 2021-07-01
  UTC). The trace's days repeat: an hour maps to the trace hour of the same offset modulo the trace's length
  (`SERVEGEN_DAYS` days), so any period of the grid data has a load.
* `file:<path>`: a CSV of `hour_utc`, `requests_per_s` and `mean_output_tokens` (relative paths from the checkout).
* `history`: what the service's executor reported serving (`raw.service_usage`, its demand).

Demand (output tokens/s) = requests/s x mean output tokens per request x the service's `rate_scale`. An hour the
source lacks (ServeGen's collection gaps) is NaN: it is neither planned from nor served.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import HOUR, utc
from forecasting.data import SERVEGEN_START, service_load_hourly
from warehouse.db import reader, table_exists

USAGE_TABLE = "raw.service_usage"
COLUMNS = ("hour_utc", "requests_per_s", "mean_output_tokens", "demand_tokens_per_s")


@functools.lru_cache(maxsize=4)
def _servegen(data_dir: str | None) -> dict[str, pd.DataFrame]:
    """ServeGen's hourly rates per model, indexed by hour (read once per data directory)."""
    loads = service_load_hourly(data_dir)
    return {
        str(model): part.set_index("hour_utc")[["requests_per_s", "mean_output_tokens"]].sort_index()
        for model, part in loads.groupby("region")
    }


def _cyclic(trace: pd.DataFrame, hours: pd.DatetimeIndex) -> pd.DataFrame:
    """`trace` (indexed by whole hours from SERVEGEN_START) read at `hours`, its days repeating."""
    length = int(round((trace.index.max() - SERVEGEN_START) / HOUR)) + 1
    length = int(np.ceil(length / 24) * 24)
    offset = ((hours - SERVEGEN_START) // HOUR).astype(np.int64) % length
    source = SERVEGEN_START + pd.to_timedelta(offset, unit="h")
    out = trace.reindex(source)
    out.index = hours
    return out


def rate_history(service, start, end, *, data_dir=None, db_path=None, base_dir=None) -> pd.DataFrame:
    """The hours [start, end) of `service` (a mapping with tenant, service_id, rate_source, rate_scale): COLUMNS,
    one row per hour, NaN where the source has no rate (see the module doc)."""
    hours = pd.date_range(utc(start).floor("h"), utc(end).floor("h") - HOUR, freq="h")
    source = str(service["rate_source"])
    scale = float(service.get("rate_scale") or 1.0)
    kind, _, rest = source.partition(":")
    if kind == "servegen":
        traces = _servegen(None if data_dir is None else str(data_dir))
        if rest not in traces:
            raise ValueError(f"rate source {source!r}: ServeGen has no model {rest!r} ({sorted(traces)})")
        frame = _cyclic(traces[rest], hours)
    elif kind == "file":
        path = Path(rest) if Path(rest).is_absolute() or base_dir is None else Path(base_dir) / rest
        raw = pd.read_csv(path)
        missing = {"hour_utc", "requests_per_s", "mean_output_tokens"} - set(raw.columns)
        if missing:
            raise ValueError(f"rate source {source!r}: {path} lacks column(s) {sorted(missing)}")
        raw["hour_utc"] = pd.to_datetime(raw["hour_utc"], utc=True).dt.floor("h")
        frame = raw.groupby("hour_utc")[["requests_per_s", "mean_output_tokens"]].mean().reindex(hours)
    elif source == "history":
        return observed_demand(f"{service['tenant']}/{service['service_id']}", hours, db_path)
    else:
        raise ValueError(f"rate source {source!r}: not one of servegen:<model>, file:<path>, history")
    frame = frame.rename_axis("hour_utc").reset_index()
    frame["requests_per_s"] = frame["requests_per_s"] * scale
    frame["demand_tokens_per_s"] = frame["requests_per_s"] * frame["mean_output_tokens"]
    return frame[list(COLUMNS)]


def observed_demand(service_id: str, hours: pd.DatetimeIndex, db_path=None) -> pd.DataFrame:
    """COLUMNS of the hours `hours` as the service's executor reported them (`raw.service_usage`); NaN where none."""
    frame = pd.DataFrame({"hour_utc": hours})
    with reader(db_path) as con:
        if table_exists(con, USAGE_TABLE):
            got = con.execute(
                f"SELECT hour_utc, sum(requests) / 3600.0 AS requests_per_s, sum(demand_tokens_per_s) AS "
                f"demand_tokens_per_s FROM {USAGE_TABLE} WHERE service = ? AND hour_utc >= ? AND hour_utc < ? "
                "GROUP BY hour_utc",
                [service_id, hours.min().to_pydatetime(), (hours.max() + HOUR).to_pydatetime()],
            ).df()
        else:
            got = pd.DataFrame(columns=["hour_utc", "requests_per_s", "demand_tokens_per_s"])
    got["hour_utc"] = pd.to_datetime(got["hour_utc"], utc=True)
    frame = frame.merge(got, on="hour_utc", how="left")
    frame["mean_output_tokens"] = frame["demand_tokens_per_s"] / frame["requests_per_s"]
    return frame[list(COLUMNS)]
