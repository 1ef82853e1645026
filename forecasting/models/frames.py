"""Helpers the forecasters share: the output frame, horizon buckets, hourly arrays and a cache of issued forecasts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.base import HORIZON_BUCKETS, OUTPUT_COLUMNS, QUANTILE_COLUMNS, Forecaster
from forecasting.data import mask_known


def empty_forecast() -> pd.DataFrame:
    """A forecast frame without rows."""
    return pd.DataFrame(columns=list(OUTPUT_COLUMNS))


def quantile_frame(region, T0, horizon, q: dict, name: str, nonnegative: bool = True) -> pd.DataFrame:
    """The forecast frame of one region from quantile arrays {alpha: values for horizons 1…horizon}: quantiles
    sorted per row (no crossing), optionally clipped at 0. Rows without a value stay NaN (the ensemble skips them)."""
    alphas = sorted(q)
    mat = np.vstack([q[a] for a in alphas]).T
    mat = np.sort(mat, axis=1)
    if nonnegative:
        mat = np.clip(mat, 0.0, None)
    lookup = dict(zip(alphas, mat.T))
    frame = pd.DataFrame(
        {
            "region": region,
            "issued_at": T0,
            "target_time": T0 + np.arange(horizon) * HOUR,
            "horizon_h": np.arange(1, horizon + 1),
            "p10": lookup.get(0.1, lookup[alphas[0]]),
            "p50": lookup.get(0.5, lookup[alphas[len(alphas) // 2]]),
            "p90": lookup.get(0.9, lookup[alphas[-1]]),
            "model": name,
        }
    )
    return frame


def bucket_of(h: np.ndarray) -> np.ndarray:
    """Index into HORIZON_BUCKETS of each horizon; horizons past the last bucket fall into it, below 1 give −1."""
    out = np.full(len(h), -1)
    for i, (lo, hi) in enumerate(HORIZON_BUCKETS):
        out[(h >= lo) & (h <= hi)] = i
    out[h > HORIZON_BUCKETS[-1][1]] = len(HORIZON_BUCKETS) - 1
    return out


class HourlyArray:
    """One region's column as an hourly numpy array (NaN where unknown)."""

    def __init__(self, part: pd.DataFrame, col: str):
        part = part.sort_values("hour_utc")
        self.start = part["hour_utc"].iloc[0] if len(part) else pd.Timestamp("1970-01-01", tz="UTC")
        n = int((part["hour_utc"].iloc[-1] - self.start) / HOUR) + 1 if len(part) else 0
        self.values = np.full(n, np.nan)
        if n:
            pos = ((part["hour_utc"] - self.start) / HOUR).to_numpy().astype(np.int64)
            self.values[pos] = pd.to_numeric(part[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)

    def index(self, ts) -> int:
        return int((pd.Timestamp(ts) - self.start) / HOUR)

    def take(self, idx) -> np.ndarray:
        idx = np.atleast_1d(np.asarray(idx))
        out = np.full(idx.shape, np.nan)
        ok = (idx >= 0) & (idx < len(self.values))
        out[ok] = self.values[idx[ok]]
        return out


class ForecastMemory:
    """One model's forecasts by issue time: frames, plus per-region (horizon × [p10, p50, p90]) arrays.

    The ensemble and the operator blend keep one per member, so a rolling backtest computes each member forecast
    once. It assumes one dataset per fitted model; `fit` starts it afresh."""

    def __init__(self):
        self.frames: dict[pd.Timestamp, pd.DataFrame] = {}
        self._arrays: dict[tuple, np.ndarray] = {}

    def put(self, T: pd.Timestamp, frame: pd.DataFrame) -> None:
        self.frames[T] = frame
        for key in [k for k in self._arrays if k[0] == T]:
            del self._arrays[key]

    def __contains__(self, T) -> bool:
        return T in self.frames

    def get(self, model: Forecaster, T: pd.Timestamp, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        frame = self.frames.get(T)
        if frame is None or (len(frame) and frame["horizon_h"].max() < horizon):
            self.put(T, model.predict(T, horizon, mask_known(data, T)))
        return self.frames[T]

    def array(self, T: pd.Timestamp, region: str, H: int) -> np.ndarray:
        key = (T, region, H)
        arr = self._arrays.get(key)
        if arr is None:
            arr = np.full((H, 3), np.nan)
            frame = self.frames.get(T)
            if frame is not None and len(frame):
                part = frame[(frame["region"] == region) & (frame["horizon_h"] <= H)]
                idx = part["horizon_h"].to_numpy(dtype=int) - 1
                arr[idx] = part[list(QUANTILE_COLUMNS)].to_numpy(dtype=float)
            self._arrays[key] = arr
        return arr
