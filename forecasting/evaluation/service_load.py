"""The hourly load forecast of inference services (requests per second), evaluated on the ServeGen days it did not
train on.

Each service (`forecasting.data.service_load_hourly`: ServeGen's three language models with 14 days; the
multimodal and reasoning models have one day and are skipped, named) is fitted on its first `train_days` days with
the forecasting stack's own models (`SERVICE_LOAD_MODELS`: seasonal naive and LightGBM, the same fit/predict
surface as the grid forecasts), then forecast once a day at 00:00 for the next `horizon` hours over the rest.

Error: MAPE of the P50 over the hours with an observed rate (hours in a collection gap are not scored), the share of
those hours inside [P10, P90], and the hours left without a forecast (a seasonal naive reading a gap).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from common.timeutil import HOUR
from forecasting.base import Forecaster
from forecasting.models.lgbm import LGBMForecaster
from forecasting.models.naive import SeasonalNaive

TARGET = "requests_per_s"


def service_load_naive(max_horizon: int = 96) -> Forecaster:
    """The seasonal naive of the service loads: residual quantiles from every hour's issues (seven days hold too
    few midnight issues), relative, for horizons 1..`max_horizon` (the loop needs the next hour only)."""
    return SeasonalNaive(24, max_horizon=max_horizon, issue_hour=None, min_history_h=24 * 5, residuals="relative")


def _naive() -> Forecaster:
    return service_load_naive()


def _lgbm() -> Forecaster:
    # the load learnt as a ratio to its mean over the last week known, without weather or grid context; issues at
    # every hour
    return LGBMForecaster(
        horizon=24,
        issue_hours=tuple(range(24)),
        target_transform="ratio",
        use_weather=False,
        context_cols=(),
        n_estimators=200,
        min_child_samples=20,
        min_history_h=24 * 5,
        context_h=48,  # seven days of history: training issues from the third day on
    )


SERVICE_LOAD_MODELS: dict[str, Callable[[], Forecaster]] = {"naive-24": _naive, "lgbm": _lgbm}


def evaluate_service_load(
    loads: pd.DataFrame, train_days: int = 7, horizon: int = 24, models=SERVICE_LOAD_MODELS, progress=None
) -> dict:
    """Per service and model (see the module doc): mape_pct, coverage_p10_p90_pct, scored_hours, unforecast_hours;
    `skipped`: the services with less than `train_days` + 1 days; `forecasts`: every forecast row with its actual."""
    out = {"train_days": train_days, "horizon_h": horizon, "results": [], "skipped": {}}
    frames = []
    for service, part in loads.groupby("region", sort=True):
        start = part["hour_utc"].min()
        span_days = (part["hour_utc"].max() - start) / pd.Timedelta(days=1)
        if span_days < train_days + 1:
            out["skipped"][service] = f"{span_days + 1 / 24:.0f} day(s) of data, fewer than {train_days + 1}"
            continue
        cut = start + pd.Timedelta(days=train_days)
        history = part[part["hour_utc"] < cut]
        issues = pd.date_range(cut, part["hour_utc"].max() - (horizon - 1) * HOUR, freq="D")
        actual = part.set_index("hour_utc")[TARGET]
        for name, make in models.items():
            model = make().fit(history, TARGET)
            got = pd.concat([model.predict(T, horizon, part) for T in issues], ignore_index=True)
            got["service"] = service
            got["actual"] = got["target_time"].map(actual).astype(float)
            frames.append(got)
            observed = got[np.isfinite(got["actual"])]
            scored = observed[np.isfinite(observed["p50"])]
            err = (scored["p50"] - scored["actual"]).abs() / scored["actual"]
            inside = (scored["actual"] >= scored["p10"]) & (scored["actual"] <= scored["p90"])
            out["results"].append(
                {
                    "service": service,
                    "model": name,
                    "issues": len(issues),
                    "mape_pct": float(100 * err.mean()) if len(scored) else None,
                    "coverage_p10_p90_pct": float(100 * inside.mean()) if len(scored) else None,
                    "scored_hours": int(len(scored)),
                    "unforecast_hours": int(len(observed) - len(scored)),
                }
            )
            if progress is not None:
                progress(service, name)
    out["forecasts"] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return out


def service_load_markdown(result: dict) -> str:
    """The results as a Markdown table."""
    lines = [
        f"Trained on the first {result['train_days']} days, forecast daily at 00:00 for {result['horizon_h']} h.",
        "",
        "| service | model | MAPE (P50) | inside P10–P90 | hours scored | hours without a forecast |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        mape = "–" if r["mape_pct"] is None else f"{r['mape_pct']:.1f} %"
        cover = "–" if r["coverage_p10_p90_pct"] is None else f"{r['coverage_p10_p90_pct']:.1f} %"
        lines.append(
            f"| {r['service']} | {r['model']} | {mape} | {cover} | {r['scored_hours']} | {r['unforecast_hours']} |"
        )
    for service, why in result["skipped"].items():
        lines.append(f"| {service} | – | skipped: {why} | | | |")
    return "\n".join(lines)
