"""Seasonal naive: the same hour on the last day (period 24) or in the last week (period 168) that is known.

For horizon h the forecast of hour t = T + h − 1 is y[t − period·⌈h/period⌉], the latest same-phase value observed
before the issue time T. P10/P90 are empirical quantiles of the training residuals per horizon, relative
(y / ŷ − 1) for carbon intensity and additive in MW for solar and wind.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.base import Forecaster, target_column
from forecasting.data import issue_hour, mask_known
from forecasting.models.frames import empty_forecast


class SeasonalNaive(Forecaster):
    """Same hour yesterday (`period=24`) or last week (`period=168`), with empirical residual quantiles."""

    def __init__(
        self,
        period: int = 24,
        max_horizon: int = 96,
        issue_hour: int | None = 0,
        name: str | None = None,
        min_history_h: int = 24 * 14,
        residuals: str = "auto",
    ):
        """`issue_hour`: the hour of day whose issues give the residual quantiles (None: every hour, for short
        series); `min_history_h`: observed hours a series needs to be fitted; `residuals`: relative, additive or
        auto (relative for carbon intensity)."""
        if residuals not in ("auto", "relative", "additive"):
            raise ValueError(f"residuals must be auto, relative or additive, not {residuals!r}")
        self.period = period
        self.max_horizon = max_horizon
        self.issue_hour = issue_hour
        self.min_history_h = min_history_h
        self.residuals = residuals
        self.name = name or f"naive-{period}"
        self._target = None
        self._relative = True
        self._residual_q: dict[str, np.ndarray] = {}  # region → (max_horizon, 2) quantiles (P10, P90) of residuals

    def _series(
        self, part: pd.DataFrame, col: str, until: pd.Timestamp | None = None
    ) -> tuple[pd.Timestamp, np.ndarray]:
        part = part.sort_values("hour_utc")
        start = part["hour_utc"].iloc[0]
        last = max(part["hour_utc"].iloc[-1], until) if until is not None else part["hour_utc"].iloc[-1]
        n = int((last - start) / HOUR) + 1
        arr = np.full(n, np.nan)
        pos = ((part["hour_utc"] - start) / HOUR).to_numpy().astype(np.int64)
        arr[pos] = pd.to_numeric(part[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        return start, arr

    def _point(self, arr: np.ndarray, T: np.ndarray, h: np.ndarray) -> np.ndarray:
        t = T + h - 1
        src = t - self.period * (-(-h // self.period))
        assert (src < T).all()
        out = np.full(t.shape, np.nan)
        ok = (src >= 0) & (src < len(arr))
        out[ok] = arr[src[ok]]
        return out

    def fit(self, history: pd.DataFrame, target: str) -> SeasonalNaive:
        col = target_column(target)
        self._target = target
        self._relative = (
            col.startswith("carbon_intensity") if self.residuals == "auto" else self.residuals == "relative"
        )
        self._residual_q = {}
        for region, part in history.groupby("region", sort=True):
            if part[col].notna().sum() < self.min_history_h:
                continue
            start, arr = self._series(part, col)
            hours = pd.DatetimeIndex(start + np.arange(len(arr)) * HOUR)
            T = np.flatnonzero(hours.hour == self.issue_hour) if self.issue_hour is not None else np.arange(len(arr))
            T = T[T >= self.period * 2]
            qs = np.full((self.max_horizon, 2), np.nan)
            for h in range(1, self.max_horizon + 1):
                Th = T[T + h - 1 < len(arr)]
                pred = self._point(arr, Th, np.full(len(Th), h))
                actual = arr[Th + h - 1]
                ok = np.isfinite(pred) & np.isfinite(actual)
                if self._relative:
                    ok &= pred > 0
                    resid = actual[ok] / pred[ok] - 1.0
                else:
                    resid = actual[ok] - pred[ok]
                if len(resid) >= 10:
                    qs[h - 1] = np.quantile(resid, [0.1, 0.9])
            self._residual_q[region] = qs
        return self

    def predict(self, issued_at, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        T0 = issue_hour(issued_at)
        data = mask_known(data, T0)
        col = target_column(self._target)
        out = []
        for region, qs in self._residual_q.items():
            part = data[data["region"] == region]
            if part.empty:
                continue
            start, arr = self._series(part, col, until=T0 + (horizon - 1) * HOUR)
            Ti = int((T0 - start) / HOUR)
            h = np.arange(1, horizon + 1)
            p50 = self._point(arr, np.full(horizon, Ti), h)
            hq = np.clip(h, 1, len(qs)) - 1
            lo, hi = qs[hq, 0], qs[hq, 1]
            if self._relative:
                p10, p90 = p50 * (1 + lo), p50 * (1 + hi)
            else:
                p10, p90 = p50 + lo, p50 + hi
            mat = np.clip(np.sort(np.vstack([p10, p50, p90]).T, axis=1), 0, None)
            out.append(
                pd.DataFrame(
                    {
                        "region": region,
                        "issued_at": T0,
                        "target_time": T0 + (h - 1) * HOUR,
                        "horizon_h": h,
                        "p10": mat[:, 0],
                        "p50": p50.clip(min=0),
                        "p90": mat[:, 2],
                        "model": self.name,
                    }
                )
            )
        if not out:
            return empty_forecast()
        return pd.concat(out, ignore_index=True)
