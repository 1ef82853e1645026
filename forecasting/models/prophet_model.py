"""Prophet per region, with weather-forecast regressors and a residual correction from the latest observations.

Prophet alone is a curve fitter: trend + daily/weekly(/yearly) seasonality + linear regressor effects. It cannot
see that today is dirtier than usual, which is why it loses to persistence on day-ahead carbon intensity. Three
choices make it a usable forecaster under the `Forecaster` contract:

* **Flat trend** (`growth="flat"`): a linear trend extrapolated from the last changepoints drifts within months and
  is slow to fit; the level comes from the residual correction instead.
* **Residual correction** (an AR-style level adjustment): at `issued_at` the model knows the observed target
  before it, hence Prophet's recent residuals. Their means over the last `correction_windows_h` hours (1, 6, 24,
  168) form a vector `a`; for every horizon `h` coefficients `beta_h` are learnt on the training residuals by
  least squares (`resid[s+h-1] ~ beta_h · a_s` over every possible issue hour `s`), and P50 becomes
  `yhat + beta_h · a + median(corrected residual)`.
* **Empirical quantiles**: P10/P90 are the 10 %/90 % quantiles of the corrected training residuals per horizon,
  which are calibrated for this correction (Prophet's own interval ignores it; `interval="prophet"` uses the
  model's 80 % uncertainty interval instead).

Regressors are the known-future weather columns (GFS forecasts) a region actually has in its history (≥ 95 %
non-null); missing values are filled with the training mean. Generation-mix lags are not used as regressors:
Prophet needs a regressor's value for every forecast hour, so only lags ≥ the horizon (≥ 96 h) would be legal,
and the residual correction already carries the recent level, which is what a mix lag would contribute.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from forecasting.base import Forecaster, known_at, target_column
from forecasting.data import WEATHER_COLUMNS, issue_hour

_NONNEGATIVE_TARGETS = {"carbon_intensity", "solar", "wind"}


def _mute_stan_logging() -> None:
    """cmdstanpy's per-fit INFO lines and Prophet's import-time "Importing plotly failed" (plots are not used)."""
    for name in ("cmdstanpy", "prophet", "prophet.models"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.ERROR)
        logger.propagate = False
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    logging.getLogger("cmdstanpy").disabled = True


def _naive(ts: pd.Series) -> pd.Series:
    return ts.dt.tz_convert("UTC").dt.tz_localize(None)


class ProphetForecaster(Forecaster):
    """One Prophet model per region. See the module docstring for the residual correction and quantiles."""

    name = "prophet"

    def __init__(
        self,
        history_days: int | None = 730,
        growth: str = "flat",
        yearly_seasonality: bool | str = "auto",
        changepoint_prior_scale: float = 0.05,
        seasonality_mode: str = "additive",
        use_weather: bool = True,
        residual_correction: bool = True,
        correction_windows_h: tuple[int, ...] = (1, 6, 24, 168),
        max_horizon: int = 168,
        interval: str = "empirical",
        min_history_h: int = 24 * 14,
    ):
        if interval not in ("empirical", "prophet"):
            raise ValueError("interval must be 'empirical' or 'prophet'")
        self.history_days = history_days
        self.growth = growth
        self.yearly_seasonality = yearly_seasonality
        self.changepoint_prior_scale = changepoint_prior_scale
        self.seasonality_mode = seasonality_mode
        self.use_weather = use_weather
        self.residual_correction = residual_correction
        self.correction_windows_h = tuple(int(w) for w in correction_windows_h)
        self.max_horizon = max_horizon
        self.interval = interval
        self.min_history_h = min_history_h
        self._models: dict[str, object] = {}
        self._regressors: dict[str, list[str]] = {}
        self._fill: dict[str, dict[str, float]] = {}
        self._beta: dict[str, np.ndarray] = {}
        self._quantiles: dict[str, np.ndarray] = {}  # region -> (max_horizon, 3) residual quantiles
        self.target: str | None = None
        self.regions_: list[str] = []
        self.skipped_: dict[str, str] = {}
        self.trained_until_: pd.Timestamp | None = None

    # ------------------------------------------------------------------ fit
    def fit(self, history: pd.DataFrame, target: str) -> ProphetForecaster:
        _mute_stan_logging()
        from prophet import Prophet  # noqa: PLC0415 - Prophet loads CmdStan; only its forecaster needs it

        _mute_stan_logging()  # prophet sets its logger to INFO when first imported

        column = target_column(target, strict=True)
        self.target = target
        self._models.clear()
        self.skipped_ = {}
        self.regions_ = []
        for region, frame in history.groupby("region", sort=True):
            frame = frame.sort_values("hour_utc")
            frame = frame[frame[column].notna()]
            if self.history_days:
                start = frame["hour_utc"].max() - pd.Timedelta(days=self.history_days)
                frame = frame[frame["hour_utc"] > start]
            if len(frame) < self.min_history_h:
                self.skipped_[region] = f"only {len(frame)} hours of {column}"
                continue
            regressors = []
            if self.use_weather:
                regressors = [
                    c
                    for c in WEATHER_COLUMNS
                    if c in frame.columns and frame[c].notna().mean() >= 0.95 and frame[c].std() > 0
                ]
            fill = {c: float(frame[c].mean()) for c in regressors}
            train = pd.DataFrame({"ds": _naive(frame["hour_utc"]).to_numpy(), "y": frame[column].to_numpy(float)})
            for c in regressors:
                train[c] = frame[c].fillna(fill[c]).to_numpy(float)
            span_days = (train["ds"].iloc[-1] - train["ds"].iloc[0]).days
            yearly = self.yearly_seasonality
            if yearly == "auto":
                yearly = span_days >= 365
            model = Prophet(
                growth=self.growth,
                daily_seasonality=True,
                weekly_seasonality=True,
                yearly_seasonality=yearly,
                changepoint_prior_scale=self.changepoint_prior_scale,
                seasonality_mode=self.seasonality_mode,
                interval_width=0.8,
                uncertainty_samples=1000 if self.interval == "prophet" else 0,
            )
            for c in regressors:
                model.add_regressor(c)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit(train)
            self._models[region] = model
            self._regressors[region] = regressors
            self._fill[region] = fill
            self._learn_residuals(region, model, train, frame["hour_utc"])
            self.regions_.append(region)
        if not self._models:
            raise ValueError(f"prophet: no region has enough history for {column}: {self.skipped_}")
        self.trained_until_ = pd.Timestamp(history["hour_utc"].max())
        return self

    def _anchors(self, resid: np.ndarray) -> np.ndarray:
        """Residual means over each correction window, known at every issue hour s: shape (n, k)."""
        series = pd.Series(resid)
        cols = [series.rolling(w, min_periods=max(1, w // 2)).mean().shift(1).to_numpy() for w in self._windows()]
        return np.column_stack(cols)

    def _windows(self) -> tuple[int, ...]:
        return tuple(max(int(w), 1) for w in self.correction_windows_h) or (1,)

    def _learn_residuals(self, region: str, model, train: pd.DataFrame, hours: pd.Series) -> None:
        """Per-horizon correction coefficients and residual quantiles from in-sample residuals."""
        yhat = model.predict(train.drop(columns="y"))["yhat"].to_numpy()
        # On a complete hourly grid so that shifts are hours (gaps become NaN and drop out).
        grid = pd.date_range(hours.iloc[0], hours.iloc[-1], freq="h")
        resid = pd.Series(train["y"].to_numpy() - yhat, index=pd.DatetimeIndex(hours.to_numpy())).reindex(grid)
        r = resid.to_numpy()
        A = self._anchors(r)
        H = int(self.max_horizon)
        k = A.shape[1]
        beta = np.zeros((H, k))
        q = np.zeros((H, 3))
        ridge = 1e-6
        for h in range(1, H + 1):
            future = np.full_like(r, np.nan)
            future[: len(r) - (h - 1)] = r[h - 1 :]
            ok = np.isfinite(A).all(axis=1) & np.isfinite(future)
            if ok.sum() < 48:
                q[h - 1] = np.nanquantile(r, [0.1, 0.5, 0.9]) if np.isfinite(r).any() else 0.0
                continue
            Aok, fok = A[ok], future[ok]
            if self.residual_correction:
                gram = Aok.T @ Aok
                gram += ridge * np.trace(gram) * np.eye(k)
                beta[h - 1] = np.linalg.solve(gram, Aok.T @ fok)
            corrected = fok - Aok @ beta[h - 1]
            q[h - 1] = np.quantile(corrected, [0.1, 0.5, 0.9])
        self._beta[region] = beta
        self._quantiles[region] = q

    # -------------------------------------------------------------- predict
    def predict(self, issued_at: pd.Timestamp, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        if not self._models:
            raise RuntimeError("ProphetForecaster.predict called before fit")
        if horizon < 1:
            raise ValueError("horizon must be ≥ 1")
        issued = issue_hour(issued_at)
        column = target_column(self.target, strict=True)
        lookback = max(self._windows())
        span = (data["hour_utc"] >= issued - pd.Timedelta(hours=lookback)) & (
            data["hour_utc"] < issued + pd.Timedelta(hours=horizon)
        )
        seen = known_at(data[span], issued)
        target_hours = pd.date_range(issued, periods=horizon, freq="h")
        hours = pd.date_range(issued - pd.Timedelta(hours=lookback), periods=lookback + horizon, freq="h")
        frames = []
        for region in sorted(seen["region"].unique()):
            model = self._models.get(region)
            if model is None:
                continue
            rows = seen[seen["region"] == region].drop_duplicates("hour_utc").set_index("hour_utc").reindex(hours)
            future = pd.DataFrame({"ds": _naive(pd.Series(hours)).to_numpy()})
            for c in self._regressors[region]:
                values = rows[c] if c in rows.columns else pd.Series(np.nan, index=hours)
                future[c] = pd.to_numeric(values, errors="coerce").fillna(self._fill[region][c]).to_numpy(float)
            out = model.predict(future)
            yhat = out["yhat"].to_numpy()
            observed = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            resid = np.full(len(hours) + 1, np.nan)
            resid[:lookback] = observed[:lookback] - yhat[:lookback]
            anchors = self._anchors(resid)[lookback]  # the row of the issue hour: windows end at issued − 1 h
            anchors = np.where(np.isfinite(anchors), anchors, 0.0)
            steps = np.arange(1, horizon + 1)
            idx = np.minimum(steps, self.max_horizon) - 1
            point = yhat[lookback:]
            base = point + self._beta[region][idx] @ anchors
            if self.interval == "prophet":
                p50 = base
                p10 = out["yhat_lower"].to_numpy()[lookback:] + (base - point)
                p90 = out["yhat_upper"].to_numpy()[lookback:] + (base - point)
            else:
                q = self._quantiles[region][idx]
                p10, p50, p90 = base + q[:, 0], base + q[:, 1], base + q[:, 2]
            stacked = np.sort(np.vstack([p10, p50, p90]), axis=0)
            if self.target in _NONNEGATIVE_TARGETS:
                stacked = np.clip(stacked, 0.0, None)
            frames.append(
                pd.DataFrame(
                    {
                        "region": region,
                        "issued_at": issued,
                        "target_time": target_hours,
                        "horizon_h": steps,
                        "p10": stacked[0],
                        "p50": stacked[1],
                        "p90": stacked[2],
                        "model": self.name,
                    }
                )
            )
        if not frames:
            return pd.DataFrame(
                columns=["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"]
            )
        return pd.concat(frames, ignore_index=True)

    # ---------------------------------------------------------- persistence
    def save(self, directory: Path | str) -> Path:
        path = Path(directory) / "prophet.pkl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            pickle.dump(self, handle, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    @classmethod
    def load(cls, directory: Path | str) -> ProphetForecaster:
        _mute_stan_logging()
        with open(Path(directory) / "prophet.pkl", "rb") as handle:
            model = pickle.load(handle)
        _mute_stan_logging()
        if not isinstance(model, cls):
            raise TypeError(f"{directory} does not hold a {cls.__name__}")
        return model

    def get_params(self) -> dict:
        params = super().get_params()
        params.pop("trained_until_", None)
        params["regions_"] = list(self.regions_)
        params["regressors"] = {r: list(v) for r, v in self._regressors.items()}
        return params
