"""Grid actuals and the carbon-intensity forecasts a plan is made from.

Signal: production-based, direct, average carbon intensity (`marts.grid_hourly.carbon_intensity_direct_gco2_per_kwh`;
`forecasting.data.grid_hourly_from_files` builds the same frame from the CSVs when the warehouse lacks the mart). With
`signal="marginal"` (the fleet file's `signal`), the marginal column instead
(`carbon_intensity_marginal_gco2_per_kwh`, WattTime's MOER through the live feeds; warehouse only, and every zone
must have it).

Forecast providers answer `at(now, hours) -> (F, version, meta)`: F is (hours, zones) gCO2e/kWh for the hours
now, now+1h, ... known at `now` (planning never reads the wall clock: `now` is an argument):

* `naive`      seasonal naive from actuals known at `now`: the same hour on the last fully known day (for the
               next 24 h that is "same hour yesterday"; further hours repeat that day).
* `warehouse`  `forecast.forecasts` (written by forecasting/service.py), target `carbon_intensity`, p50 of the
               latest issue at or before `now` per zone; hours it does not cover -> naive (counted as fallback).
* `dacf`       the DACF published day-ahead forecasts (Jul-Dec 2021; CISO ERCO ISNE PJM SE DE): known for the UTC
               day of `now` (published the day before, as forecasting.data treats the operators' forecasts); later
               hours and other zones -> naive.
* `oracle`     the actual intensity (perfect forecast; the optimum's knowledge, for diagnostics).
* `live`       a live feed's own forecast of the marginal signal (`staging.stg_grid__live_forecasts`, WattTime),
               latest issue at or before `now` per zone; hours it does not cover -> naive (counted as fallback).
* `auto`       warehouse when it holds rows for the zones and period, else dacf when the period lies in its
               coverage, else naive.

`meta["fallback_share"]` is the share of forecast cells that came from the naive fallback.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from common.timeutil import utc
from forecasting.data import grid_hourly, load_published_forecasts
from forecasting.store import STORED_PREFIX, read_forecasts
from warehouse.db import reader, table_exists

HOUR = pd.Timedelta(hours=1)
CI_COLUMN = "carbon_intensity_direct_gco2_per_kwh"
SIGNAL_COLUMNS = {"average": CI_COLUMN, "marginal": "carbon_intensity_marginal_gco2_per_kwh"}
SIGNAL = "average, production-based, direct (scope 1) carbon intensity, gCO2e/kWh (marts.grid_hourly)"


@dataclass
class GridSeries:
    """Hourly actuals per zone on a dense hour axis starting at `t0`: `ci` and `renewable` (T, Z)."""

    t0: pd.Timestamp
    zones: list[str]
    ci: np.ndarray
    renewable: np.ndarray
    source: str = "files"
    filled: dict = field(default_factory=dict)
    signal: str = "average"

    @property
    def n_hours(self) -> int:
        return int(self.ci.shape[0])

    @property
    def end(self) -> pd.Timestamp:
        return self.t0 + self.n_hours * HOUR

    def index(self, ts) -> int:
        return int((utc(ts) - self.t0) / HOUR)

    def zone_index(self, zones) -> np.ndarray:
        pos = {z: i for i, z in enumerate(self.zones)}
        missing = [z for z in zones if z not in pos]
        if missing:
            raise KeyError(f"no grid data for zone(s) {missing}")
        return np.array([pos[z] for z in zones], dtype=np.int64)

    def window(self, start, hours: int, zones=None, what: str = "ci") -> np.ndarray:
        """(hours, Z) actual values from `start` (rows past the data repeat the last day)."""
        arr = self.ci if what == "ci" else self.renewable
        i0 = self.index(start)
        idx = np.arange(i0, i0 + hours)
        idx = _clamp_seasonal(idx, self.n_hours)
        out = arr[idx]
        return out if zones is None else out[:, self.zone_index(zones)]

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, zones, source: str = "frame", signal: str = "average") -> GridSeries:
        zones = list(zones)
        have = set(frame["region"].unique())
        missing = [z for z in zones if z not in have]
        if missing:
            raise ValueError(f"grid data lacks zone(s) {missing} (have {sorted(have)})")
        if signal not in SIGNAL_COLUMNS:
            raise ValueError(f"unknown carbon signal {signal!r}; known: {', '.join(SIGNAL_COLUMNS)}")
        column = SIGNAL_COLUMNS[signal]
        frame = frame[frame["region"].isin(zones)]
        present = frame.dropna(subset=[column])["region"].unique() if column in frame.columns else []
        absent = [z for z in zones if z not in set(present)]
        if signal != "average" and absent:
            raise ValueError(
                f"signal {signal}: no {column} for zone(s) {absent} in the {source} grid data; the marginal signal "
                f"comes from WattTime through the live feeds (warehouse/connectors/feeds.yaml), the grid files hold "
                f"average intensity only. Use signal: average, or plan only zones with marginal data"
            )
        hours = pd.to_datetime(frame["hour_utc"], utc=True)
        t0, t1 = hours.min(), hours.max()
        axis = pd.date_range(t0, t1, freq="h")
        ci = frame.pivot_table(index="hour_utc", columns="region", values=column, aggfunc="mean")
        ci.index = pd.to_datetime(ci.index, utc=True)
        ci = ci.reindex(index=axis, columns=zones)
        ren_col = "renewable_share"
        if ren_col in frame.columns:
            ren = frame.pivot_table(index="hour_utc", columns="region", values=ren_col, aggfunc="mean")
            ren.index = pd.to_datetime(ren.index, utc=True)
            ren = ren.reindex(index=axis, columns=zones)
        else:
            ren = pd.DataFrame(np.nan, index=axis, columns=zones)
        filled = {z: int(ci[z].isna().sum()) for z in zones if ci[z].isna().any()}
        ci = ci.interpolate(limit_direction="both")
        ren = ren.interpolate(limit_direction="both").fillna(0.0)
        return cls(utc(t0), zones, ci.to_numpy(float), ren.to_numpy(float), source, filled, signal)

    @classmethod
    def load(
        cls,
        zones,
        start,
        end,
        source: str = "auto",
        data_dir=None,
        db_path=None,
        history_days: int = 8,
        signal: str = "average",
    ) -> GridSeries:
        """Actuals of `signal` for [start - history_days, end) from marts.grid_hourly (`source`
        warehouse|files|auto)."""
        lo = utc(start) - pd.Timedelta(days=history_days)
        frame = grid_hourly(list(zones), start=lo, end=utc(end), source=source, db_path=db_path, data_dir=data_dir)
        if frame.empty:
            raise ValueError(f"no grid data for {list(zones)} in [{lo}, {end})")
        used = "warehouse" if source == "warehouse" else source
        return cls.from_frame(frame, zones, source=used, signal=signal)


def _clamp_seasonal(idx: np.ndarray, n: int) -> np.ndarray:
    """Indices past the end of the data fall back by whole days (repeat the last day)."""
    idx = np.asarray(idx, dtype=np.int64)
    over = idx >= n
    if over.any():
        back = ((idx[over] - n) // 24 + 1) * 24
        idx = idx.copy()
        idx[over] = idx[over] - back
    return np.clip(idx, 0, n - 1)


class ForecastProvider(ABC):
    """What the planner believes the intensity will be: `at(now, hours)` → (hours × zones array, version, info)."""

    name = "base"

    def __init__(self, grid: GridSeries, zones):
        self.grid = grid
        self.zones = list(zones)
        self.zidx = grid.zone_index(self.zones)

    def naive(self, now, hours: int) -> np.ndarray:
        """Seasonal naive at `now`: value(now + h) = actual(now - 24 + (h mod 24))."""
        i0 = self.grid.index(now)
        h = np.arange(hours)
        idx = i0 - 24 + (h % 24)
        if idx.min() < 0:
            raise ValueError(f"naive forecast at {now} needs actuals from {utc(now) - 24 * HOUR}")
        return self.grid.ci[_clamp_seasonal(idx, self.grid.n_hours)][:, self.zidx]

    @abstractmethod
    def at(self, now, hours: int) -> tuple[np.ndarray, str, dict]:
        """Forecast for hours now … now + hours − 1 in every zone, the version label, and facts about it."""

    def describe(self) -> dict:
        return {"kind": self.name}


class NaiveForecast(ForecastProvider):
    name = "naive"

    def at(self, now, hours):
        return self.naive(now, hours), f"naive-24@{utc(now).isoformat()}", {"fallback_share": 1.0}


class OracleForecast(ForecastProvider):
    name = "oracle"

    def at(self, now, hours):
        return self.grid.window(now, hours)[:, self.zidx], "oracle-actuals", {"fallback_share": 0.0}


class PublishedForecast(ForecastProvider):
    """DACF's published day-ahead carbon-intensity forecast, known for the UTC day of `now`."""

    name = "dacf"

    def __init__(self, grid: GridSeries, zones, published: pd.DataFrame):
        super().__init__(grid, zones)
        pub = published[published["target"] == "carbon_intensity_direct"]
        self.covered = [z for z in self.zones if z in set(pub["region"])]
        wide = pub.pivot_table(index="hour_utc", columns="region", values="value", aggfunc="first")
        wide.index = pd.to_datetime(wide.index, utc=True)
        self.t0 = wide.index.min() if len(wide) else grid.t0
        axis = pd.date_range(self.t0, wide.index.max(), freq="h") if len(wide) else pd.DatetimeIndex([])
        wide = wide.reindex(index=axis, columns=self.zones)
        self.values = wide.to_numpy(float)  # NaN where not published
        self.end = self.t0 + len(axis) * HOUR if len(axis) else self.t0

    def at(self, now, hours):
        now = utc(now)
        out = self.naive(now, hours)
        known_until = now.floor("D") + pd.Timedelta(days=1)
        n_known = int(min(hours, max(0, (known_until - now) / HOUR)))
        used = np.zeros_like(out, dtype=bool)
        if n_known and now >= self.t0 and now < self.end:
            i0 = int((now - self.t0) / HOUR)
            i1 = min(i0 + n_known, self.values.shape[0])
            block = self.values[i0:i1]
            ok = np.isfinite(block)
            out[: i1 - i0][ok] = block[ok]
            used[: i1 - i0] = ok
        return out, f"dacf-published@{now.floor('D').isoformat()}+naive-24", {"fallback_share": float(1 - used.mean())}

    def describe(self):
        return {
            "kind": self.name,
            "zones_with_published": self.covered,
            "known_for": "the rest of the UTC day of the planning hour; later hours seasonal naive",
        }


class WarehouseForecast(ForecastProvider):
    """p50 of `forecast.forecasts` (target carbon_intensity, one model), latest issue at or before `now`."""

    name = "warehouse"
    table = "forecast.forecasts"

    def __init__(self, grid: GridSeries, zones, rows: pd.DataFrame, model: str):
        super().__init__(grid, zones)
        self.model = model
        rows = rows[rows["region"].isin(self.zones)].copy()
        rows["issued_at"] = pd.to_datetime(rows["issued_at"], utc=True)
        rows["target_time"] = pd.to_datetime(rows["target_time"], utc=True)
        self.rows = rows
        self.issues = {}
        for (zone, issued), part in rows.groupby(["region", "issued_at"], sort=True):
            self.issues.setdefault(zone, []).append((issued, part))
        self.versions = sorted({str(v) for v in rows.get("model_version", pd.Series(dtype=object)).dropna()})

    def at(self, now, hours):
        now = utc(now)
        out = self.naive(now, hours)
        used = np.zeros_like(out, dtype=bool)
        issued_used, versions_used = [], set()
        axis = now + np.arange(hours) * HOUR
        for zi, zone in enumerate(self.zones):
            lst = self.issues.get(zone, [])
            best = None
            for issued, part in lst:
                if issued <= now:
                    best = (issued, part)
                else:
                    break
            if best is None:
                continue
            issued, part = best
            part = part[(part["target_time"] >= now) & (part["target_time"] < axis[-1] + HOUR)]
            if "is_fallback" in part.columns:
                part = part[~part["is_fallback"].fillna(False).astype(bool)]
            if part.empty:
                continue
            pos = ((part["target_time"] - now) / HOUR).astype(int).to_numpy()
            val = part["p50"].to_numpy(float)
            ok = np.isfinite(val)
            out[pos[ok], zi] = val[ok]
            used[pos[ok], zi] = True
            issued_used.append(issued)
            if "model_version" in part.columns:
                versions_used.update(str(v) for v in part["model_version"].dropna().unique())
        last = max(issued_used).isoformat() if issued_used else "none"
        # The versions of the issues this plan used (not every version read), so an explanation names its forecast.
        label = "|".join(sorted(versions_used)) or ("unversioned" if issued_used else "none")
        version = f"{self.table}:{self.model}:{label}@{last}+naive-24"
        return out, version, {"fallback_share": float(1 - used.mean())}

    def describe(self):
        return {"kind": self.name, "model": self.model, "model_versions": self.versions, "rows": int(len(self.rows))}


class LiveForecast(WarehouseForecast):
    """A live feed's own forecast of the marginal signal (WattTime), latest issue at or before `now` per zone."""

    name = "live"
    table = "staging.stg_grid__live_forecasts"


def live_forecast_rows(zones, start=None, end=None, db_path=None) -> pd.DataFrame:
    """The marginal forecasts the live feeds stored for `zones`, issued before `end`, in WarehouseForecast's shape
    (region, issued_at, target_time, p50, model_version = the feed); empty when the view does not exist."""
    where, params = ["signal_type = 'marginal'", f"region IN ({', '.join('?' for _ in zones)})"], list(zones)
    if end is not None:
        where.append("issued_at < ?")
        params.append(utc(end).to_pydatetime())
    if start is not None:
        where.append("hour_utc >= ?")
        params.append((utc(start) - pd.Timedelta(days=2)).to_pydatetime())
    sql = (
        "SELECT region, issued_at, hour_utc AS target_time, carbon_intensity_gco2_per_kwh AS p50, "
        f"data_source AS model_version FROM {LiveForecast.table} WHERE {' AND '.join(where)}"
    )
    try:
        with reader(db_path) as con:
            if not table_exists(con, LiveForecast.table):
                return pd.DataFrame(columns=["region", "issued_at", "target_time", "p50", "model_version"])
            return con.execute(sql, params).df()
    except FileNotFoundError:
        return pd.DataFrame(columns=["region", "issued_at", "target_time", "p50", "model_version"])


def make_forecasts(
    kind: str,
    grid: GridSeries,
    zones,
    start=None,
    end=None,
    db_path=None,
    data_dir=None,
    model: str | None = None,
    version: str | None = None,
) -> ForecastProvider:
    """A provider by kind (naive | oracle | dacf | warehouse | live | auto); see the module docstring.

    `version` (warehouse rows): None takes every model_version of the model, the latest issue winning (the hourly
    plan: whatever was issued last); BACKTEST takes the stored backtest (`python -m forecasting backtest --store`,
    versions labelled backtest-*) with the most issues in the period when there is one, else every version (an
    evaluation: one forecaster throughout, not a backtest with a forecast of the pipeline mixed in -- trained under a
    wall-clock budget, that one differs by host); any other value that version exactly.
    """
    zones = list(zones)
    if kind == "naive":
        return NaiveForecast(grid, zones)
    if kind == "oracle":
        return OracleForecast(grid, zones)
    if kind == "live":
        if grid.signal != "marginal":
            raise ValueError(f"the live feeds' forecasts are of the marginal signal; this grid is {grid.signal}")
        rows = live_forecast_rows(zones, start, end, db_path)
        if not len(rows):
            raise ValueError("staging.stg_grid__live_forecasts holds no marginal forecasts for these zones and period")
        return LiveForecast(grid, zones, rows, "watttime")
    if kind in ("warehouse", "auto"):
        rows, chosen = _warehouse_rows(zones, start, end, db_path, model, version)
        if rows is not None and len(rows):
            return WarehouseForecast(grid, zones, rows, chosen)
        if kind == "warehouse":
            raise ValueError("forecast.forecasts holds no carbon_intensity rows for these zones and period")
    if kind in ("dacf", "auto"):
        pub = load_published_forecasts(
            zones,
            start=utc(start) - pd.Timedelta(days=1) if start is not None else None,
            end=end,
            source="auto",
            db_path=db_path,
            data_dir=data_dir,
        )
        pub = pub[pub["target"] == "carbon_intensity_direct"] if len(pub) else pub
        if len(pub):
            covered = pub.groupby("region")["hour_utc"].agg(["min", "max"])
            ok = start is None or any((covered["min"] <= utc(start)) & (covered["max"] >= utc(start)))
            if ok or kind == "dacf":
                return PublishedForecast(grid, zones, pub)
        if kind == "dacf":
            raise ValueError("no DACF published forecasts for these zones and period")
    if kind == "auto":
        return NaiveForecast(grid, zones)
    raise ValueError(f"unknown forecast kind {kind!r}; known: naive, oracle, dacf, warehouse, live, auto")


PREFERRED_MODELS = ("ensemble", "lgbm", "mix", "tft", "prophet", "naive-24")
BACKTEST = "backtest"


def _warehouse_rows(zones, start, end, db_path, model, version=None):
    try:
        lo = utc(start) - pd.Timedelta(days=2) if start is not None else None
        rows = read_forecasts(
            model=model, target="carbon_intensity", regions=zones, issued_before=end, target_from=lo, db_path=db_path
        )
    except Exception:  # noqa: BLE001 - no warehouse / no table: fall through to other sources
        return None, None
    if rows is None or rows.empty:
        return None, None
    if model is None:
        have = list(dict.fromkeys(rows["model"]))
        model = next((m for m in PREFERRED_MODELS if m in have), have[0])
        rows = rows[rows["model"] == model]
    return one_version(rows, version, model), model


def one_version(rows: pd.DataFrame, version: str | None, model: str | None = None) -> pd.DataFrame:
    """`rows` of the model_version asked for (see `make_forecasts`); a clear error when it is absent."""
    if version is None or rows.empty:
        return rows

    versions = rows["model_version"].astype(str)
    if version == BACKTEST:
        backtests = rows[versions.str.startswith(STORED_PREFIX)]
        if backtests.empty:
            return rows
        issues = backtests.groupby(backtests["model_version"].astype(str))["issued_at"].nunique()
        # Most issues; among equals the latest label, so the choice does not depend on row order.
        version = max(issues.index, key=lambda v: (issues[v], v))
    elif version not in set(versions):
        raise ValueError(
            f"forecast.forecasts holds no carbon_intensity rows of model {model!r} version {version!r} "
            f"for these zones and period; versions present: {sorted(set(versions))}"
        )
    return rows[versions == version]
