"""Metric definitions: MAPE, error as % of mean output, coverage, horizon buckets, summaries."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.evaluation import metrics


def test_mape_known_value():
    assert metrics.mape([100, 200], [110, 180]) == pytest.approx(10.0)


def test_mape_ignores_missing_and_nonpositive_actuals():
    assert metrics.mape([100, np.nan, 0, 50], [90, 1, 5, np.nan]) == pytest.approx(10.0)
    assert np.isnan(metrics.mape([0, 0], [1, 1]))


def test_error_pct_of_mean_handles_zero_hours():
    # Solar: zeros at night would make MAPE infinite; the metric is MAE / mean actual.
    actual = [0, 0, 100, 300]
    forecast = [0, 10, 120, 260]
    assert metrics.error_pct_of_mean(actual, forecast) == pytest.approx((10 + 20 + 40) / 4 / 100 * 100)


def test_coverage_inclusive_bounds():
    assert metrics.coverage([1, 2, 3, 4], [1, 0, 4, 0], [1, 1, 5, 5]) == pytest.approx(50.0)


def test_pinball_is_zero_for_perfect_and_asymmetric():
    assert metrics.pinball([1, 2], [1, 2], 0.9) == 0
    assert metrics.pinball([10], [0], 0.9) == pytest.approx(9.0)
    assert metrics.pinball([0], [10], 0.9) == pytest.approx(1.0)


def test_horizon_buckets():
    labels = metrics.horizon_bucket([1, 6, 7, 24, 25, 48, 49, 96, 97]).tolist()
    assert labels[:8] == ["1-6", "1-6", "7-24", "7-24", "25-48", "25-48", "49-96", "49-96"]
    assert pd.isna(labels[8])


def test_summarize_by_bucket_and_day_ahead():
    h = np.tile(np.arange(1, 97), 2)
    actual = np.full(len(h), 100.0)
    p50 = np.where(h <= 24, 110.0, 80.0)
    frame = pd.DataFrame({"horizon_h": h, "actual": actual, "p50": p50, "p10": p50 - 15, "p90": p50 + 15})
    out = metrics.summarize(frame, "carbon_intensity")
    assert out["day_ahead_mape"] == pytest.approx(10.0)
    assert out["by_horizon"]["1-6"]["mape"] == pytest.approx(10.0)
    assert out["by_horizon"]["49-96"]["mape"] == pytest.approx(20.0)
    assert out["by_horizon"]["1-6"]["coverage_p10_p90"] == pytest.approx(100.0)
    assert out["by_horizon"]["49-96"]["coverage_p10_p90"] == pytest.approx(0.0)
    wind = metrics.summarize(frame, "wind")
    assert "error_pct_of_mean" in wind and "day_ahead_error_pct_of_mean" in wind
