"""ProphetForecaster: trained for real on a few regions of the shared grid files (seconds)."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import pytest

from forecasting.base import TARGET_COLUMNS

REGIONS = ("CISO", "PJM", "SE")
CUTOFF = pd.Timestamp("2021-07-01", tz="UTC")
COLUMN = TARGET_COLUMNS["carbon_intensity"]
ISSUES = pd.date_range("2021-07-01", periods=14, freq="D", tz="UTC")


def _covers(frame: pd.DataFrame, regions, start, end) -> bool:
    return (
        set(regions) <= set(frame["region"].unique())
        and frame["hour_utc"].min() <= pd.Timestamp(start, tz="UTC")
        and frame["hour_utc"].max() >= pd.Timestamp(end, tz="UTC")
    )


@pytest.fixture(scope="module")
def frame(request) -> pd.DataFrame:
    """The other suite's session `grid_frame` when it covers what we need, else a small frame from the files."""
    try:
        shared = request.getfixturevalue("grid_frame")
        if _covers(shared, REGIONS, "2021-01-01", "2021-07-20"):
            return shared[shared["region"].isin(REGIONS)].reset_index(drop=True)
    except pytest.FixtureLookupError:
        pass
    data_dir = request.getfixturevalue("data_dir")
    from forecasting.data import grid_hourly_from_files

    return grid_hourly_from_files(data_dir, REGIONS, start="2020-12-01", end="2021-07-20")


@pytest.fixture(scope="module")
def fitted(frame):
    from forecasting.models.prophet_model import ProphetForecaster

    return ProphetForecaster(history_days=180).fit(frame[frame["hour_utc"] < CUTOFF], "carbon_intensity")


def _day_ahead(model, frame) -> pd.DataFrame:
    from forecasting.data import mask_known

    out = []
    for issued in ISSUES:
        window = frame[
            (frame["hour_utc"] >= issued - pd.Timedelta(days=10))
            & (frame["hour_utc"] < issued + pd.Timedelta(hours=24))
        ]
        out.append(model.predict(issued, 24, mask_known(window, issued)))
    scored = pd.concat(out, ignore_index=True)
    actual = frame[["region", "hour_utc", COLUMN]].rename(columns={"hour_utc": "target_time", COLUMN: "actual"})
    return scored.merge(actual, on=["region", "target_time"], how="left")


def _mape(scored: pd.DataFrame) -> float:
    return float(((scored["p50"] - scored["actual"]).abs() / scored["actual"]).mean() * 100)


def test_output_contract(fitted, frame):
    out = fitted.predict(pd.Timestamp("2021-07-05T10:20Z"), 48, frame)
    assert list(out.columns) == ["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"]
    assert sorted(out["region"].unique()) == sorted(REGIONS)
    assert (out["issued_at"] == pd.Timestamp("2021-07-05T11:00Z")).all()  # rounded up to the hour
    for _, part in out.groupby("region"):
        assert part["horizon_h"].tolist() == list(range(1, 49))
        assert (part["target_time"].diff().dropna() == pd.Timedelta(hours=1)).all()
        assert part["target_time"].iloc[0] == pd.Timestamp("2021-07-05T11:00Z")
    assert np.isfinite(out[["p10", "p50", "p90"]].to_numpy()).all()
    assert (out["p10"] <= out["p50"]).all() and (out["p50"] <= out["p90"]).all()
    assert (out["p10"] >= 0).all()
    assert (out["model"] == "prophet").all()


def test_weather_regressors_only_where_present(fitted):
    assert "dswrf_w_per_m2" in fitted._regressors["CISO"]
    assert fitted._regressors["PJM"] == []  # PJM has no weather file


def test_uses_only_data_known_at_issue(fitted, frame):
    issued = pd.Timestamp("2021-07-08T00:00Z")
    base = fitted.predict(issued, 24, frame)
    future_changed = frame.copy()
    after = future_changed["hour_utc"] >= issued
    future_changed.loc[after, COLUMN] = future_changed.loc[after, COLUMN] * 10
    pd.testing.assert_frame_equal(base, fitted.predict(issued, 24, future_changed))
    past_changed = frame.copy()
    recent = (past_changed["hour_utc"] < issued) & (past_changed["hour_utc"] >= issued - pd.Timedelta(hours=6))
    past_changed.loc[recent, COLUMN] = past_changed.loc[recent, COLUMN] * 1.5
    moved = fitted.predict(issued, 24, past_changed)
    assert (moved["p50"] > base["p50"]).mean() > 0.9  # the residual correction follows the recent level


def test_sane_and_correction_helps(fitted, frame):
    """Prophet alone was worse than persistence (the issue). The residual correction must beat plain Prophet,
    stay within a sane distance of the seasonal naive, and give roughly calibrated P10–P90 bands."""
    from forecasting.models.naive import SeasonalNaive
    from forecasting.models.prophet_model import ProphetForecaster

    history = frame[frame["hour_utc"] < CUTOFF]
    corrected = _day_ahead(fitted, frame)
    plain = _day_ahead(
        ProphetForecaster(history_days=180, residual_correction=False).fit(history, "carbon_intensity"), frame
    )
    naive = _day_ahead(SeasonalNaive(period=24).fit(history, "carbon_intensity"), frame)
    m_corr, m_plain, m_naive = _mape(corrected), _mape(plain), _mape(naive)
    logging.getLogger(__name__).info("day-ahead MAPE corrected %.2f plain %.2f naive %.2f", m_corr, m_plain, m_naive)
    assert m_corr < m_plain
    assert m_corr < 1.5 * m_naive
    inside = ((corrected["actual"] >= corrected["p10"]) & (corrected["actual"] <= corrected["p90"])).mean()
    assert 0.5 <= inside <= 0.97


def test_save_load_roundtrip(fitted, frame, tmp_path):
    from forecasting.models.prophet_model import ProphetForecaster

    fitted.save(tmp_path)
    again = ProphetForecaster.load(tmp_path)
    issued = pd.Timestamp("2021-07-03T00:00Z")
    pd.testing.assert_frame_equal(fitted.predict(issued, 24, frame), again.predict(issued, 24, frame))


def test_region_without_target_is_skipped(frame):
    from forecasting.models.prophet_model import ProphetForecaster

    history = frame[(frame["hour_utc"] < CUTOFF) & (frame["hour_utc"] >= CUTOFF - pd.Timedelta(days=40))]
    model = ProphetForecaster(history_days=40, yearly_seasonality=False).fit(history, "solar")
    assert "SE" in model.skipped_  # SE has no solar column
    out = model.predict(CUTOFF, 24, frame)
    assert "SE" not in set(out["region"]) and {"CISO", "PJM"} <= set(out["region"])


def test_beats_the_seasonal_naive_where_persistence_is_weak(data_dir):
    """DE and ERCO, the two of the six regions where the day-ahead persistence is weakest: Prophet with its residual
    correction forecasts 14 days of July 2021 better than the seasonal naive (measured: MAPE 7.8 % against 10.7 %;
    CISO/PJM/SE, where persistence is strong, are checked against 1.5× naive above)."""
    from forecasting.data import grid_hourly_from_files
    from forecasting.models.naive import SeasonalNaive
    from forecasting.models.prophet_model import ProphetForecaster

    frame = grid_hourly_from_files(data_dir, ("DE", "ERCO"), start="2020-12-01", end="2021-07-20")
    history = frame[frame["hour_utc"] < CUTOFF]
    prophet = _mape(_day_ahead(ProphetForecaster(history_days=180).fit(history, "carbon_intensity"), frame))
    naive = _mape(_day_ahead(SeasonalNaive(period=24).fit(history, "carbon_intensity"), frame))
    assert prophet < naive, (prophet, naive)
