"""Forecast metrics: MAPE (carbon intensity), MAE as % of mean actual (solar, wind), P10–P90 coverage, per horizon
bucket.

All functions take arrays (or Series) and ignore rows where the actual or the forecast is missing. MAPE skips
actuals ≤ 0 (carbon intensity is positive in every file; the guard only protects against division by zero).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forecasting.base import HORIZON_BUCKETS

DAY_AHEAD = (1, 24)


def bucket_label(lo: int, hi: int) -> str:
    return f"{lo}-{hi}"


def horizon_bucket(horizon_h) -> pd.Series:
    """The bucket label ("1-6", "7-24", "25-48", "49-96") of each horizon; NaN outside 1…96."""
    h = pd.Series(np.asarray(horizon_h))
    out = pd.Series(pd.NA, index=h.index, dtype="object")
    for lo, hi in HORIZON_BUCKETS:
        out[(h >= lo) & (h <= hi)] = bucket_label(lo, hi)
    return out


def _clean(actual, forecast):
    a = np.asarray(actual, dtype=float)
    f = np.asarray(forecast, dtype=float)
    ok = np.isfinite(a) & np.isfinite(f)
    return a[ok], f[ok]


def mape(actual, forecast) -> float:
    """Mean absolute percentage error, in percent."""
    a, f = _clean(actual, forecast)
    ok = a > 0
    if not ok.any():
        return float("nan")
    return float(np.mean(np.abs(f[ok] - a[ok]) / a[ok]) * 100.0)


def mae(actual, forecast) -> float:
    a, f = _clean(actual, forecast)
    return float(np.mean(np.abs(f - a))) if len(a) else float("nan")


def error_pct_of_mean(actual, forecast) -> float:
    """MAE as a percentage of the mean actual (the solar/wind metric; robust to the many zero hours of solar)."""
    a, f = _clean(actual, forecast)
    if not len(a) or np.mean(a) <= 0:
        return float("nan")
    return float(np.mean(np.abs(f - a)) / np.mean(a) * 100.0)


def coverage(actual, lower, upper) -> float:
    """Share of actuals inside [lower, upper], in percent."""
    a = np.asarray(actual, dtype=float)
    lo = np.asarray(lower, dtype=float)
    hi = np.asarray(upper, dtype=float)
    ok = np.isfinite(a) & np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return float("nan")
    return float(np.mean((a[ok] >= lo[ok]) & (a[ok] <= hi[ok])) * 100.0)


def pinball(actual, forecast, alpha: float) -> float:
    a, f = _clean(actual, forecast)
    d = a - f
    return float(np.mean(np.maximum(alpha * d, (alpha - 1) * d))) if len(a) else float("nan")


def point_metric_name(target: str) -> str:
    """`mape` for carbon intensity, `error_pct_of_mean` for solar and wind."""
    return "mape" if target.startswith("carbon_intensity") else "error_pct_of_mean"


def point_metric(target: str):
    return mape if point_metric_name(target) == "mape" else error_pct_of_mean


def summarize(frame: pd.DataFrame, target: str) -> dict:
    """Metrics of a scored forecast frame (columns horizon_h, p10, p50, p90, actual): overall, day-ahead, buckets."""
    name = point_metric_name(target)
    fn = point_metric(target)

    def block(part: pd.DataFrame) -> dict:
        return {
            name: _round(fn(part["actual"], part["p50"])),
            "coverage_p10_p90": _round(coverage(part["actual"], part["p10"], part["p90"])),
            "mae": _round(mae(part["actual"], part["p50"])),
            "n": int(part["actual"].notna().sum()),
        }

    out = block(frame)
    da = frame[(frame["horizon_h"] >= DAY_AHEAD[0]) & (frame["horizon_h"] <= DAY_AHEAD[1])]
    out[f"day_ahead_{name}"] = _round(fn(da["actual"], da["p50"]))
    out["day_ahead_coverage_p10_p90"] = _round(coverage(da["actual"], da["p10"], da["p90"]))
    by = {}
    for lo, hi in HORIZON_BUCKETS:
        part = frame[(frame["horizon_h"] >= lo) & (frame["horizon_h"] <= hi)]
        if len(part):
            by[bucket_label(lo, hi)] = block(part)
    out["by_horizon"] = by
    return out


def _round(x: float, nd: int = 3):
    return None if x is None or not np.isfinite(x) else round(float(x), nd)
