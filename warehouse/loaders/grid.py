"""Grid file loaders: hourly carbon intensity, generation by fuel, weather and published forecasts.

Three sources (group ``grid``), all read from ``DATA_DIR/grid`` (see ``DATA_DIR/grid/SOURCE.md``):

``grid_ensembleci`` — ``grid/ensembleci/<R>_{direct,lifecycle}_emissions.csv`` and ``<R>_weather_forecast.csv``
for CISO, ERCO, PJM, ISNE, MISO (EIA-930) and DE, ES, NL, PL, SE (ENTSO-E), built by the CarbonCast pipeline.
  * ``raw.grid_carbon_intensity``: one batch per emissions file; ``signal_type=average``, ``basis=production``
    (CarbonCast ignores imports), ``scope`` = direct | lifecycle from the file name, ``data_source=ensembleci``.
  * ``raw.grid_generation``: long (region, hour_utc, fuel, generation_mw), taken from the *direct* file only.
    The lifecycle file repeats the same mix; the loader checks that hour by hour and flags lifecycle CI rows
    whose mix differs with ``mix_mismatch`` (none on the shipped data), instead of loading the mix twice.
  * ``raw.grid_weather_forecast``: the CISO, ERCO and DE weather files, and SE's five weather columns that live
    inside ``SE_direct_emissions.csv`` (GFS 0.25° forecasts, area-weighted; m/s, K, K, W/m², kg/m²).

``grid_dacf`` — ``grid/dacf/<R>_carbon_from_src_prod_forecasts_direct.csv`` (CISO, DE, ERCO, ISNE, PJM, SE;
Jul–Dec 2021) → ``raw.grid_published_forecasts`` (long, ``data_source=dacf``), targets:
  ``carbon_intensity_actual`` (column ``carbon_intensity``: the actual *direct* production-based CI),
  ``carbon_intensity_direct`` (``carbon_from_src_forecasts``: DACF's day-ahead CI forecast), and
  ``<fuel>_mw`` (``avg_<fuel>_production_forecast``). ``publisher`` says who made the number: ``dacf`` for the
  CI forecast, ``caiso_oasis`` (CISO) / ``entsoe`` (DE, SE) for solar and wind (DACF paper, Table 3), ``dacf_ann``
  for every other fuel forecast and for PJM/ERCO/ISNE solar and wind, and ``eia930`` / ``entsoe`` for the actual.
  DE's fuel forecasts are in the same ×4 units as DE's actuals and are divided by 4 here; the table has no
  quality_flag column (contract), so that scaling is documented here only. ``unit`` is ``gco2_per_kwh`` or ``mw``.

``grid_gb`` — ``grid/lets_wait_awhile/gb_ci.csv`` and ``gb_production.csv`` (ENTSO-E, 2019-12-20 → 2021-01-09;
30-min samples until 2020-10-31, 15-min after) → hourly, region ``GB``, ``data_source=lets_wait_awhile``.
  * Hourly value = mean of the hour's samples. An hour is complete when its samples are {:00, :30} or
    {:00, :15, :30, :45}; any other set (one half-hour only, say) gets ``partial_hour``.
  * ``gb_ci.csv`` is **lifecycle, consumption-based** average CI: the repository's script weights ENTSO-E
    generation with IPCC SRREN medians *and* adds imports (FR 39, NL 452, IE 348, BE 153; pumped storage
    excluded). We verified that on every sample (|diff| < 1e-9). Loaded with ``basis=consumption``,
    ``scope=lifecycle``. These factors differ from CarbonCast's, so this series is not on the same scale as the
    ensembleci lifecycle CI. Where the interconnector columns are empty (4 half-hours: 2020-10-29/30/31 23:30
    and 2021-01-09 23:30) the script fell back to generation only; those hours get ``imports_missing``.
  * ``raw.grid_generation``: fuels mapped onto the contract's names — Biomass→biomass, Fossil Gas→nat_gas,
    Fossil Hard coal→coal, Fossil Oil→oil, Hydro Run-of-river and poundage→hydro, Nuclear→nuclear,
    Other→other, Solar→solar, Wind Onshore + Wind Offshore→wind. **Hydro Pumped Storage is excluded**: it is
    storage discharge, energy already counted when it was generated, and the GB CI excludes it too.
    **FR, NL, IE, BE are interconnector flows (net imports), not generation**, and are excluded as well.
  * For a GB *production-based* series comparable with the other regions, the loader also recomputes
    direct and lifecycle CI from the hourly mix with the CarbonCast factors (``basis=production``,
    ``quality_flag=recomputed_from_mix``); these rows belong to the gb_production.csv batch.

Caveats from SOURCE.md applied here (code, quality_flag, tests):
  * **DE and NL generation is the sum of four 15-min readings** → divided by 4 (``scaled_div4``); NL nuclear
    becomes ≈ 485 MW (Borssele). ES, PL, SE and the US files are hourly MW already.
  * **DE's "direct" file holds lifecycle CI** (identical to the lifecycle file) → DE direct CI is recomputed
    from the mix with the CarbonCast direct factors (``recomputed_from_mix``; grid_factors.CARBONCAST_DIRECT).
    This reproduces DACF's DE actual CI (mean |diff| < 0.005 over Jul–Dec 2021). An hour whose mix totals 0
    cannot be recomputed and is quarantined from the CI batch (none on the shipped data).
  * **Repeated rows**: an hour whose CI and whole mix equal the previous hour's gets ``repeated_row`` (on its
    CI rows, direct and lifecycle, and its generation rows). SE has 539 of 26,304 hours (2.05 %; the longest
    run of repeats is 169 h, a forward-filled gap); the US and ES/NL files have a few (4–30).
  * **Weather zeros**: a weather row whose five values are all 0 (or whose temperature is ≤ 0 K) is missing
    data (the upstream files zero-fill their last day); it goes to quarantine, since the weather table has no
    quality_flag. On the shipped data that is SE's last day, 2021-12-31 (24 rows); the US files were trimmed
    before their zero day.
  * Timestamps come as ``YYYY-MM-DD HH:MM:SS`` with or without ``+00:00`` (and ``2019-1-1 0:00:00`` or
    ``2019-01-01 0:00`` in the weather files); all are UTC. The unnamed index column and ES/SE's extra
    ``Unnamed: 0`` column are ignored.

Hour keys: ``hour_utc`` is the label as given, taken as the start of the hour. In the US (EIA-930) files the
label is probably the EIA *hour-ending* convention (ERCO solar peaks at ≈ 19:15 UTC; not proven), so the value
labelled 13:00 may describe 12:00–13:00. We do **not** shift: allow ±1 h when joining US rows with weather or
live API data. ENTSO-E (EU, GB) labels are period starts.

Validation: ``read_checked_csv`` rejects rows with a missing or non-numeric value, negative generation or
forecast, a CI outside [0, 2000] gCO2/kWh, an unparsable timestamp or a repeated hour (later copy); the loader
also rejects timestamps that are not on the hour (sub-hourly grid for GB). A rejected row of an emissions file is
missing from both its CI and its generation batch, so its rejection is recorded for both tables.

quality_flag: NULL, one code, or several codes joined with ``;`` in a fixed order (e.g.
``scaled_div4;repeated_row``) — test with ``contains(quality_flag, 'repeated_row')``, not equality.
Batches: ``batch_id = "<source>:<path relative to DATA_DIR>"``; one batch per (file, table).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from warehouse.db import Batch, Rejection
from warehouse.loaders.base import Column, LoadError, Source, read_checked_csv, relative_name
from warehouse.loaders.grid_factors import (
    CARBONCAST_DIRECT,
    CARBONCAST_LIFECYCLE,
    FUELS,
    intensity_from_mix,
)

CI_TABLE = "raw.grid_carbon_intensity"
GENERATION_TABLE = "raw.grid_generation"
WEATHER_TABLE = "raw.grid_weather_forecast"
FORECAST_TABLE = "raw.grid_published_forecasts"

CI_COLUMNS = [
    "region",
    "hour_utc",
    "carbon_intensity_gco2_per_kwh",
    "signal_type",
    "basis",
    "scope",
    "data_source",
    "quality_flag",
]
GENERATION_COLUMNS = ["region", "hour_utc", "fuel", "generation_mw", "data_source", "quality_flag"]
WEATHER_COLUMNS = [
    "region",
    "hour_utc",
    "wind_speed_m_per_s",
    "temperature_k",
    "dewpoint_k",
    "dswrf_w_per_m2",
    "precipitation_kg_per_m2",
    "data_source",
]
FORECAST_COLUMNS = ["region", "hour_utc", "target", "value", "unit", "publisher", "data_source"]

# GFS column → warehouse column (units in the name).
WEATHER_SOURCE_COLUMNS = {
    "forecast_avg_wind_speed_wMean": "wind_speed_m_per_s",
    "forecast_avg_temperature_wMean": "temperature_k",
    "forecast_avg_dewpoint_wMean": "dewpoint_k",
    "forecast_avg_dswrf_wMean": "dswrf_w_per_m2",
    "forecast_avg_precipitation_wMean": "precipitation_kg_per_m2",
}

MAX_CI_GCO2_PER_KWH = 2000.0
SCALED_DIV4 = frozenset({"DE", "NL"})  # SOURCE.md: sum of four 15-min MW readings
RECOMPUTE_DIRECT = frozenset({"DE"})  # SOURCE.md: the "direct" file holds lifecycle CI
US_REGIONS = frozenset({"CISO", "ERCO", "PJM", "ISNE", "MISO"})
DACF_PUBLISHED_RENEWABLES = {"CISO": "caiso_oasis", "DE": "entsoe", "SE": "entsoe"}  # DACF paper, Table 3

GB_REGION = "GB"
GB_FUEL_MAP = {
    "Biomass": "biomass",
    "Fossil Gas": "nat_gas",
    "Fossil Hard coal": "coal",
    "Fossil Oil": "oil",
    "Hydro Run-of-river and poundage": "hydro",
    "Nuclear": "nuclear",
    "Other": "other",
    "Solar": "solar",
    "Wind Offshore": "wind",
    "Wind Onshore": "wind",
}
GB_EXCLUDED_STORAGE = ("Hydro Pumped Storage",)
GB_INTERCONNECTORS = ("FR", "NL", "IE", "BE")
GB_COMPLETE_SLOTS = (0b0101, 0b1111)  # {:00, :30} or {:00, :15, :30, :45}

_DIRECT_SUFFIX = "_direct_emissions.csv"
_LIFECYCLE_SUFFIX = "_lifecycle_emissions.csv"
_WEATHER_SUFFIX = "_weather_forecast.csv"
_DACF_SUFFIX = "_carbon_from_src_prod_forecasts_direct.csv"
_DACF_FUEL = re.compile(r"^avg_(?P<fuel>[a-z_]+)_production_forecast$")

TIME_UTC = Column("UTC time", "timestamp", rename="hour_utc")
TIME_WEATHER = Column("datetime", "timestamp", rename="hour_utc", aliases=("UTC time",))
# pandas' default text dtype: VARCHAR in DuckDB even when all NULL (object would become INTEGER), cheap to hash
_TEXT = "str"
CI_COLUMN = Column("carbon_intensity", min_value=0.0, max_value=MAX_CI_GCO2_PER_KWH)


# ---------------------------------------------------------------------------------------------------------------
# shared helpers


@dataclass
class _Read:
    """Good rows of a checked CSV (sorted by time), their file lines (header = 1), and the rejections so far."""

    path: Path
    frame: pd.DataFrame
    lines: np.ndarray
    rejections: list[Rejection]


def _header(path: Path) -> list[str]:
    if not path.exists():
        raise LoadError(path, "file not found")
    with open(path, "rb") as handle:
        head = handle.read(65536)
    if not head.strip():
        raise LoadError(path, "file is empty")
    if b"\x00" in head:
        raise LoadError(path, "file is binary (NUL bytes), not CSV text")
    first = head.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace").strip("\r")
    return [c.strip().strip('"') for c in first.split(",")]


def _is_index_column(name: str) -> bool:
    return name == "" or name.startswith("Unnamed:")


def _classify(path: Path, header: list[str], time_column: str) -> tuple[list[str], list[str]]:
    """Fuel and weather columns of an emissions file; anything unexpected is a whole-file error."""
    fuels, weather = [], []
    for name in header:
        if _is_index_column(name) or name in (time_column, "carbon_intensity"):
            continue
        if name in WEATHER_SOURCE_COLUMNS:
            weather.append(name)
        elif name in FUELS:
            fuels.append(name)
        else:
            raise LoadError(
                path, f"unknown column (not a fuel of {list(FUELS)} nor a weather column)", row=1, field=name
            )
    if not fuels:
        raise LoadError(path, "no generation (fuel) columns", row=1)
    return fuels, weather


def _read(path: Path, columns: list[Column], key: str = "hour_utc") -> _Read:
    frame, rejections = read_checked_csv(path, columns, key=[key], line_column="_line")
    lines = frame.pop("_line").to_numpy(dtype="int64")
    return _sorted(_Read(path, frame, lines, list(rejections)), key)


def _sorted(read: _Read, key: str) -> _Read:
    times = read.frame[key]
    if not times.is_monotonic_increasing:
        order = times.argsort(kind="stable").to_numpy()
        read.frame = read.frame.iloc[order].reset_index(drop=True)
        read.lines = read.lines[order]
    return read


def _rejections_for(read: _Read, mask: np.ndarray, field: str, reason: str) -> list[Rejection]:
    out = []
    for idx in np.flatnonzero(mask):
        row = read.frame.iloc[idx]
        line = int(read.lines[idx])
        out.append(
            Rejection(
                reason=reason,
                file=str(read.path),
                row_number=line,
                field=field,
                value=None if pd.isna(row.get(field, None)) else str(row.get(field)),
                record={k: (None if pd.isna(v) else str(v)) for k, v in row.items()},
            )
        )
    return out


def _drop(read: _Read, mask: np.ndarray, field: str, reason: str) -> _Read:
    """A copy of `read` without the rows in `mask`, which become rejections."""
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return read
    rejected = _rejections_for(read, mask, field, reason)
    keep = ~mask
    return _Read(read.path, read.frame.loc[keep].reset_index(drop=True), read.lines[keep], read.rejections + rejected)


def _on_the_hour(read: _Read) -> _Read:
    hours = read.frame["hour_utc"]
    off = (hours != hours.dt.floor("h")).to_numpy()
    return _drop(read, off, "hour_utc", "timestamp is not at the start of an hour (hourly file)")


def _flags(n: int, *pairs: tuple[str, np.ndarray | bool]) -> pd.Series:
    """Quality flags: NULL, or the codes whose mask is true, joined with ';' in the order given."""
    out = np.full(n, "", dtype=object)
    for code, mask in pairs:
        m = np.broadcast_to(np.asarray(mask, dtype=bool), (n,))
        if not m.any():
            continue
        current = out[m]
        out[m] = np.where(current == "", code, current + ";" + code)
    out[out == ""] = None
    return pd.Series(out, dtype=_TEXT)


def _repeated(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Rows whose values all equal the previous hour's row (frame sorted by hour_utc)."""
    n = len(frame)
    out = np.zeros(n, dtype=bool)
    if n < 2:
        return out
    values = frame[columns].to_numpy(dtype="float64")
    hours = frame["hour_utc"].dt.tz_convert(None).to_numpy(dtype="datetime64[ns]")
    consecutive = (hours[1:] - hours[:-1]) == np.timedelta64(1, "h")
    out[1:] = (values[1:] == values[:-1]).all(axis=1) & consecutive
    return out


def _batch_id(source: str, root: Path, path: Path) -> str:
    return f"{source}:{relative_name(path, root)}"


def _hours(series: pd.Series) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(series).tz_convert("UTC")


def _ci_frame(
    region: str,
    hours: pd.Series | pd.DatetimeIndex,
    values: np.ndarray | pd.Series,
    *,
    basis: str,
    scope: str,
    data_source: str,
    flags: pd.Series,
    signal_type: str = "average",
) -> pd.DataFrame:
    n = len(hours)
    frame = pd.DataFrame(
        {
            "region": pd.Series([region] * n, dtype=_TEXT),
            "hour_utc": _hours(hours),
            "carbon_intensity_gco2_per_kwh": np.asarray(values, dtype="float64"),
            "signal_type": pd.Series([signal_type] * n, dtype=_TEXT),
            "basis": pd.Series([basis] * n, dtype=_TEXT),
            "scope": pd.Series([scope] * n, dtype=_TEXT),
            "data_source": pd.Series([data_source] * n, dtype=_TEXT),
            "quality_flag": flags.reset_index(drop=True),
        }
    )
    return frame[CI_COLUMNS]


def _generation_frame(
    region: str, hours: pd.Series | pd.DatetimeIndex, mix: pd.DataFrame, data_source: str, flags: pd.Series
) -> pd.DataFrame:
    """Wide mix (one column per contract fuel) → long rows, hour-major, fuels in column order."""
    fuels = list(mix.columns)
    k, n = len(fuels), len(mix)
    frame = pd.DataFrame(
        {
            "region": pd.Series([region] * (n * k), dtype=_TEXT),
            "hour_utc": _hours(hours).repeat(k),
            "fuel": pd.Series(np.tile(np.array(fuels, dtype=object), n), dtype=_TEXT),
            "generation_mw": mix.to_numpy(dtype="float64").ravel(),
            "data_source": pd.Series([data_source] * (n * k), dtype=_TEXT),
            "quality_flag": pd.Series(np.repeat(flags.to_numpy(dtype=object), k), dtype=_TEXT),
        }
    )
    return frame[GENERATION_COLUMNS]


def _weather_frame(region: str, frame: pd.DataFrame, data_source: str) -> pd.DataFrame:
    n = len(frame)
    out = pd.DataFrame({"region": pd.Series([region] * n, dtype=_TEXT), "hour_utc": _hours(frame["hour_utc"])})
    for target in WEATHER_SOURCE_COLUMNS.values():
        out[target] = frame[target].to_numpy(dtype="float64")
    out["data_source"] = pd.Series([data_source] * n, dtype=_TEXT)
    return out[WEATHER_COLUMNS]


def _weather_columns() -> list[Column]:
    """The five GFS columns, renamed; negative wind/irradiance/precipitation and impossible temperatures rejected."""
    bounds = {"temperature_k": (0.0, 400.0), "dewpoint_k": (0.0, 400.0)}
    columns = []
    for name, target in WEATHER_SOURCE_COLUMNS.items():
        low, high = bounds.get(target, (0.0, None))
        columns.append(Column(name, min_value=low, max_value=high, rename=target))
    return columns


def _drop_weather_zeros(read: _Read) -> _Read:
    values = read.frame[list(WEATHER_SOURCE_COLUMNS.values())].to_numpy(dtype="float64")
    all_zero = (values == 0).all(axis=1)
    read = _drop(read, all_zero, "temperature_k", "all weather fields are 0: missing data (upstream zero-fill)")
    cold = (read.frame["temperature_k"].to_numpy(dtype="float64") <= 0) | (
        read.frame["dewpoint_k"].to_numpy(dtype="float64") <= 0
    )
    return _drop(read, cold, "temperature_k", "temperature or dewpoint 0 K: missing data (upstream zero-fill)")


# ---------------------------------------------------------------------------------------------------------------
# ensembleci


def _ensembleci_folder(root: Path) -> Path:
    return Path(root) / "grid" / "ensembleci"


def _ensembleci_files(root: Path) -> list[Path]:
    folder = _ensembleci_folder(root)
    if not folder.is_dir():
        return []
    suffixes = (_DIRECT_SUFFIX, _LIFECYCLE_SUFFIX, _WEATHER_SUFFIX)
    return sorted(p for p in folder.glob("*.csv") if p.name.endswith(suffixes))


def ensembleci_regions(root: Path) -> list[str]:
    folder = _ensembleci_folder(root)
    return sorted(p.name[: -len(_DIRECT_SUFFIX)] for p in folder.glob(f"*{_DIRECT_SUFFIX}"))


def _ensembleci_batches(root: Path) -> Iterator[Batch]:
    root = Path(root)
    folder = _ensembleci_folder(root)
    regions = ensembleci_regions(root) if folder.is_dir() else []
    if not regions:
        raise LoadError(folder, f"no <REGION>{_DIRECT_SUFFIX} files (is DATA_DIR right?)")
    for region in regions:
        yield from _ensembleci_region(root, folder, region)


def _ensembleci_region(root: Path, folder: Path, region: str) -> Iterator[Batch]:
    source, data_source = "grid_ensembleci", "ensembleci"
    scale = 4.0 if region in SCALED_DIV4 else 1.0

    # -- direct file: direct CI, the generation mix (and SE's weather columns)
    direct_path = folder / f"{region}{_DIRECT_SUFFIX}"
    header = _header(direct_path)
    fuels, weather_names = _classify(direct_path, header, TIME_UTC.name)
    direct = _read(direct_path, [TIME_UTC, CI_COLUMN] + [Column(f, min_value=0.0) for f in fuels])
    direct = _on_the_hour(direct)
    frame = direct.frame
    mix = frame[fuels].astype("float64")
    repeated = _repeated(frame, ["carbon_intensity"] + fuels)
    repeated_by_hour = pd.Series(repeated, index=_hours(frame["hour_utc"]))

    if region in RECOMPUTE_DIRECT:
        ci_read = _Read(direct.path, frame.copy(), direct.lines, list(direct.rejections))
        ci_read.frame["carbon_intensity"] = intensity_from_mix(mix, CARBONCAST_DIRECT).to_numpy()
        ci_read = _drop(
            ci_read,
            ci_read.frame["carbon_intensity"].isna().to_numpy(),
            "carbon_intensity",
            "direct CI cannot be recomputed: total generation is 0",
        )
        kept = repeated_by_hour.reindex(_hours(ci_read.frame["hour_utc"])).to_numpy(dtype=bool)
        ci_flags = _flags(len(ci_read.frame), ("recomputed_from_mix", True), ("repeated_row", kept))
    else:
        ci_read = direct
        ci_flags = _flags(len(frame), ("repeated_row", repeated))
    yield Batch(
        CI_TABLE,
        _batch_id(source, root, direct_path),
        source,
        _ci_frame(
            region,
            ci_read.frame["hour_utc"],
            ci_read.frame["carbon_intensity"].to_numpy(dtype="float64"),
            basis="production",
            scope="direct",
            data_source=data_source,
            flags=ci_flags,
        ),
        ci_read.rejections,
    )

    gen_flags = _flags(len(frame), ("scaled_div4", scale != 1.0), ("repeated_row", repeated))
    yield Batch(
        GENERATION_TABLE,
        _batch_id(source, root, direct_path),
        source,
        _generation_frame(region, frame["hour_utc"], mix / scale, data_source, gen_flags),
        list(direct.rejections),
    )

    if weather_names:
        weather = _read(direct_path, [TIME_UTC] + _weather_columns())
        weather = _drop_weather_zeros(_on_the_hour(weather))
        yield Batch(
            WEATHER_TABLE,
            _batch_id(source, root, direct_path),
            source,
            _weather_frame(region, weather.frame, data_source),
            weather.rejections,
        )

    # -- lifecycle file: lifecycle CI; its mix must equal the direct file's mix hour by hour
    life_path = folder / f"{region}{_LIFECYCLE_SUFFIX}"
    if life_path.exists():
        life_fuels, _ = _classify(life_path, _header(life_path), TIME_UTC.name)
        life = _on_the_hour(_read(life_path, [TIME_UTC, CI_COLUMN] + [Column(f, min_value=0.0) for f in life_fuels]))
        lf = life.frame
        life_hours = _hours(lf["hour_utc"])
        union = list(dict.fromkeys(fuels + life_fuels))
        theirs = lf[life_fuels].astype("float64").reindex(columns=union, fill_value=0.0).to_numpy()
        ours = (
            mix.set_index(_hours(frame["hour_utc"]))
            .reindex(columns=union, fill_value=0.0)
            .reindex(life_hours)
            .to_numpy()
        )
        mismatch = ~np.isclose(theirs, ours, rtol=0.0, atol=1e-6).all(axis=1)  # NaN (hour absent) → mismatch
        life_repeated = repeated_by_hour.reindex(life_hours, fill_value=False).to_numpy(dtype=bool)
        yield Batch(
            CI_TABLE,
            _batch_id(source, root, life_path),
            source,
            _ci_frame(
                region,
                lf["hour_utc"],
                lf["carbon_intensity"].to_numpy(dtype="float64"),
                basis="production",
                scope="lifecycle",
                data_source=data_source,
                flags=_flags(len(lf), ("repeated_row", life_repeated), ("mix_mismatch", mismatch)),
            ),
            life.rejections,
        )

    # -- weather file
    weather_path = folder / f"{region}{_WEATHER_SUFFIX}"
    if weather_path.exists():
        weather = _read(weather_path, [TIME_WEATHER] + _weather_columns())
        weather = _drop_weather_zeros(_on_the_hour(weather))
        yield Batch(
            WEATHER_TABLE,
            _batch_id(source, root, weather_path),
            source,
            _weather_frame(region, weather.frame, data_source),
            weather.rejections,
        )


# ---------------------------------------------------------------------------------------------------------------
# DACF published forecasts


def _dacf_folder(root: Path) -> Path:
    return Path(root) / "grid" / "dacf"


def _dacf_files(root: Path) -> list[Path]:
    folder = _dacf_folder(root)
    return sorted(folder.glob(f"*{_DACF_SUFFIX}")) if folder.is_dir() else []


def _dacf_publisher(region: str, target: str) -> str:
    if target == "carbon_intensity_actual":
        return "eia930" if region in US_REGIONS else "entsoe"
    if target == "carbon_intensity_direct":
        return "dacf"
    if target in ("solar_mw", "wind_mw"):
        return DACF_PUBLISHED_RENEWABLES.get(region, "dacf_ann")
    return "dacf_ann"


def _dacf_batches(root: Path) -> Iterator[Batch]:
    root = Path(root)
    files = _dacf_files(root)
    if not files:
        raise LoadError(_dacf_folder(root), f"no <REGION>{_DACF_SUFFIX} files (is DATA_DIR right?)")
    for path in files:
        yield _dacf_batch(root, path)


def _dacf_batch(root: Path, path: Path) -> Batch:
    source, data_source = "grid_dacf", "dacf"
    region = path.name[: -len(_DACF_SUFFIX)]
    header = _header(path)
    fuels: list[str] = []
    for name in header:
        if _is_index_column(name) or name in ("UTC time", "carbon_intensity", "carbon_from_src_forecasts"):
            continue
        match = _DACF_FUEL.match(name)
        if not match or match["fuel"] not in FUELS:
            raise LoadError(
                path,
                f"unknown column (expected avg_<fuel>_production_forecast, fuel in {list(FUELS)})",
                row=1,
                field=name,
            )
        fuels.append(match["fuel"])
    columns = [
        TIME_UTC,
        Column("carbon_intensity", min_value=0.0, max_value=MAX_CI_GCO2_PER_KWH, rename="carbon_intensity_actual"),
        Column(
            "carbon_from_src_forecasts", min_value=0.0, max_value=MAX_CI_GCO2_PER_KWH, rename="carbon_intensity_direct"
        ),
    ] + [Column(f"avg_{f}_production_forecast", min_value=0.0, rename=f"{f}_mw") for f in fuels]
    read = _on_the_hour(_read(path, columns))
    frame = read.frame
    scale = 4.0 if region in SCALED_DIV4 else 1.0
    targets = ["carbon_intensity_actual", "carbon_intensity_direct"] + [f"{f}_mw" for f in fuels]
    wide = frame[targets].astype("float64")
    wide[[f"{f}_mw" for f in fuels]] /= scale
    k, n = len(targets), len(frame)
    units = ["gco2_per_kwh", "gco2_per_kwh"] + ["mw"] * len(fuels)
    publishers = [_dacf_publisher(region, t) for t in targets]
    out = pd.DataFrame(
        {
            "region": pd.Series([region] * (n * k), dtype=_TEXT),
            "hour_utc": _hours(frame["hour_utc"]).repeat(k),
            "target": pd.Series(np.tile(np.array(targets, dtype=object), n), dtype=_TEXT),
            "value": wide.to_numpy(dtype="float64").ravel(),
            "unit": pd.Series(np.tile(np.array(units, dtype=object), n), dtype=_TEXT),
            "publisher": pd.Series(np.tile(np.array(publishers, dtype=object), n), dtype=_TEXT),
            "data_source": pd.Series([data_source] * (n * k), dtype=_TEXT),
        }
    )
    return Batch(FORECAST_TABLE, _batch_id(source, root, path), source, out[FORECAST_COLUMNS], read.rejections)


# ---------------------------------------------------------------------------------------------------------------
# GB (lets-wait-awhile)


def _gb_folder(root: Path) -> Path:
    return Path(root) / "grid" / "lets_wait_awhile"


def _gb_files(root: Path) -> list[Path]:
    folder = _gb_folder(root)
    return [p for p in (folder / "gb_ci.csv", folder / "gb_production.csv") if p.exists()]


def _sub_hourly(read: _Read) -> tuple[_Read, pd.DatetimeIndex, np.ndarray]:
    """Reject timestamps off the 15-minute grid; return each row's hour and its slot bit (1 << quarter)."""
    ts = read.frame["ts"]
    off = (ts.dt.minute % 15 != 0) | (ts.dt.second != 0) | (ts.dt.microsecond != 0) | (ts.dt.nanosecond != 0)
    read = _drop(read, off.to_numpy(), "ts", "timestamp is not on a 15-minute boundary")
    ts = read.frame["ts"]
    hours = _hours(ts.dt.floor("h"))
    bits = np.left_shift(1, (ts.dt.minute // 15).to_numpy(dtype="int64"))
    return read, hours, bits


def _hourly_mean(values: pd.DataFrame, hours: pd.DatetimeIndex, bits: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """Mean per hour, and a partial-hour mask (slots other than {:00,:30} or {:00,:15,:30,:45})."""
    grouped = values.set_axis(hours).groupby(level=0, sort=True)
    means = grouped.mean()
    slots = pd.Series(bits, index=hours).groupby(level=0, sort=True).sum().reindex(means.index)
    partial = ~np.isin(slots.to_numpy(), GB_COMPLETE_SLOTS)
    return means, partial


def _gb_batches(root: Path) -> Iterator[Batch]:
    root = Path(root)
    source, data_source = "grid_gb", "lets_wait_awhile"
    folder = _gb_folder(root)
    ci_path, prod_path = folder / "gb_ci.csv", folder / "gb_production.csv"

    production_columns = list(GB_FUEL_MAP) + list(GB_EXCLUDED_STORAGE)
    prod = _read(
        prod_path,
        [Column("Unnamed: 0", "timestamp", rename="ts", aliases=("",))]
        + [Column(c, min_value=0.0) for c in production_columns]
        + [Column(c, nullable=True) for c in GB_INTERCONNECTORS],
        key="ts",
    )
    prod, prod_hours, prod_bits = _sub_hourly(prod)
    imports_missing_hours = prod_hours[prod.frame[list(GB_INTERCONNECTORS)].isna().any(axis=1).to_numpy()].unique()

    # -- gb_ci.csv: lifecycle, consumption-based
    ci = _read(
        ci_path,
        [
            Column("Time", "timestamp", rename="ts"),
            Column("Carbon Intensity", min_value=0.0, max_value=MAX_CI_GCO2_PER_KWH, rename="ci"),
        ],
        key="ts",
    )
    ci, ci_hours, ci_bits = _sub_hourly(ci)
    ci_hourly, ci_partial = _hourly_mean(ci.frame[["ci"]].astype("float64"), ci_hours, ci_bits)
    no_imports = ci_hourly.index.isin(imports_missing_hours)
    yield Batch(
        CI_TABLE,
        _batch_id(source, root, ci_path),
        source,
        _ci_frame(
            GB_REGION,
            ci_hourly.index,
            ci_hourly["ci"].to_numpy(),
            basis="consumption",
            scope="lifecycle",
            data_source=data_source,
            flags=_flags(len(ci_hourly), ("partial_hour", ci_partial), ("imports_missing", no_imports)),
        ),
        ci.rejections,
    )

    # -- gb_production.csv: generation by contract fuel (pumped storage and interconnectors excluded)
    fuels = list(dict.fromkeys(GB_FUEL_MAP.values()))
    sub = pd.DataFrame({f: 0.0 for f in fuels}, index=prod.frame.index)
    for column, fuel in GB_FUEL_MAP.items():
        sub[fuel] = sub[fuel] + prod.frame[column].astype("float64")
    mix, partial = _hourly_mean(sub, prod_hours, prod_bits)
    yield Batch(
        GENERATION_TABLE,
        _batch_id(source, root, prod_path),
        source,
        _generation_frame(GB_REGION, mix.index, mix, data_source, _flags(len(mix), ("partial_hour", partial))),
        prod.rejections,
    )

    # -- production-based CI recomputed from the hourly mix with the CarbonCast factors
    frames = []
    for scope, factors in (("direct", CARBONCAST_DIRECT), ("lifecycle", CARBONCAST_LIFECYCLE)):
        values = intensity_from_mix(mix, factors)
        ok = values.notna().to_numpy()
        frames.append(
            _ci_frame(
                GB_REGION,
                mix.index[ok],
                values.to_numpy()[ok],
                basis="production",
                scope=scope,
                data_source=data_source,
                flags=_flags(int(ok.sum()), ("recomputed_from_mix", True), ("partial_hour", partial[ok])),
            )
        )
    yield Batch(
        CI_TABLE,
        _batch_id(source, root, prod_path),
        source,
        pd.concat(frames, ignore_index=True),
        prod.rejections,
    )


SOURCES: list[Source] = [
    Source(
        name="grid_ensembleci",
        group="grid",
        description="EnsembleCI/CarbonCast hourly CI (direct+lifecycle), generation by fuel, weather; 10 regions",
        batches=_ensembleci_batches,
        files=_ensembleci_files,
    ),
    Source(
        name="grid_dacf",
        group="grid",
        description="DACF published day-ahead forecasts (CI, generation per fuel) and actual CI, Jul-Dec 2021",
        batches=_dacf_batches,
        files=_dacf_files,
    ),
    Source(
        name="grid_gb",
        group="grid",
        description="Great Britain (ENTSO-E via Let's Wait Awhile): CI and generation, sub-hourly -> hourly",
        batches=_gb_batches,
        files=_gb_files,
    ),
]

__all__ = ["SOURCES", "ensembleci_regions"]
