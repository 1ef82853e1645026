"""The operators' published solar/wind day-ahead forecast, corrected online; a base model where none is known.

Where the published value is known at `issued_at` (`forecasting.data.mask_known`), per horizon a ridge regression
fitted on the previous `window_days` of issues (shrunk towards "the published value as is") corrects it with the base
model's forecast, the last observed error of the published forecast before issued_at, and the error at the same hour
one day earlier (a nowcast of the operator's error). For up to `ffill_hours` after the last published hour (DE/SE:
22:00–23:00 UTC belong to the next CET delivery day, published later) the last published value stands in, corrected
the same way. The band is the base model's band width scaled by conformal quantiles of the trailing residuals. Where
no published value is known (later horizons, other regions) the base model's forecast is returned. The published
forecasts start on 2021-07-01, so for the first `min_days` of a test window the published value is used as is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forecasting.base import Forecaster, target_column
from forecasting.data import PUBLISHED_FOR, issue_hour, mask_known, published_known_until
from forecasting.models.frames import ForecastMemory, HourlyArray, bucket_of

DAY = pd.Timedelta(days=1)


class PublishedBlendForecaster(Forecaster):
    """The operator's published day-ahead forecast, corrected online; the base model elsewhere (see module doc)."""

    name = "operator-blend"

    def __init__(
        self,
        base: Forecaster,
        window_days: int = 56,
        min_days: int = 7,
        ridge: float = 5.0,
        level: float = 0.8,
        ffill_hours: int = 6,
        name: str | None = None,
    ):
        self.base = base
        self.window_days = window_days
        self.min_days = min_days
        self.ridge = ridge
        self.level = level
        self.ffill_hours = ffill_hours
        if name:
            self.name = name
        self._memory = ForecastMemory()
        self._target = None

    def fit(self, history: pd.DataFrame, target: str) -> PublishedBlendForecaster:
        self._target = target
        self._memory = ForecastMemory()
        self.base.fit(history, target)
        return self

    def offer_fitted(self, fitted: list[tuple[Forecaster, str, pd.Timestamp]]) -> None:
        """Passed on to the base model (see `EnsembleForecaster.offer_fitted`)."""
        if hasattr(self.base, "offer_fitted"):
            self.base.offer_fitted(fitted)

    def predict(self, issued_at, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        T0 = issue_hour(issued_at)
        data = mask_known(data, T0)
        col = target_column(self._target)
        pub_col = PUBLISHED_FOR.get(col)
        base = self._memory.get(self.base, T0, horizon, data)
        base = base[base["horizon_h"] <= horizon].copy()
        base["model"] = self.name
        if pub_col is None or pub_col not in data.columns or data[pub_col].notna().sum() == 0:
            return base
        out = []
        for region, bpart in base.groupby("region", sort=False):
            part = data[data["region"] == region]
            out.append(self._region(region, T0, horizon, bpart.sort_values("horizon_h"), part, col, pub_col, data))
        return pd.concat(out, ignore_index=True)

    def _op_feature(self, pub: HourlyArray, region: str, T: pd.Timestamp, h: np.ndarray) -> np.ndarray:
        """The published value for T + h − 1 as known at T: itself while published, then the last published value
        carried forward for up to `ffill_hours` (DE/SE's last UTC hours belong to the next, unpublished CET day)."""
        Ti = pub.index(T)
        t = Ti + h - 1
        until = pub.index(published_known_until(T, region))
        vals = pub.take(np.minimum(t, until - 1))
        vals[(t >= until) & (t - (until - 1) > self.ffill_hours)] = np.nan
        return vals

    def _region(self, region, T0, horizon, bpart, part, col, pub_col, data) -> pd.DataFrame:
        ya = HourlyArray(part, col)
        pa = HourlyArray(part, pub_col)
        if not np.isfinite(pa.values).any():
            return bpart
        h = np.arange(1, horizon + 1)
        T0i = ya.index(T0)
        base_now = self._memory.array(T0, region, horizon)
        op_now = self._op_feature(pa, region, T0, h)
        known = np.isfinite(op_now) & np.isfinite(base_now[:, 1])
        if not known.any():
            return bpart

        def err(idx):
            return ya.take(idx) - pa.take(idx)

        X_list, Y_list, W_list, K = [], [], [], 0
        for k in range(1, self.window_days + 1):
            T = T0 - k * DAY
            self._memory.get(self.base, T, horizon, data)
            b = self._memory.array(T, region, horizon)
            Ti = ya.index(T)
            yy = ya.take(Ti + h - 1)
            yy[Ti + h - 1 >= T0i] = np.nan
            op = self._op_feature(pa, region, T, h)
            e24 = np.where(h <= 24, err(Ti + h - 1 - 24), np.nan)  # the same hour a day earlier, known at T
            feats = np.column_stack([op - b[:, 1], np.full(horizon, err(Ti - 1)), e24, np.ones(horizon)])
            X_list.append(feats)
            Y_list.append(yy - b[:, 1])
            W_list.append(b[:, 2] - b[:, 0])
            K += int(np.isfinite(yy - b[:, 1] + feats[:, 0]).any())
        X = np.stack(X_list)  # K,H,4
        X[:, :, 1:3] = np.nan_to_num(X[:, :, 1:3])
        Y = np.stack(Y_list)
        Wd = np.stack(W_list)
        b50 = base_now[:, 1]
        p10, p50, p90 = base_now[:, 0].copy(), b50.copy(), base_now[:, 2].copy()
        level = max(float(np.nanmean(np.abs(ya.values))), 1e-6)
        floor = 0.02 * level
        x_now = np.column_stack(
            [
                op_now - b50,
                np.full(horizon, np.nan_to_num(err(T0i - 1))),
                np.nan_to_num(np.where(h <= 24, err(T0i + h - 1 - 24), np.nan)),
                np.ones(horizon),
            ]
        )
        prior = np.array([1.0, 0.0, 0.0, 0.0])  # shrink towards "the published value as is"
        resid = np.full(Y.shape, np.nan)
        for j in np.flatnonzero(known):
            ok = np.isfinite(X[:, j]).all(axis=1) & np.isfinite(Y[:, j])
            if ok.sum() < self.min_days:
                p50[j] = op_now[j]
                p10[j] = op_now[j] - (b50[j] - base_now[j, 0])
                p90[j] = op_now[j] + (base_now[j, 2] - b50[j])
                continue
            Xj, Yj = X[ok, j], Y[ok, j]
            scale = np.sqrt(np.mean(Xj**2, axis=0))
            scale[3] = 1.0
            scale = np.where(scale > 1e-9 * level, scale, 1.0)
            Xs = Xj / scale
            lam = self.ridge * len(Xs) * 0.05 * np.ones(4)
            beta = np.linalg.solve(Xs.T @ Xs + np.diag(lam), Xs.T @ Yj + lam * prior * scale) / scale
            p50[j] = b50[j] + x_now[j] @ beta
            resid[ok, j] = Yj - Xj @ beta
        # Band: the base model's width, scaled by conformal quantiles of the trailing residuals per bucket.
        buckets = bucket_of(h)
        tail = (1 - self.level) / 2
        infl = 1.15  # in-sample residuals of a 4-parameter fit understate the error a little
        for b in np.unique(buckets[known]):
            cols = (buckets == b) & known
            R = resid[:, cols]
            Wb = np.maximum(Wd[:, cols], floor)
            ok = np.isfinite(R) & np.isfinite(Wb)
            if ok.sum() < 20:
                continue
            qlo = max(infl * np.quantile((-R / Wb)[ok], 1 - tail), 0.0)
            qhi = max(infl * np.quantile((R / Wb)[ok], 1 - tail), 0.0)
            w_now = np.maximum(base_now[cols, 2] - base_now[cols, 0], floor)
            p10[cols] = p50[cols] - qlo * w_now
            p90[cols] = p50[cols] + qhi * w_now
        p50 = np.clip(p50, 0, None)
        p10 = np.clip(np.minimum(p10, p50), 0, None)
        p90 = np.maximum(p90, p50)
        out = bpart.copy()
        idx = out["horizon_h"].to_numpy(dtype=int) - 1
        out["p10"], out["p50"], out["p90"] = p10[idx], p50[idx], p90[idx]
        return out
