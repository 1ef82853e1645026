"""Input frames for the forecasters.

`load_grid_hourly` reads `marts.grid_hourly` (docs/data-contracts.md) from the warehouse; `grid_hourly_from_files`
builds the identically shaped frame straight from the CSVs under `DATA_DIR/grid` (development, tests, and the
fallback while the mart does not exist). `load_published_forecasts` gives the DACF files' published day-ahead
forecasts (DACF's own carbon-intensity forecast, the operators' solar/wind forecasts) in the long shape of
`raw.grid_published_forecasts`.

What the file builder applies (SOURCE.md):
- DE and NL generation are sums of four 15-minute readings: divided by 4 (→ hourly mean MW, `generation_scaled`).
- DE's "direct" file holds lifecycle CI: the direct CI is recomputed from the mix with the direct emission factors
  (`ci_recomputed_from_mix`); this reproduces DACF's DE actuals exactly.
- Weather (GFS forecasts, region-averaged) joins on the hour for CISO, ERCO, DE (weather files) and SE (columns of its
  direct file); every other region has NULL weather.
- Calendar columns are in UTC (the key is UTC); models derive local time themselves.

Published operator forecasts (timing assumption): each operator publishes its day-ahead solar/wind forecast for a
delivery day (a day in the market's own time zone) on the day before: CAISO OASIS with the day-ahead market results
at about 13:00 Pacific, ENTSO-E (DE, SE) by 18:00 Brussels time (Transparency Regulation art. 14.1.d). A value is
treated as known at `issued_at` only when its delivery day's publication time has passed (`published_known_until`).
For the daily 00:00 UTC issue this means: CISO's forecasts are known up to 07:00/08:00 UTC of the next day (the
Pacific day has already been published), DE's and SE's up to 22:00/23:00 UTC of the same day (the CET delivery day
that is running); the last one or two UTC hours of the day belong to the next CET day, published later that
afternoon, and are not used. Only the series that really are the operators' (CISO and DE solar and wind, SE wind) are
used as model inputs; the PJM, ERCO and ISNE solar/wind columns of the DACF files are DACF's own neural-network
forecasts and serve only as the published baseline, and DACF's carbon-intensity forecast is never an input.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc
from forecasting.base import KNOWN_FUTURE_COLUMNS
from warehouse.config import data_dir as configured_data_dir
from warehouse.db import reader

# the contract's fuel names and one table of emission factors (gCO2eq/kWh, identified by exact regression on the
# files, SOURCE.md), shared with the loaders and the live connectors
from warehouse.loaders.grid_factors import CARBONCAST_DIRECT as DIRECT_FACTORS
from warehouse.loaders.grid_factors import CARBONCAST_LIFECYCLE as LIFECYCLE_FACTORS  # noqa: F401 - for the mix
from warehouse.loaders.grid_factors import FUELS

FUEL_COLUMNS = tuple(f"{f}_mw" for f in FUELS)
RENEWABLE_FUELS = ("hydro", "solar", "wind", "biomass", "geothermal")
WEATHER_COLUMNS = (
    "wind_speed_m_per_s",
    "temperature_k",
    "dewpoint_k",
    "dswrf_w_per_m2",
    "precipitation_kg_per_m2",
)
CALENDAR_COLUMNS = ("hour_of_day", "day_of_week", "month", "day_of_year", "is_weekend")
FLAG_COLUMNS = ("is_repeated_row", "ci_recomputed_from_mix", "generation_scaled")
GRID_HOURLY_COLUMNS = (
    (
        "region",
        "hour_utc",
        "carbon_intensity_direct_gco2_per_kwh",
        "carbon_intensity_lifecycle_gco2_per_kwh",
        "signal_type",
        "basis",
    )
    + FUEL_COLUMNS
    + ("total_generation_mw", "renewable_mw", "renewable_share")
    + WEATHER_COLUMNS
    + CALENDAR_COLUMNS
    + FLAG_COLUMNS
)

ENSEMBLECI_REGIONS = ("CISO", "ERCO", "PJM", "ISNE", "MISO", "DE", "ES", "NL", "PL", "SE")
QUARTER_HOUR_SUMS = ("DE", "NL")  # generation is 4 × the hourly mean MW
WEATHER_FILE_REGIONS = ("CISO", "ERCO", "DE")
DACF_REGIONS = ("CISO", "PJM", "ERCO", "ISNE", "SE", "DE")
STANDARD_REGIONS = DACF_REGIONS
# (region, grid_hourly column) pairs whose published forecast is the grid operator's own (DACF paper, Table 3).
OPERATOR_SERIES = frozenset(
    {("CISO", "solar_mw"), ("CISO", "wind_mw"), ("DE", "solar_mw"), ("DE", "wind_mw"), ("SE", "wind_mw")}
)
OPERATOR_PUBLISHER = {"CISO": "CAISO OASIS", "DE": "ENTSO-E", "SE": "ENTSO-E"}
# Columns attached to the grid frame for the operator forecasts; see `attach_published` and `mask_known`.
PUBLISHED_COLUMNS = ("published_solar_mw", "published_wind_mw")
PUBLISHED_FOR = {"solar_mw": "published_solar_mw", "wind_mw": "published_wind_mw"}  # grid column → its forecast

# The weather files label each GFS forecast one day before the hour it is valid for (daily means of generation
# correlate best with the weather one row-day earlier). `hour_utc` of the weather columns is the valid hour.
WEATHER_LABEL_SHIFT = pd.Timedelta(hours=24)

_WEATHER_RENAME = {
    "forecast_avg_wind_speed_wMean": "wind_speed_m_per_s",
    "forecast_avg_temperature_wMean": "temperature_k",
    "forecast_avg_dewpoint_wMean": "dewpoint_k",
    "forecast_avg_dswrf_wMean": "dswrf_w_per_m2",
    "forecast_avg_precipitation_wMean": "precipitation_kg_per_m2",
}


def default_grid_dir() -> Path:
    return configured_data_dir() / "grid"


def _grid_dir(data_dir: str | Path | None) -> Path:
    if data_dir is None:
        return default_grid_dir()
    path = Path(data_dir)
    # Accept DATA_DIR itself or DATA_DIR/grid.
    if (path / "grid" / "ensembleci").exists():
        return path / "grid"
    return path


def _parse_utc(series: pd.Series) -> pd.Series:
    """The files' UTC time column (text, with or without +00:00) as tz-aware timestamps."""
    text = series.astype(str).str.replace("+00:00", "", regex=False)
    return pd.to_datetime(text, format="mixed").dt.tz_localize("UTC").dt.as_unit("us")


def _bounds(start, end) -> tuple[pd.Timestamp | None, pd.Timestamp | None]:
    return (None if start is None else utc(start)), (None if end is None else utc(end))


def _read_emissions(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    frame = frame.drop(columns=[c for c in frame.columns if c == "" or c.startswith("Unnamed")])
    frame["hour_utc"] = _parse_utc(frame.pop("UTC time"))
    return frame


def _read_weather(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path).rename(columns=_WEATHER_RENAME)
    frame["hour_utc"] = _parse_utc(frame.pop("datetime"))
    return frame[["hour_utc", *WEATHER_COLUMNS]]


def compose_intensity(
    frame: pd.DataFrame, factors: dict[str, float] = DIRECT_FACTORS, suffix: str = "_mw"
) -> pd.Series:
    """Production-based CI = Σ genᵢ·EFᵢ / Σ genᵢ over the fuel columns present in `frame` (NaN fuel = absent)."""
    num = pd.Series(0.0, index=frame.index)
    den = pd.Series(0.0, index=frame.index)
    for fuel, factor in factors.items():
        col = f"{fuel}{suffix}"
        if col in frame.columns:
            gen = pd.to_numeric(frame[col], errors="coerce").fillna(0.0).clip(lower=0.0)
            num = num + gen * factor
            den = den + gen
    return (num / den.where(den > 0)).astype(float)


def _region_frame(grid: Path, region: str) -> pd.DataFrame:
    ens = grid / "ensembleci"
    direct = _read_emissions(ens / f"{region}_direct_emissions.csv")
    weather_in_file = [c for c in _WEATHER_RENAME if c in direct.columns]
    weather = direct[["hour_utc", *weather_in_file]].rename(columns=_WEATHER_RENAME) if weather_in_file else None
    direct = direct.drop(columns=weather_in_file)
    fuels = [f for f in FUELS if f in direct.columns]
    scale = 4.0 if region in QUARTER_HOUR_SUMS else 1.0
    out = pd.DataFrame({"hour_utc": direct["hour_utc"]})
    for fuel in FUELS:
        out[f"{fuel}_mw"] = direct[fuel].astype(float) / scale if fuel in fuels else np.nan
    gen = out[[f"{f}_mw" for f in fuels]]
    # SE repeats about 2 % of rows (forward-filled gaps): flag them.
    repeated = direct[fuels + ["carbon_intensity"]].diff().abs().sum(axis=1).eq(0)
    repeated.iloc[0] = False
    recompute = region == "DE"
    if recompute:
        out["carbon_intensity_direct_gco2_per_kwh"] = compose_intensity(out, DIRECT_FACTORS)
    else:
        out["carbon_intensity_direct_gco2_per_kwh"] = direct["carbon_intensity"].astype(float)
    life_path = ens / f"{region}_lifecycle_emissions.csv"
    if life_path.exists():
        life = _read_emissions(life_path)[["hour_utc", "carbon_intensity"]].rename(
            columns={"carbon_intensity": "carbon_intensity_lifecycle_gco2_per_kwh"}
        )
        out = out.merge(life, on="hour_utc", how="left")
    else:
        out["carbon_intensity_lifecycle_gco2_per_kwh"] = np.nan
    out["total_generation_mw"] = gen.sum(axis=1).to_numpy()
    out["renewable_mw"] = out[[f"{f}_mw" for f in RENEWABLE_FUELS if f in fuels]].sum(axis=1)
    out["renewable_share"] = out["renewable_mw"] / out["total_generation_mw"].where(out["total_generation_mw"] > 0)
    if weather is None and region in WEATHER_FILE_REGIONS and (ens / f"{region}_weather_forecast.csv").exists():
        weather = _read_weather(ens / f"{region}_weather_forecast.csv")
    if weather is not None:
        # Missing weather is zero-filled in the source (the US files' last day): treat all-zero rows as missing.
        zero = weather[list(WEATHER_COLUMNS)].fillna(0).eq(0).all(axis=1)
        weather = weather.loc[~zero].drop_duplicates("hour_utc")
        weather["hour_utc"] = weather["hour_utc"] + WEATHER_LABEL_SHIFT
        out = out.merge(weather, on="hour_utc", how="left")
    else:
        for col in WEATHER_COLUMNS:
            out[col] = np.nan
    out["region"] = region
    out["signal_type"] = "average"
    out["basis"] = "production"
    out["is_repeated_row"] = repeated.to_numpy()
    out["ci_recomputed_from_mix"] = recompute
    out["generation_scaled"] = scale != 1.0
    return out


def add_calendar(frame: pd.DataFrame) -> pd.DataFrame:
    hour = frame["hour_utc"].dt
    frame["hour_of_day"] = hour.hour.astype("int64")
    frame["day_of_week"] = hour.dayofweek.astype("int64")
    frame["month"] = hour.month.astype("int64")
    frame["day_of_year"] = hour.dayofyear.astype("int64")
    frame["is_weekend"] = frame["day_of_week"] >= 5
    return frame


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values(["region", "hour_utc"]).reset_index(drop=True)
    for col in GRID_HOURLY_COLUMNS:
        if col not in frame.columns:
            frame[col] = np.nan
    frame["region"] = frame["region"].astype(str)
    float_cols = [c for c in GRID_HOURLY_COLUMNS if c.endswith(("_mw", "_kwh", "_share")) or c in WEATHER_COLUMNS]
    frame[float_cols] = frame[float_cols].astype("float64")
    for col in ("hour_of_day", "day_of_week", "month", "day_of_year"):  # DuckDB gives int32: one dtype for both
        if col in frame.columns:
            frame[col] = frame[col].astype("int64")
    # Nullable booleans: `known_at` blanks observed columns with NA, which numpy bool cannot hold.
    for col in FLAG_COLUMNS:
        frame[col] = frame[col].astype("boolean")
    extra = [c for c in frame.columns if c not in GRID_HOURLY_COLUMNS]
    return frame[list(GRID_HOURLY_COLUMNS) + extra]


def grid_hourly_from_files(
    data_dir: str | Path | None = None,
    regions: Iterable[str] | None = None,
    start=None,
    end=None,
) -> pd.DataFrame:
    """The `marts.grid_hourly` frame built from the CSVs (DATA_DIR/grid/ensembleci): same columns, same rules."""
    grid = _grid_dir(data_dir)
    regions = list(regions) if regions is not None else list(ENSEMBLECI_REGIONS)
    unknown = [r for r in regions if r not in ENSEMBLECI_REGIONS]
    if unknown:
        raise ValueError(f"no grid files for region(s) {unknown}; known: {list(ENSEMBLECI_REGIONS)}")
    start, end = _bounds(start, end)
    parts = []
    for region in regions:
        part = _region_frame(grid, region)
        if start is not None:
            part = part[part["hour_utc"] >= start]
        if end is not None:
            part = part[part["hour_utc"] < end]
        parts.append(part)
    return _finish(add_calendar(pd.concat(parts, ignore_index=True)))


class SignalMixError(ValueError):
    """marts.grid_hourly offered a non-average value in the average-signal columns (the forecasting targets)."""


def average_signal_only(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame`, checked: its carbon intensity (`signal_type`, the training target's) is the average signal.

    A marginal value (WattTime's MOER) answers another question and has its own column
    (`carbon_intensity_marginal_gco2_per_kwh`); a row whose `signal_type` is anything but average is refused rather
    than trained on.
    """
    if "signal_type" in frame.columns:
        bad = frame["signal_type"].notna() & (frame["signal_type"] != "average")
        if bad.any():
            found = sorted(set(frame.loc[bad, "signal_type"].astype(str)))
            regions = sorted(set(frame.loc[bad, "region"].astype(str)))
            raise SignalMixError(
                f"marts.grid_hourly: signal_type {found} in the average-signal columns ({int(bad.sum())} rows, "
                f"regions {regions}); marginal values belong in carbon_intensity_marginal_gco2_per_kwh only"
            )
    return frame


def load_grid_hourly(regions=None, start=None, end=None, db_path=None) -> pd.DataFrame:
    """`marts.grid_hourly` rows for `regions` with start <= hour_utc < end, read through `warehouse.db.reader`."""
    start, end = _bounds(start, end)
    where, params = [], []
    if regions is not None:
        regions = list(regions)
        where.append(f"region IN ({', '.join('?' for _ in regions)})")
        params += regions
    if start is not None:
        where.append("hour_utc >= ?")
        params.append(start.to_pydatetime())
    if end is not None:
        where.append("hour_utc < ?")
        params.append(end.to_pydatetime())
    sql = "SELECT * FROM marts.grid_hourly" + (" WHERE " + " AND ".join(where) if where else "")
    with reader(db_path) as con:
        frame = con.execute(sql + " ORDER BY region, hour_utc", params).df()
    frame["hour_utc"] = pd.to_datetime(frame["hour_utc"], utc=True).dt.as_unit("us")
    if "is_weekend" in frame.columns:
        frame["is_weekend"] = frame["is_weekend"].astype("boolean").fillna(False).astype(bool)
    return _finish(average_signal_only(frame))


def grid_hourly(regions=None, start=None, end=None, source: str = "auto", db_path=None, data_dir=None) -> pd.DataFrame:
    """The grid frame from the warehouse mart (`source='warehouse'`), the files (`'files'`) or whichever exists."""
    if source in ("auto", "warehouse"):
        try:
            frame = load_grid_hourly(regions, start, end, db_path)
            if len(frame) or source == "warehouse":
                return frame
        except SignalMixError:
            raise
        except Exception:
            if source == "warehouse":
                raise
    return grid_hourly_from_files(data_dir, regions, start, end)


# ------------------------------------------------------------------------------------------------------ issue times


def issue_hour(issued_at) -> pd.Timestamp:
    """`issued_at` in UTC, rounded up to the hour: a forecast issued at 12:20 covers the hours from 13:00."""
    return utc(issued_at).ceil("h")


def issue_times(start, end, hour: int = 0) -> pd.DatetimeIndex:
    """Daily issue times at `hour`:00 UTC on every date from `start` to `end` inclusive."""
    first = utc(start).floor("D") + pd.Timedelta(hours=hour)
    last = utc(end).floor("D") + pd.Timedelta(hours=hour)
    return pd.date_range(first, last, freq="D")


# ---------------------------------------------------------------------------------------------- published forecasts


def _published_from_files(grid: Path, regions: Iterable[str]) -> pd.DataFrame:
    rows = []
    for region in regions:
        path = grid / "dacf" / f"{region}_carbon_from_src_prod_forecasts_direct.csv"
        if not path.exists():
            continue
        raw = _read_emissions(path)
        scale = 4.0 if region in QUARTER_HOUR_SUMS else 1.0
        series = {
            "carbon_intensity_direct": (raw["carbon_from_src_forecasts"], "gco2_per_kwh", "DACF"),
            "carbon_intensity_actual": (raw["carbon_intensity"], "gco2_per_kwh", "DACF"),
        }
        for col in raw.columns:
            if col.startswith("avg_") and col.endswith("_production_forecast"):
                fuel = col[len("avg_") : -len("_production_forecast")]
                target = f"{fuel}_mw"
                publisher = OPERATOR_PUBLISHER[region] if (region, target) in OPERATOR_SERIES else "DACF"
                series[target] = (raw[col] / scale, "mw", publisher)
        for target, (values, unit, publisher) in series.items():
            rows.append(
                pd.DataFrame(
                    {
                        "region": region,
                        "hour_utc": raw["hour_utc"],
                        "target": target,
                        "value": values.astype(float),
                        "unit": unit,
                        "publisher": publisher,
                        "data_source": "dacf",
                    }
                )
            )
    if not rows:
        return pd.DataFrame(columns=["region", "hour_utc", "target", "value", "unit", "publisher", "data_source"])
    return pd.concat(rows, ignore_index=True)


def load_published_forecasts(
    regions=None, start=None, end=None, source: str = "auto", db_path=None, data_dir=None
) -> pd.DataFrame:
    """Published day-ahead forecasts, long: region, hour_utc, target, value, unit, publisher, data_source.

    `source='warehouse'` reads `raw.grid_published_forecasts`, `'files'` the DACF CSVs, `'auto'` the warehouse when
    the table has rows, else the files. Targets: carbon_intensity_direct (DACF's forecast), carbon_intensity_actual,
    solar_mw, wind_mw and <fuel>_mw (DE's already ÷4).
    """
    regions = list(regions) if regions is not None else list(DACF_REGIONS)
    start, end = _bounds(start, end)
    frame = None
    if source in ("auto", "warehouse"):
        try:
            with reader(db_path) as con:
                frame = con.execute(
                    "SELECT region, hour_utc, target, value, unit, publisher, data_source "
                    f"FROM raw.grid_published_forecasts WHERE region IN ({', '.join('?' for _ in regions)})",
                    regions,
                ).df()
            frame["hour_utc"] = pd.to_datetime(frame["hour_utc"], utc=True).dt.as_unit("us")
            if frame.empty and source == "auto":
                frame = None
        except Exception:
            if source == "warehouse":
                raise
            frame = None
    if frame is None:
        frame = _published_from_files(_grid_dir(data_dir), regions)
    if start is not None:
        frame = frame[frame["hour_utc"] >= start]
    if end is not None:
        frame = frame[frame["hour_utc"] < end]
    return frame.sort_values(["region", "target", "hour_utc"]).reset_index(drop=True)


def published_wide(published: pd.DataFrame) -> pd.DataFrame:
    """Long published forecasts → one row per (region, hour_utc), a column per target."""
    if published.empty:
        return pd.DataFrame(columns=["region", "hour_utc"])
    wide = published.pivot_table(index=["region", "hour_utc"], columns="target", values="value", aggfunc="first")
    wide.columns.name = None
    return wide.reset_index()


def attach_published(frame: pd.DataFrame, published: pd.DataFrame | None) -> pd.DataFrame:
    """Add `published_solar_mw` / `published_wind_mw` from the *operator* series only (NaN elsewhere).

    These are known-future inputs with their own availability rule (see `mask_known`)."""
    out = frame.drop(columns=[c for c in PUBLISHED_COLUMNS if c in frame.columns])
    for col in PUBLISHED_COLUMNS:
        out[col] = np.nan
    if published is None or published.empty:
        return out
    keep = published[[(r, t) in OPERATOR_SERIES for r, t in zip(published["region"], published["target"])]]
    if keep.empty:
        return out
    wide = published_wide(keep).rename(columns={"solar_mw": "published_solar_mw", "wind_mw": "published_wind_mw"})
    wide = wide[["region", "hour_utc", *[c for c in PUBLISHED_COLUMNS if c in wide.columns]]]
    out = out.drop(columns=list(PUBLISHED_COLUMNS)).merge(wide, on=["region", "hour_utc"], how="left")
    for col in PUBLISHED_COLUMNS:
        if col not in out.columns:
            out[col] = np.nan
    return out


# Publication of the operators' day-ahead forecasts: (market time zone, local hour of publication on the day before).
PUBLICATION = {
    "CISO": ("America/Los_Angeles", 13),
    "DE": ("Europe/Brussels", 18),
    "SE": ("Europe/Brussels", 18),
}
DEFAULT_PUBLICATION = ("UTC", 12)


def published_known_until(issued_at, region: str | None = None) -> pd.Timestamp:
    """The first hour whose operator forecast is *not* yet published at `issued_at` (see the module docstring)."""
    issued_at = utc(issued_at)
    tz, hour = PUBLICATION.get(region, DEFAULT_PUBLICATION)
    local = issued_at.tz_convert(tz)
    last_day = local.date() + dt.timedelta(days=1 if local.hour >= hour else 0)
    return pd.Timestamp(last_day + dt.timedelta(days=1)).tz_localize(tz).tz_convert("UTC")


def mask_known(data: pd.DataFrame, issued_at: pd.Timestamp) -> pd.DataFrame:
    """`base.known_at`, plus the operator forecasts kept for the hours already published at `issued_at`.

    Idempotent: masking masked data again changes nothing."""
    issued_at = utc(issued_at)
    if data.attrs.get("known_at") == issued_at:
        return data  # masked at this very issue time already (masking is idempotent)
    masked = _known_at_fast(data, issued_at)
    cols = [c for c in PUBLISHED_COLUMNS if c in data.columns]
    if cols and len(data):
        until = data["region"].map({r: published_known_until(issued_at, r) for r in data["region"].unique()})
        available = data["hour_utc"] < until
        for col in cols:
            masked[col] = data[col].where(available, np.nan)
    masked.attrs["known_at"] = issued_at
    return masked


def _known_at_fast(data: pd.DataFrame, issued_at: pd.Timestamp) -> pd.DataFrame:
    """The result of `base.known_at`, column by column (the multi-column .loc assignment is slow on wide frames).
    Equality with `known_at` is a unit test."""
    future = (data["hour_utc"] >= issued_at).to_numpy()
    masked = data.copy()
    if not future.any():
        return masked
    observed = [c for c in data.columns if c not in KNOWN_FUTURE_COLUMNS and c not in ("region", "hour_utc")]
    for col in observed:
        series = masked[col]
        if pd.api.types.is_bool_dtype(series.dtype) and not isinstance(series.dtype, pd.BooleanDtype):
            series = series.astype("boolean")
        elif pd.api.types.is_integer_dtype(series.dtype) and not isinstance(
            series.dtype, pd.core.arrays.integer.IntegerDtype
        ):
            series = series.astype("float64")
        masked[col] = series.mask(future)
    return masked


def observed_columns(data: pd.DataFrame) -> list[str]:
    """Columns that `known_at` blanks after issued_at (everything but keys, calendar/weather, published)."""
    return [
        c
        for c in data.columns
        if c not in KNOWN_FUTURE_COLUMNS and c not in ("region", "hour_utc") and c not in PUBLISHED_COLUMNS
    ]


# ---------------------------------------------------------------------------------------------------- service loads
SERVEGEN_RATES = Path("inference/servegen/servegen_rates.csv")
# ServeGen's t = 0 carries no calendar date or time zone: its days are laid onto the grid data from this hour on
SERVEGEN_START = pd.Timestamp("2021-07-01T00:00Z")
# a 10-minute window under this share of the service's median rate is a collection gap (its edges keep a few clients)
GAP_SHARE = 0.05


def service_load_hourly(data_dir: str | Path | None = None, start=SERVEGEN_START) -> pd.DataFrame:
    """ServeGen's request rates per service (`region` = its model, e.g. language/m-large) and hour (`hour_utc`,
    t = 0 at `start`): `requests_per_s` = the mean of the hour's 10-minute windows, a window below `GAP_SHARE` of the
    service's median counted as missing (the source's collection gaps, where every client or all but a few send
    nothing, never an idle service; an hour of only such windows is NaN), and the hour's mean input and output
    tokens per request; calendar columns as `add_calendar`."""
    root = Path(data_dir or configured_data_dir())
    path = root / SERVEGEN_RATES
    if not path.is_file():
        raise FileNotFoundError(f"service loads: {path} is missing (DATA_DIR={root})")
    raw = pd.read_csv(path)
    missing = {"model", "t_seconds", "requests_per_s", "mean_input_tokens", "mean_output_tokens"} - set(raw.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    raw["hour_utc"] = pd.Timestamp(start).tz_convert("UTC") + pd.to_timedelta(raw["t_seconds"] // 3600, unit="h")
    median = raw.groupby("model")["requests_per_s"].transform("median")
    raw["requests_per_s"] = raw["requests_per_s"].where(raw["requests_per_s"] >= GAP_SHARE * median)
    hourly = (
        raw.groupby(["model", "hour_utc"], sort=True)[["requests_per_s", "mean_input_tokens", "mean_output_tokens"]]
        .mean()
        .reset_index()
        .rename(columns={"model": "region"})
    )
    return add_calendar(hourly)
