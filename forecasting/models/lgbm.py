"""LightGBM direct multi-horizon forecaster with quantile objectives.

One model per (region, quantile): every training row is one (issue hour T, horizon h) pair, target hour
t = T + h − 1. Features, all computed by index arithmetic on one region's hourly arrays so that an observed value
is only ever read at an index < T (asserted):

* lags known at T: the last value, means of the last 24 h and 168 h, the same hour on the last fully known day and
  the day before, the mean of that hour over the last 7 known days, the same hour last week, the recent anomaly
  (last value − the same hour a day earlier); for carbon intensity also the last day's wind/solar/total generation
  and renewable share;
* known-future inputs at t: the GFS weather forecast at t − 1, t, t + 1 (the US files may label hours by their end)
  and its daily mean around t, the calendar in local time (hour, weekday, day of year, public holiday), the horizon;
* optionally the grid operator's published day-ahead forecast of the target (`published_solar_mw`,
  `published_wind_mw`) where it is known at T (`forecasting.data.mask_known`).

Carbon intensity is learnt as a ratio to its mean over the last week (`target_transform="ratio"`), so a level shift
such as Germany's autumn-2021 move from gas to coal does not fall outside the trees' range. Solar and wind are learnt
as a ratio to a capacity proxy (`"capacity"`: the 98th percentile of the output over the last 45 days, known at
issued_at), because the fleets grew fast in 2019–2021. Regions without weather (PJM, ISNE in the files) train
without the weather features.

The day ahead (horizons 1–24) and the later horizons (25–96, every third one in training) get separate boosters.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field

import holidays
import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.base import QUANTILES, Forecaster, target_column
from forecasting.data import PUBLISHED_FOR, WEATHER_COLUMNS, issue_hour, mask_known, published_known_until
from forecasting.models.frames import empty_forecast, quantile_frame

REGION_TZ = {
    "CISO": "America/Los_Angeles",
    "ERCO": "America/Chicago",
    "PJM": "America/New_York",
    "ISNE": "America/New_York",
    "MISO": "America/Chicago",
    "DE": "Europe/Berlin",
    "ES": "Europe/Madrid",
    "NL": "Europe/Amsterdam",
    "PL": "Europe/Warsaw",
    "SE": "Europe/Stockholm",
    "GB": "Europe/London",
}
REGION_COUNTRY = {
    "CISO": "US",
    "ERCO": "US",
    "PJM": "US",
    "ISNE": "US",
    "MISO": "US",
    "DE": "DE",
    "ES": "ES",
    "NL": "NL",
    "PL": "PL",
    "SE": "SE",
    "GB": "GB",
}
CONTEXT_HOURS = 24 * 8 + 24  # the longest look-back of the lag features
CAPACITY_DAYS = 45  # window of the capacity proxy (solar/wind targets): predict needs this much history


def lgbm_threads() -> int:
    """LightGBM threads: FORECAST_THREADS, default 1 (more threads than free cores slow LightGBM down badly)."""
    return int(os.environ.get("FORECAST_THREADS", "1"))


class RegionSeries:
    """One region's columns as contiguous hourly numpy arrays, index 0 = `start`."""

    def __init__(self, frame: pd.DataFrame, columns, until: pd.Timestamp | None = None):
        frame = frame.sort_values("hour_utc")
        self.start = frame["hour_utc"].iloc[0]
        last = frame["hour_utc"].iloc[-1]
        if until is not None and until > last:
            last = until
        self.n = int((last - self.start) / HOUR) + 1
        pos = ((frame["hour_utc"] - self.start) / HOUR).to_numpy().astype(np.int64)
        self.arrays: dict[str, np.ndarray] = {}
        for col in columns:
            arr = np.full(self.n, np.nan)
            if col in frame.columns:
                arr[pos] = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            self.arrays[col] = arr

    @property
    def hours(self) -> pd.DatetimeIndex:
        return pd.date_range(self.start, periods=self.n, freq="h")

    def index(self, ts: pd.Timestamp) -> int:
        return int((pd.Timestamp(ts) - self.start) / HOUR)

    def add_capacity(self, col: str, name: str, days: int = CAPACITY_DAYS, q: float = 0.98) -> None:
        """`name`[i] = the q-quantile of `col` over the `days` before and including i: a proxy of the installed
        capacity (wind and solar fleets grew fast in 2019–2021), observed like the target itself."""
        values = pd.Series(self.arrays[col])
        self.arrays[name] = values.rolling(24 * days, min_periods=24 * 14).quantile(q).to_numpy()

    def has(self, col: str) -> bool:
        return col in self.arrays and bool(np.isfinite(self.arrays[col]).any())

    def take(self, col: str, idx: np.ndarray) -> np.ndarray:
        arr = self.arrays[col]
        ok = (idx >= 0) & (idx < self.n)
        out = np.full(idx.shape, np.nan)
        out[ok] = arr[idx[ok]]
        return out

    def window_mean(self, col: str, end_excl: np.ndarray, length: int) -> np.ndarray:
        """Mean of col over [end_excl − length, end_excl) per entry (NaN-aware; NaN when nothing is known)."""
        arr = self.arrays[col]
        valid = np.isfinite(arr)
        csum = np.concatenate([[0.0], np.cumsum(np.where(valid, arr, 0.0))])
        ccnt = np.concatenate([[0], np.cumsum(valid)])
        hi = np.clip(end_excl, 0, self.n)
        lo = np.clip(end_excl - length, 0, self.n)
        cnt = ccnt[hi] - ccnt[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, (csum[hi] - csum[lo]) / np.maximum(cnt, 1), np.nan)


@functools.lru_cache(maxsize=256)
def _holiday_dates(region: str, years: tuple) -> frozenset:
    country = REGION_COUNTRY.get(region)
    if country is None:
        return frozenset()
    try:
        return frozenset(holidays.country_holidays(country, years=list(years)))
    except NotImplementedError:  # pragma: no cover - a country the holidays package does not know
        return frozenset()


@dataclass
class FeatureSpec:
    target_col: str
    weather: tuple = ()
    context_cols: tuple = ()  # other observed columns summarised over the last day
    published_col: str | None = None
    exog_cols: tuple = ()  # extra known-future columns supplied by the caller (e.g. a forecast of another series)
    scale_col: str | None = None  # a derived observed column (the capacity proxy) used to scale the target
    names: list = field(default_factory=list)


def build_features(
    series: RegionSeries,
    region: str,
    issue_idx: np.ndarray,
    horizons: np.ndarray,
    spec: FeatureSpec,
    published_until_idx: np.ndarray | None = None,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Feature rows for every (issue index T, horizon h); returns (X, target index t, issue index T)."""
    T = np.repeat(issue_idx.astype(np.int64), len(horizons))
    h = np.tile(horizons.astype(np.int64), len(issue_idx))
    t = T + h - 1
    y = spec.target_col
    feats: dict[str, np.ndarray] = {"horizon": h.astype(float)}

    def observed(col, idx):
        assert (idx < T).all(), "feature would read an observed value at or after issued_at"
        return series.take(col, idx)

    k = -(-h // 24)  # ceil(h / 24): the last day whose same hour is known
    feats["last"] = observed(y, T - 1)
    feats["mean_24h"] = series.window_mean(y, T, 24)
    feats["mean_168h"] = series.window_mean(y, T, 168)
    feats["same_hour_last_day"] = observed(y, t - 24 * k)
    feats["same_hour_day_before"] = observed(y, t - 24 * (k + 1))
    feats["same_hour_last_week"] = observed(y, t - 168)
    stack = np.vstack([observed(y, t - 24 * (k + j)) for j in range(7)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        feats["same_hour_mean_7d"] = np.nanmean(stack, axis=0)
    feats["anomaly_last"] = feats["last"] - observed(y, T - 25)
    for col in spec.context_cols:
        feats[f"{col}_mean_24h"] = series.window_mean(col, T, 24)
        feats[f"{col}_last"] = observed(col, T - 1)
    for col in spec.weather:
        for shift, tag in ((0, ""), (-1, "_m1"), (1, "_p1"), (2, "_p2")):
            feats[f"{col}{tag}"] = series.take(col, t + shift)
        feats[f"{col}_day_mean"] = series.window_mean(col, t + 12, 24)
    if "wind_speed_m_per_s" in spec.weather:
        ws = "wind_speed_m_per_s"
        feats["wind_speed_6h_mean"] = series.window_mean(ws, t + 3, 6)
        feats["wind_speed_change_24h"] = feats[ws] - series.take(ws, t - 24)
    if "temperature_k" in spec.weather and "dewpoint_k" in spec.weather:
        feats["dewpoint_spread"] = feats["temperature_k"] - feats["dewpoint_k"]
    if spec.scale_col:
        feats["capacity"] = observed(spec.scale_col, T - 1)
    for col in spec.exog_cols:
        feats[col] = series.take(col, t)
    if spec.published_col is not None:
        pub = series.take(spec.published_col, t)
        if published_until_idx is not None:
            pub = np.where(t < np.repeat(published_until_idx, len(horizons)), pub, np.nan)
        feats["published"] = pub
    # Calendar at the target hour, in local time.
    times = pd.DatetimeIndex(series.start + t * HOUR)
    local = times.tz_convert(REGION_TZ.get(region, "UTC"))
    feats["hour_local"] = local.hour.to_numpy(dtype=float)
    feats["dow_local"] = local.dayofweek.to_numpy(dtype=float)
    feats["doy"] = local.dayofyear.to_numpy(dtype=float)
    hol = _holiday_dates(region, tuple(range(local.year.min(), local.year.max() + 1)))
    if hol:
        days = local.normalize().tz_localize(None).unique()
        flags = dict(zip(days, [d.date() in hol for d in days]))
        feats["holiday"] = local.normalize().tz_localize(None).map(flags).to_numpy(dtype=float)
    else:
        feats["holiday"] = np.zeros(len(t))
    X = pd.DataFrame(feats)
    return X, t, T


@dataclass
class _RegionModel:
    spec: FeatureSpec
    boosters: dict
    columns: list
    scale_eps: float
    nonnegative: bool


class LGBMForecaster(Forecaster):
    """Per-region LightGBM with quantile objectives (P10, P50, P90), direct over horizons 1…`horizon`."""

    name = "lgbm"

    def __init__(
        self,
        horizon: int = 96,
        n_estimators: int = 300,
        learning_rate: float = 0.05,
        num_leaves: int = 31,
        min_child_samples: int = 40,
        issue_hours: tuple = (0, 12),
        target_transform: str = "auto",
        use_weather: bool = True,
        use_published: bool = False,
        context_cols: tuple | None = None,
        exog_cols: tuple = (),
        quantiles: tuple = QUANTILES,
        objective: str = "quantile",
        history_days: int | None = None,
        long_horizon_stride: int = 3,
        name: str | None = None,
        seed: int = 0,
        min_history_h: int = 24 * 30,
        context_h: int = CONTEXT_HOURS,
    ):
        self.horizon = horizon
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.issue_hours = tuple(issue_hours)
        self.target_transform = target_transform
        self.use_weather = use_weather
        self.use_published = use_published
        self.context_cols = context_cols
        self.exog_cols = tuple(exog_cols)
        self.quantiles = tuple(quantiles)
        self.objective = objective
        self.history_days = history_days
        self.long_horizon_stride = long_horizon_stride
        self.seed = seed
        self.min_history_h = min_history_h  # observed hours a region's series needs to be fitted
        # the first training issue: lag features that reach further back are missing (LightGBM takes NaN)
        self.context_h = context_h
        if name:
            self.name = name
        self._models: dict[str, _RegionModel] = {}
        self._target = None

    # ------------------------------------------------------------------------------------------------------ fit
    def _transform(self, col: str) -> str:
        if self.target_transform != "auto":
            return self.target_transform
        if col.startswith("carbon_intensity"):
            return "ratio"
        return "capacity" if col in ("solar_mw", "wind_mw") else "none"

    def _spec(self, history_region: pd.DataFrame, col: str) -> FeatureSpec:
        weather = tuple(
            c
            for c in WEATHER_COLUMNS
            if self.use_weather and c in history_region and history_region[c].notna().mean() > 0.5
        )
        if self.context_cols is not None:
            context = tuple(self.context_cols)
        elif col.startswith("carbon_intensity"):
            context = ("wind_mw", "solar_mw", "total_generation_mw", "renewable_share")
        else:
            context = ()
        context = tuple(c for c in context if c in history_region and history_region[c].notna().any() and c != col)
        published = PUBLISHED_FOR.get(col) if self.use_published else None
        exog = tuple(c for c in self.exog_cols if c in history_region)
        scale_col = f"{col}__capacity" if self._transform(col) == "capacity" else None
        return FeatureSpec(col, weather, context, published, exog, scale_col)

    def _series_columns(self, spec: FeatureSpec) -> list[str]:
        cols = [spec.target_col, *spec.weather, *spec.context_cols, *spec.exog_cols]
        if spec.published_col:
            cols.append(spec.published_col)
        return list(dict.fromkeys(cols))

    def _params(self, alpha: float) -> dict:
        point = self.objective != "quantile"
        return dict(
            objective=self.objective if point else "quantile",
            **({} if point else {"alpha": alpha}),
            n_estimators=self.n_estimators,
            learning_rate=self.learning_rate,
            num_leaves=self.num_leaves,
            min_child_samples=self.min_child_samples,
            subsample=0.8,
            subsample_freq=1,
            colsample_bytree=0.8,
            reg_lambda=1.0,
            n_jobs=lgbm_threads(),
            random_state=self.seed,
            verbose=-1,
        )

    def training_rows(self, history: pd.DataFrame, region: str, col: str):
        """(X, y_transformed, scale, spec) for one region: issue hours at `issue_hours` UTC, horizons 1…horizon."""
        part = history[history["region"] == region]
        if self.history_days:
            part = part[part["hour_utc"] >= part["hour_utc"].max() - pd.Timedelta(days=self.history_days)]
        spec = self._spec(part, col)
        series = RegionSeries(
            part, self._series_columns(spec) + (["is_repeated_row"] if "is_repeated_row" in part else [])
        )
        self._prepare(series, spec)
        hours = pd.DatetimeIndex(series.hours)
        issue = np.flatnonzero(np.isin(hours.hour, self.issue_hours))
        issue = issue[(issue >= self.context_h)]
        horizons = np.arange(1, self.horizon + 1)
        # Beyond the day ahead every `long_horizon_stride`-th horizon is enough to learn from (trees treat the
        # horizon as a number); this halves the training rows for 96-hour models.
        horizons = horizons[(horizons <= 24) | ((horizons - 25) % max(self.long_horizon_stride, 1) == 0)]
        X, t, T = build_features(series, region, issue, horizons, spec)
        y = series.take(col, t)
        keep = np.isfinite(y) & (t < series.n)
        if "is_repeated_row" in series.arrays:  # forward-filled gaps are not real observations
            keep &= ~(series.take("is_repeated_row", t) == 1)
        scale = self._scale(X, col)
        y = y / scale
        keep &= np.isfinite(y)
        if spec.scale_col:
            keep &= np.isfinite(X["capacity"].to_numpy())
        return X[keep].reset_index(drop=True), y[keep], spec

    def _scale(self, X: pd.DataFrame, col: str) -> np.ndarray:
        transform = self._transform(col)
        if transform == "ratio":
            s = X["mean_168h"].to_numpy()
            return np.where(np.isfinite(s) & (s > 0), s, np.nan)
        if transform == "capacity":
            s = X["capacity"].to_numpy()
            recent = X["mean_168h"].to_numpy(dtype=float)
            # the mix's plug-ins forecast regions without that source too (all NaN): scale 1, no warning
            fallback = np.nanmax(recent) if np.isfinite(recent).any() else 1.0
            return np.where(np.isfinite(s) & (s > 0), s, fallback if np.isfinite(fallback) and fallback > 0 else 1.0)
        return np.ones(len(X))

    @staticmethod
    def _prepare(series: RegionSeries, spec: FeatureSpec) -> None:
        if spec.scale_col:
            series.add_capacity(spec.target_col, spec.scale_col)

    def fit(self, history: pd.DataFrame, target: str) -> LGBMForecaster:
        import lightgbm as lgb  # noqa: PLC0415 - LightGBM loads only for its forecaster

        col = target_column(target)
        self._target = target
        self._models = {}
        for region in sorted(history["region"].unique()):
            part = history[history["region"] == region]
            if part[col].notna().sum() < self.min_history_h:
                continue  # the region does not have this series (e.g. SE solar)
            X, y, spec = self.training_rows(history, region, col)
            boosters = {}
            h = X["horizon"].to_numpy()
            for block, (lo, hi) in enumerate(self.blocks()):
                rows = (h >= lo) & (h <= hi)
                if not rows.any():
                    continue
                for q in self.quantiles:
                    model = lgb.LGBMRegressor(**self._params(q))
                    model.fit(X[rows], y[rows])
                    boosters[(block, q)] = model
            self._models[region] = _RegionModel(spec, boosters, list(X.columns), 1e-6, True)
        return self

    def blocks(self) -> list[tuple[int, int]]:
        """Horizon blocks with separate boosters: the day ahead (1–24) and beyond (25–horizon), so that the many
        later horizons do not dilute the day ahead."""
        if self.horizon <= 24:
            return [(1, self.horizon)]
        return [(1, 24), (25, self.horizon)]

    # -------------------------------------------------------------------------------------------------- predict
    @property
    def regions(self) -> list[str]:
        return list(self._models)

    def predict_region(
        self, region: str, T0: pd.Timestamp, horizon: int, part: pd.DataFrame, exog: dict[str, np.ndarray] | None = None
    ) -> dict[float, np.ndarray] | None:
        """Quantile arrays (alpha → values for horizons 1…horizon) for one region; `part` must already be masked.

        `exog` supplies values of the model's exog columns for the forecast hours (e.g. plug-in forecasts)."""
        model = self._models.get(region)
        if model is None or part.empty:
            return None
        col = target_column(self._target)
        last = T0 + (horizon - 1) * HOUR
        series = RegionSeries(part, self._series_columns(model.spec), until=last)
        self._prepare(series, model.spec)
        Ti = series.index(T0)
        if exog:
            for name, values in exog.items():
                if name in series.arrays:
                    idx = Ti + np.arange(len(values))
                    ok = (idx >= 0) & (idx < series.n)
                    series.arrays[name][idx[ok]] = np.asarray(values, dtype=float)[ok]
        published_until = None
        if model.spec.published_col:
            published_until = np.array([series.index(published_known_until(T0, region))])
        X, t, _ = build_features(series, region, np.array([Ti]), np.arange(1, horizon + 1), model.spec, published_until)
        scale = self._scale(X, col)
        h = X["horizon"].to_numpy()
        out = {alpha: np.full(len(X), np.nan) for alpha in self.quantiles}
        for block, (lo, hi) in enumerate(self.blocks()):
            rows = (h >= lo) & (h <= hi)
            if block == len(self.blocks()) - 1:
                rows |= h > hi  # beyond the trained horizon: the last block extrapolates
            if not rows.any():
                continue
            Xb = X.loc[rows, model.columns]
            for alpha in self.quantiles:
                booster = model.boosters.get((block, alpha))
                if booster is not None:
                    out[alpha][rows] = booster.predict(Xb) * scale[rows]
        return out

    def predict(self, issued_at, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        T0 = issue_hour(issued_at)
        data = mask_known(data, T0)
        out = []
        for region in self._models:
            q = self.predict_region(region, T0, horizon, data[data["region"] == region])
            if q is not None:
                out.append(quantile_frame(region, T0, horizon, q, self.name, nonnegative=True))
        return pd.concat(out, ignore_index=True) if out else empty_forecast()
