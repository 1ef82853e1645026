"""Table shapes the connectors write, and the small helpers every connector shares.

`raw.grid_carbon_intensity` and `raw.grid_generation` follow docs/data-contracts.md exactly. Two tables are new
(written only by the live connectors):

* `raw.grid_live_forecasts(region, issued_at, hour_utc, carbon_intensity_gco2_per_kwh, signal_type, basis, scope,
  data_source, quality_flag)`: a feed's own CI forecast, `issued_at` = when the provider generated it
  (WattTime `meta.generated_at`), `hour_utc` = the forecast hour's start; the hourly mean of the provider's
  points.
* `raw.grid_generation_share(region, hour_utc, fuel, share_pct, data_source, quality_flag)`: a mix in percent
  (UK Carbon Intensity API). It becomes MW only when multiplied by a total generation/demand from another
  source (`generation_mw = share_pct / 100 * total_mw`); the API gives none, so no MW are invented here.
  `fuel` uses the contract's names plus `imports` (and any other label the API adds, lower-cased) so the
  shares of an hour still sum to ~100.

Every frame is sorted by its key and typed the same way on every run (strings as `str`, times as
`datetime64[us, UTC]`, values as float64), so reloading identical data is a no-op in `load_batch`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from common.timeutil import utc as to_utc
from warehouse.db import Rejection

CARBON_INTENSITY = "raw.grid_carbon_intensity"
GENERATION = "raw.grid_generation"
GENERATION_SHARE = "raw.grid_generation_share"
LIVE_FORECASTS = "raw.grid_live_forecasts"

COLUMNS: dict[str, tuple[str, ...]] = {
    CARBON_INTENSITY: (
        "region",
        "hour_utc",
        "carbon_intensity_gco2_per_kwh",
        "signal_type",
        "basis",
        "scope",
        "data_source",
        "quality_flag",
    ),
    GENERATION: ("region", "hour_utc", "fuel", "generation_mw", "data_source", "quality_flag"),
    GENERATION_SHARE: ("region", "hour_utc", "fuel", "share_pct", "data_source", "quality_flag"),
    LIVE_FORECASTS: (
        "region",
        "issued_at",
        "hour_utc",
        "carbon_intensity_gco2_per_kwh",
        "signal_type",
        "basis",
        "scope",
        "data_source",
        "quality_flag",
    ),
}
KEYS: dict[str, tuple[str, ...]] = {
    CARBON_INTENSITY: ("region", "hour_utc", "signal_type", "basis", "scope", "data_source"),
    GENERATION: ("region", "hour_utc", "fuel", "data_source"),
    GENERATION_SHARE: ("region", "hour_utc", "fuel", "data_source"),
    LIVE_FORECASTS: ("region", "issued_at", "hour_utc", "signal_type", "basis", "scope", "data_source"),
}
_TIME_COLUMNS = {"hour_utc", "issued_at"}
_FLOAT_COLUMNS = {"carbon_intensity_gco2_per_kwh", "generation_mw", "share_pct"}

SIGNAL_TYPES = ("average", "marginal")
BASES = ("production", "consumption")
SCOPES = ("direct", "lifecycle")


def normalize_interval(start, end) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[start, end) in UTC, widened to whole hours (hourly data is keyed by the hour's start)."""
    s, e = to_utc(start).floor("h"), to_utc(end).ceil("h")
    if e <= s:
        raise ValueError(f"empty interval: start {s.isoformat()} is not before end {e.isoformat()}")
    return s, e


def chunks(start: pd.Timestamp, end: pd.Timestamp, max_span: pd.Timedelta) -> list[tuple[pd.Timestamp, pd.Timestamp]]:
    """Consecutive windows of at most `max_span` covering [start, end)."""
    out, cursor = [], start
    while cursor < end:
        stop = min(end, cursor + max_span)
        out.append((cursor, stop))
        cursor = stop
    return out


def frame(table: str, rows: Iterable[dict] | pd.DataFrame) -> pd.DataFrame:
    """A typed, key-sorted frame with exactly the table's columns (missing optional ones NULL)."""
    columns = COLUMNS[table]
    data = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    data = data.reindex(columns=list(columns))
    out = pd.DataFrame(index=range(len(data)))
    for column in columns:
        values = data[column].reset_index(drop=True)
        if column in _TIME_COLUMNS:
            out[column] = pd.to_datetime(values, utc=True).astype("datetime64[us, UTC]")
        elif column in _FLOAT_COLUMNS:
            out[column] = pd.to_numeric(values, errors="raise").astype("float64")
        else:
            out[column] = pd.Series([None if _missing(v) else str(v) for v in values], dtype="str")
    if len(out):
        out = out.sort_values(list(KEYS[table])).reset_index(drop=True)
        duplicated = out.duplicated(list(KEYS[table]), keep=False)
        if duplicated.any():
            raise ValueError(
                f"{table}: duplicate keys {out.loc[duplicated, list(KEYS[table])].head(3).to_dict('records')}"
            )
    return out


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value) or value is pd.NA or value is pd.NaT


def join_flags(*flags: str | None) -> str | None:
    """Combine quality flags ('a;b'), dropping empties and repeats."""
    seen: list[str] = []
    for flag in flags:
        for part in (flag or "").split(";"):
            part = part.strip()
            if part and part not in seen:
                seen.append(part)
    return ";".join(seen) or None


@dataclass
class FeedData:
    """What one feed returned for one region and interval: a frame per table, and rejected input records."""

    feed: str
    region: str
    start: pd.Timestamp
    end: pd.Timestamp
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    rejections: dict[str, list[Rejection]] = field(default_factory=dict)

    def rows(self, table: str) -> int:
        return len(self.frames.get(table, ()))

    def add_rejection(self, table: str, rejection: Rejection) -> None:
        self.rejections.setdefault(table, []).append(rejection)

    def flagged(self, flag: str) -> FeedData:
        """A copy whose rows all carry `flag` in quality_flag (e.g. fallback_from=ukci)."""
        frames = {}
        for table, data in self.frames.items():
            data = data.copy()
            if len(data):
                data["quality_flag"] = [
                    join_flags(None if _missing(existing) else existing, flag) for existing in data["quality_flag"]
                ]
            frames[table] = frame(table, data)
        return FeedData(self.feed, self.region, self.start, self.end, frames, dict(self.rejections))


def within(data: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp, column: str = "hour_utc") -> pd.DataFrame:
    if not len(data):
        return data
    mask = (data[column] >= start) & (data[column] < end)
    return data.loc[mask].reset_index(drop=True)
