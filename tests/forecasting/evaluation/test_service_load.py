"""The services' load forecast: ServeGen's rates per hour against the file read with the csv module (the hour's
mean of its 10-minute windows, a collection gap left out), and the seasonal naive's MAPE on the days it did not
train on recomputed by hand (same hour the day before); LightGBM forecasts every scored hour."""

from __future__ import annotations

import csv
import math
from collections import defaultdict

import pandas as pd
import pytest

from forecasting.data import GAP_SHARE, SERVEGEN_RATES, SERVEGEN_START, service_load_hourly
from forecasting.evaluation.service_load import evaluate_service_load


@pytest.fixture(scope="module")
def loads(data_dir):
    return service_load_hourly(data_dir)


@pytest.fixture(scope="module")
def result(loads):
    return evaluate_service_load(loads)


def test_hourly_rates_are_the_mean_of_the_hours_windows_without_the_gaps(loads, data_dir):
    with open(data_dir / SERVEGEN_RATES, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == "language/m-mid"]
    rates = sorted(float(r["requests_per_s"]) for r in rows)
    median = (
        (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2 if len(rates) % 2 == 0 else rates[len(rates) // 2]
    )
    windows = defaultdict(list)
    for r in rows:
        rate = float(r["requests_per_s"])
        windows[int(r["t_seconds"]) // 3600].append(rate if rate >= GAP_SHARE * median else math.nan)
    mine = loads[loads["region"] == "language/m-mid"].set_index("hour_utc")["requests_per_s"]
    gaps = 0
    for hour, values in windows.items():
        kept = [v for v in values if not math.isnan(v)]
        got = mine[SERVEGEN_START + pd.Timedelta(hours=hour)]
        if kept:
            assert got == pytest.approx(sum(kept) / len(kept))
        else:
            gaps += 1
            assert math.isnan(got)
    assert len(mine) == len(windows) == 14 * 24 and gaps > 0  # m-mid has whole hours in collection gaps


def test_the_naive_forecasts_mape_by_hand(loads, result):
    series = loads[loads["region"] == "language/m-small"].set_index("hour_utc")["requests_per_s"]
    start = series.index.min()
    errors = []
    for day in range(7, 14):
        for hour in range(24):
            t = start + pd.Timedelta(days=day, hours=hour)
            actual, forecast = series[t], series[t - pd.Timedelta(days=1)]
            if math.isfinite(actual) and math.isfinite(forecast):
                errors.append(abs(forecast - actual) / actual)
    row = next(r for r in result["results"] if r["service"] == "language/m-small" and r["model"] == "naive-24")
    assert row["scored_hours"] == len(errors) and row["mape_pct"] == pytest.approx(100 * sum(errors) / len(errors))


def test_every_model_is_scored_and_the_one_day_services_are_named_skipped(result):
    assert {(r["service"], r["model"]) for r in result["results"]} == {
        (s, m) for s in ("language/m-large", "language/m-mid", "language/m-small") for m in ("naive-24", "lgbm")
    }
    assert set(result["skipped"]) == {"multimodal/mm-image", "reason/deepseek-r1"}
    lgbm = [r for r in result["results"] if r["model"] == "lgbm"]
    assert all(r["unforecast_hours"] == 0 and r["mape_pct"] < 100 for r in lgbm)
    f = result["forecasts"].dropna(subset=["p50"])  # the naive reads a gap yesterday: no forecast
    assert ((f["p10"] <= f["p50"]) & (f["p50"] <= f["p90"])).all()
