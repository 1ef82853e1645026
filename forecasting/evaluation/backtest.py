"""Rolling-origin backtests.

Forecasts are issued daily at 00:00 UTC (`issue_hour`) from `start` to `end` (inclusive dates) for horizons
1…`horizon`. Each call to `Forecaster.predict` receives only a window of the data masked as known at its issue time
(`forecasting.data.mask_known`: observed values strictly before issued_at; weather forecasts, calendar and the
operators' already-published day-ahead forecasts for the hours after). Actuals are joined afterwards; target hours
after `end` are not scored.

"Day-ahead" follows DACF: a forecast issued at 00:00 UTC of day D for the 24 hours of day D, i.e. horizons 1–24 of
the daily 00:00 issue, so every hour of the test window is scored exactly once (DACF's published MAPEs are over all
hours of Jul–Dec 2021 in the same way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from common.timeutil import HOUR, utc
from forecasting.base import TARGET_COLUMNS, Forecaster
from forecasting.data import (
    OPERATOR_SERIES,
    attach_published,
    grid_hourly,
    issue_times,
    load_published_forecasts,
    mask_known,
)
from forecasting.evaluation.metrics import DAY_AHEAD, error_pct_of_mean, mape, point_metric_name, summarize
from forecasting.store import write_forecasts

# Days of data before each issue handed to predict (the ensemble's weights are re-fitted on its last 28 days; the
# mix composite looks back further). One default for every entry point, so Python and the command line agree.
CONTEXT_DAYS = 70
# Weather features look up to a day past the target hour (its daily mean, t + 1, t + 2): give predict that much.
LOOKAHEAD_H = 24
STANDARD = {
    "train_end": "2021-07-01",  # exclusive: train on data up to 2021-06-30 23:00
    "start": "2021-07-01",
    "end": "2021-12-31",
    "regions": ("CISO", "PJM", "ERCO", "ISNE", "SE", "DE"),
}
# The published figures (DACF paper, Table 4; SOURCE.md), reproduced from the files by `published_baseline`.
PUBLISHED_DACF_MAPE = {"CISO": 7.41, "PJM": 3.30, "ERCO": 8.05, "ISNE": 4.44, "SE": 6.47, "DE": 9.08}
PUBLISHED_OPERATOR_ERROR = {
    ("CISO", "solar"): 14.4,
    ("CISO", "wind"): 21.5,
    ("DE", "solar"): 7.0,
    ("DE", "wind"): 10.2,
    ("SE", "wind"): 6.6,
}


def window_end(end) -> pd.Timestamp:
    """The exclusive end of the scored window: the hour after `end`'s last hour (dates are inclusive)."""
    t = utc(end)
    return t.floor("D") + pd.Timedelta(days=1) if t == t.floor("D") else t


def rolling_forecasts(
    model: Forecaster,
    data: pd.DataFrame,
    start,
    end,
    horizon: int = 96,
    issue_hour: int = 0,
    context_days: int = CONTEXT_DAYS,
    regions=None,
) -> pd.DataFrame:
    """Forecast frames of every daily issue in [start, end], concatenated."""
    if regions is not None:
        data = data[data["region"].isin(list(regions))]
    data = data.sort_values(["region", "hour_utc"]).reset_index(drop=True)
    hours = data["hour_utc"]
    out = []
    for issued_at in issue_times(start, end, issue_hour):
        lo = issued_at - pd.Timedelta(days=context_days)
        hi = issued_at + (horizon + LOOKAHEAD_H) * HOUR  # known-future inputs a little beyond the horizon
        window = data[(hours >= lo) & (hours < hi)]
        if window.empty:
            continue
        pred = model.predict(issued_at, horizon, mask_known(window, issued_at))
        if pred is not None and len(pred):
            out.append(pred)
    if not out:
        return pd.DataFrame(columns=["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"])
    frame = pd.concat(out, ignore_index=True)
    frame["target_time"] = pd.to_datetime(frame["target_time"], utc=True)
    frame["issued_at"] = pd.to_datetime(frame["issued_at"], utc=True)
    return frame


def score(forecasts: pd.DataFrame, data: pd.DataFrame, target: str, end=None) -> pd.DataFrame:
    """Join the actual of `target` to each forecast row; rows after `end` (inclusive date) are dropped."""
    col = TARGET_COLUMNS.get(target, target)
    actual = data[["region", "hour_utc", col]].rename(columns={"hour_utc": "target_time", col: "actual"})
    actual["target_time"] = pd.to_datetime(actual["target_time"], utc=True)
    scored = forecasts.merge(actual, on=["region", "target_time"], how="left")
    if end is not None:
        scored = scored[scored["target_time"] < window_end(end)]
    return scored


def published_baseline(
    published: pd.DataFrame, data: pd.DataFrame, target: str, region: str, start, end, operator_only: bool = True
) -> dict | None:
    """The published day-ahead forecast's error over the test window: DACF's CI MAPE, or the operator's solar/wind
    error as % of mean output (only for the series that are the operator's own, unless operator_only=False)."""
    col = TARGET_COLUMNS.get(target, target)
    if target == "carbon_intensity":
        pub_target, publisher = "carbon_intensity_direct", "DACF"
    else:
        pub_target = col
        if operator_only and (region, col) not in OPERATOR_SERIES:
            return None
        publisher = None
    pub = published[(published["region"] == region) & (published["target"] == pub_target)]
    pub = pub[(pub["hour_utc"] >= utc(start)) & (pub["hour_utc"] < window_end(end))]
    if pub.empty:
        return None
    publisher = publisher or str(pub["publisher"].iloc[0])
    actual = data[(data["region"] == region)][["hour_utc", col]]
    merged = pub.merge(actual, on="hour_utc", how="inner")
    fn = mape if target == "carbon_intensity" else error_pct_of_mean
    return {"value": round(fn(merged[col], merged["value"]), 3), "publisher": publisher, "n": int(len(merged))}


@dataclass
class BacktestResult:
    region: str
    target: str
    model: str
    metrics: dict
    baseline: dict | None
    forecasts: pd.DataFrame
    fit_seconds: float
    predict_seconds: float
    issued: pd.DataFrame | None = None  # every row issued for the region, unscored (all horizons; for --store)

    def to_json(self) -> dict:
        name = point_metric_name(self.target)
        out = {
            "region": self.region,
            "target": self.target,
            "model": self.model,
            name: self.metrics.get(name),
            "coverage_p10_p90": self.metrics.get("coverage_p10_p90"),
            f"day_ahead_{name}": self.metrics.get(f"day_ahead_{name}"),
            "day_ahead_coverage_p10_p90": self.metrics.get("day_ahead_coverage_p10_p90"),
            "by_horizon": self.metrics.get("by_horizon"),
        }
        if self.target == "carbon_intensity":
            out["baseline_dacf_mape"] = self.baseline["value"] if self.baseline else None
        else:
            out["baseline_operator_error_pct_of_mean"] = self.baseline["value"] if self.baseline else None
            out["baseline_publisher"] = self.baseline["publisher"] if self.baseline else None
        out["fit_seconds"] = round(self.fit_seconds, 2)
        out["predict_seconds"] = round(self.predict_seconds, 2)
        return out


def load_inputs(regions, source: str = "auto", data_dir=None, db_path=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid frame (with the operators' published forecasts attached) and the long published frame."""
    data = grid_hourly(regions, source=source, db_path=db_path, data_dir=data_dir)
    published = load_published_forecasts(regions, source=source, db_path=db_path, data_dir=data_dir)
    return attach_published(data, published), published


def run_backtest(
    model: Forecaster,
    target: str,
    regions,
    data: pd.DataFrame,
    published: pd.DataFrame | None = None,
    start=STANDARD["start"],
    end=STANDARD["end"],
    horizon: int = 24,
    train_end=None,
    fit: bool = True,
    context_days: int = CONTEXT_DAYS,
) -> list[BacktestResult]:
    """Fit `model` on data before `train_end` (default: `start`), forecast daily over [start, end], score per region."""
    regions = list(regions)
    data = data[data["region"].isin(regions)]
    train_end = utc(train_end or start)
    fit_s = 0.0
    if fit:
        t0 = time.perf_counter()
        model.fit(data[data["hour_utc"] < train_end], target)
        fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    forecasts = rolling_forecasts(model, data, start, end, horizon, context_days=context_days)
    pred_s = time.perf_counter() - t0
    scored = score(forecasts, data, target, end)
    results = []
    for region in regions:
        part = scored[scored["region"] == region]
        metrics = summarize(part, target) if len(part) else {}
        baseline = published_baseline(published, data, target, region, start, end) if published is not None else None
        results.append(
            BacktestResult(
                region,
                target,
                getattr(model, "name", type(model).__name__),
                metrics,
                baseline,
                part,
                fit_s,
                pred_s,
                forecasts[forecasts["region"] == region],
            )
        )
    return results


def store_forecasts(results: list[BacktestResult], model: str, version: str, db_path=None) -> int:
    """Write the backtest's issued forecasts (every issue, every horizon) into forecast.forecasts as `model` with
    model_version `version`, so that the planner's simulator can replay them as the forecasts known at each hour
    (`scheduling.planning.forecasts.WarehouseForecast`). Returns the number of rows written."""
    parts = [r.issued.assign(target=r.target) for r in results if r.issued is not None and len(r.issued)]
    if not parts:
        return 0
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.assign(model=model, model_version=version, is_fallback=False, fallback_reason=None)
    return write_forecasts(rows, db_path=db_path)


def day_ahead(scored: pd.DataFrame) -> pd.DataFrame:
    return scored[(scored["horizon_h"] >= DAY_AHEAD[0]) & (scored["horizon_h"] <= DAY_AHEAD[1])]
