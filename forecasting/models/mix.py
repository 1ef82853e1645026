"""Carbon intensity composed from a forecast of the generation mix, as DACF does.

CI(t) = Σᵢ ĝᵢ(t)·EFᵢ / Σᵢ ĝᵢ(t) with the direct (or lifecycle) emission factors of `forecasting.data`.

* Wind and solar (the weather-driven sources) come from plug-in forecasters: by default
  `PublishedBlendForecaster(LGBMForecaster)`, i.e. the grid operator's published day-ahead forecast, corrected online,
  where it is known at issued_at (CISO, DE, SE), and a LightGBM on the GFS weather forecast and lags elsewhere (later
  horizons, and PJM, ERCO, ISNE, whose "published" wind/solar are DACF's own and never used).
* Every other source with a share of at least `min_share` gets a LightGBM (point, L2) *conditional on the wind and
  solar of the same hour*: in training those inputs are the actual wind and solar, in prediction the plug-in
  forecasts. Dispatchable generation (coal, gas) is what responds to wind and solar, so this is where their forecast
  turns into a carbon forecast. Sources below `min_share` keep their mean of the last week.

P10/P90: relative residual quantiles of the composed CI per horizon bucket, measured on the last
`calibration_days` of the training history with the plug-in forecasts in place (in-sample for the models, hence
widened by `band_inflation`); the ensemble recalibrates on its validation window anyway.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.base import Forecaster, target_column
from forecasting.data import DIRECT_FACTORS, FUELS, LIFECYCLE_FACTORS, issue_hour, issue_times, mask_known
from forecasting.models.blend import PublishedBlendForecaster
from forecasting.models.frames import bucket_of, empty_forecast, quantile_frame
from forecasting.models.lgbm import LGBMForecaster

PLUGIN_FUELS = ("wind", "solar")


def default_plugin(fuel: str, horizon: int) -> Forecaster:
    """The wind or solar plug-in: the operator blend over a point LightGBM."""
    base = LGBMForecaster(
        horizon=horizon,
        objective="l1",
        quantiles=(0.5,),
        issue_hours=(0,),
        n_estimators=250,
        learning_rate=0.06,
        name=f"lgbm-{fuel}",
    )
    # A point base: the blend needs a band width; the point model has none, so the blend's band comes from the
    # residuals alone (width floor), which is fine for a plug-in whose P50 is all that is used.
    return PublishedBlendForecaster(base, name=f"plugin-{fuel}")


class MixCompositeForecaster(Forecaster):
    """Compose carbon intensity from per-source generation forecasts (see module docstring)."""

    name = "mix"

    def __init__(
        self,
        horizon: int = 96,
        n_estimators: int = 200,
        learning_rate: float = 0.08,
        issue_hours: tuple = (0,),
        min_share: float = 0.002,
        calibration_days: int = 28,
        band_inflation: float = 1.3,
        plugin_factory=None,
        name: str | None = None,
    ):
        self.horizon = horizon
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.issue_hours = tuple(issue_hours)
        self.min_share = min_share
        self.calibration_days = calibration_days
        self.band_inflation = band_inflation
        self.plugin_factory = plugin_factory
        if name:
            self.name = name
        self._target = None
        self._factors = DIRECT_FACTORS
        self._fuels: dict[str, list[str]] = {}  # region → modelled fuels
        self._minor: dict[str, list[str]] = {}  # region → fuels kept at their last-week mean
        self._plugins: dict[str, Forecaster] = {}
        self._fuel_models: dict[str, LGBMForecaster] = {}
        self._band: dict[str, np.ndarray] = {}  # region → (n_buckets, 2) relative quantiles

    def fit(self, history: pd.DataFrame, target: str) -> MixCompositeForecaster:
        col = target_column(target)
        if not col.startswith("carbon_intensity"):
            raise ValueError("MixCompositeForecaster forecasts carbon intensity only")
        self._target = target
        self._factors = LIFECYCLE_FACTORS if "lifecycle" in col else DIRECT_FACTORS
        self._fuels, self._minor = {}, {}
        for region, part in history.groupby("region", sort=True):
            total = part["total_generation_mw"].mean()
            present = [f for f in FUELS if f"{f}_mw" in part and part[f"{f}_mw"].notna().mean() > 0.5]
            share = {f: part[f"{f}_mw"].mean() / total for f in present}
            self._fuels[region] = [f for f in present if share[f] >= self.min_share]
            self._minor[region] = [f for f in present if share[f] < self.min_share]
        # Plug-in forecasters for wind and solar.
        self._plugins = {}
        for fuel in PLUGIN_FUELS:
            regions = [r for r, fs in self._fuels.items() if fuel in fs]
            if not regions:
                continue
            factory = self.plugin_factory or default_plugin
            model = factory(fuel, self.horizon)
            model.fit(history[history["region"].isin(regions)], f"{fuel}_mw")
            self._plugins[fuel] = model
        # Conditional models for the other sources, trained with the actual wind/solar as the plug-in inputs.
        train = self._with_plug_columns(history)
        self._fuel_models = {}
        all_fuels = sorted({f for fs in self._fuels.values() for f in fs if f not in PLUGIN_FUELS})
        for fuel in all_fuels:
            regions = [r for r, fs in self._fuels.items() if fuel in fs]
            exog = tuple(f"plug_{p}_mw" for p in PLUGIN_FUELS if p in self._plugins)
            model = LGBMForecaster(
                horizon=self.horizon,
                objective="l2",
                quantiles=(0.5,),
                issue_hours=self.issue_hours,
                n_estimators=self.n_estimators,
                learning_rate=self.learning_rate,
                context_cols=("total_generation_mw",),
                exog_cols=exog,
                name=f"mix-{fuel}",
            )
            model.fit(train[train["region"].isin(regions)], f"{fuel}_mw")
            self._fuel_models[fuel] = model
        self._calibrate(history)
        return self

    @staticmethod
    def _with_plug_columns(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.copy()
        for p in PLUGIN_FUELS:
            if f"{p}_mw" in out:
                out[f"plug_{p}_mw"] = out[f"{p}_mw"]
        return out

    def _calibrate(self, history: pd.DataFrame) -> None:
        self._band = {}
        end = history["hour_utc"].max() + HOUR
        start = (end - pd.Timedelta(days=self.calibration_days)).floor("D")
        issues = [T for T in issue_times(start, end - pd.Timedelta(days=1)) if T + self.horizon * HOUR <= end]
        if not issues:
            issues = [T for T in issue_times(start, end - pd.Timedelta(days=1))]
        col = target_column(self._target)
        rows = []
        for T in issues:
            window = history[
                (history["hour_utc"] >= T - pd.Timedelta(days=14))
                & (history["hour_utc"] < T + (self.horizon + 24) * HOUR)
            ]
            pred = self._compose(T, self.horizon, window)
            for region, (p50, h) in pred.items():
                actual = window[window["region"] == region].set_index("hour_utc")[col].reindex(T + (h - 1) * HOUR)
                rows.append(pd.DataFrame({"region": region, "h": h, "p50": p50, "actual": actual.to_numpy()}))
        if not rows:
            return
        res = pd.concat(rows, ignore_index=True).dropna()
        res = res[res["p50"] > 0]
        res["rel"] = res["actual"] / res["p50"] - 1
        res["b"] = bucket_of(res["h"].to_numpy())
        for region, part in res.groupby("region"):
            band = np.zeros((4, 2))
            for b in range(4):
                sel = part[part["b"] == b]["rel"]
                if len(sel) < 20:
                    sel = part["rel"]
                band[b] = np.quantile(sel, [0.1, 0.9]) * self.band_inflation
            self._band[region] = band

    def _compose(self, T0: pd.Timestamp, horizon: int, data: pd.DataFrame) -> dict:
        """region → (P50 CI per horizon, horizons)."""
        masked = mask_known(data, T0)
        plug = {}
        for fuel, model in self._plugins.items():
            pred = model.predict(T0, horizon, masked)
            for region, part in pred.groupby("region"):
                arr = np.full(horizon, np.nan)
                arr[part["horizon_h"].to_numpy(dtype=int) - 1] = part["p50"].to_numpy(dtype=float)
                plug[(region, fuel)] = arr
        out = {}
        h = np.arange(1, horizon + 1)
        for region, fuels in self._fuels.items():
            part = masked[masked["region"] == region]
            if part.empty:
                continue
            exog = {f"plug_{p}_mw": plug[(region, p)] for p in PLUGIN_FUELS if (region, p) in plug}
            gen = {}
            for fuel in fuels:
                if fuel in PLUGIN_FUELS:
                    values = plug.get((region, fuel))
                else:
                    q = self._fuel_models[fuel].predict_region(region, T0, horizon, part, exog=exog)
                    values = None if q is None else q[0.5]
                if values is None:
                    values = np.full(horizon, np.nan)
                gen[fuel] = np.clip(np.asarray(values, dtype=float), 0, None)
            recent = part[part["hour_utc"] >= T0 - pd.Timedelta(days=7)]
            for fuel in self._minor.get(region, []):
                mean = float(recent[f"{fuel}_mw"].mean()) if len(recent) else 0.0
                gen[fuel] = np.full(horizon, mean if np.isfinite(mean) else 0.0)
            # A source with no forecast for an hour: its last-week mean.
            for fuel, values in gen.items():
                if np.isnan(values).any():
                    mean = float(recent[f"{fuel}_mw"].mean()) if len(recent) else 0.0
                    gen[fuel] = np.where(np.isnan(values), mean if np.isfinite(mean) else 0.0, values)
            num = sum(gen[f] * self._factors.get(f, 0.0) for f in gen)
            den = sum(gen.values())
            with np.errstate(invalid="ignore", divide="ignore"):
                ci = np.where(den > 0, num / den, np.nan)
            out[region] = (ci, h)
        return out

    def predict(self, issued_at, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        T0 = issue_hour(issued_at)
        composed = self._compose(T0, horizon, data)
        frames = []
        for region, (p50, h) in composed.items():
            band = self._band.get(region, np.tile([-0.1, 0.1], (4, 1)))
            b = bucket_of(h)
            q = {0.1: p50 * (1 + band[b, 0]), 0.5: p50, 0.9: p50 * (1 + band[b, 1])}
            frames.append(quantile_frame(region, T0, horizon, q, self.name))
        return pd.concat(frames, ignore_index=True) if frames else empty_forecast()
