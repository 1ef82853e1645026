"""TFTForecaster: a tiny global TFT trained for real on two regions (one thread, seconds).

DE and ERCO: the two regions of the six where the day-ahead persistence (seasonal naive) is weakest, so a tiny
model can show within a minute that it forecasts better than the naive baseline, not only that it runs."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import pytest

from forecasting.base import TARGET_COLUMNS

REGIONS = ("DE", "ERCO")
CUTOFF = pd.Timestamp("2021-07-01", tz="UTC")
COLUMN = TARGET_COLUMNS["carbon_intensity"]


def _settings(**overrides):
    from forecasting.models.tft_model import TFTSettings

    base = dict(
        max_encoder_length=72,
        max_prediction_length=48,
        max_epochs=4,
        limit_train_batches=8,
        history_days=60,
        normalizer="encoder",
        seed=7,
    )
    base.update(overrides)
    return TFTSettings.tiny(**base)


@pytest.fixture(scope="module")
def frame(request) -> pd.DataFrame:
    try:
        shared = request.getfixturevalue("grid_frame")
        if (
            set(REGIONS) <= set(shared["region"])
            and shared["hour_utc"].min() <= pd.Timestamp("2021-04-01", tz="UTC")
            and shared["hour_utc"].max() >= pd.Timestamp("2021-07-12", tz="UTC")
        ):
            return shared[shared["region"].isin(REGIONS)].reset_index(drop=True)
    except pytest.FixtureLookupError:
        pass
    data_dir = request.getfixturevalue("data_dir")
    from forecasting.data import grid_hourly_from_files

    return grid_hourly_from_files(data_dir, REGIONS, start="2021-04-01", end="2021-07-12")


@pytest.fixture(scope="module")
def fitted(frame):
    import torch

    from forecasting.models.tft_model import TFTForecaster

    torch.set_num_threads(1)
    return TFTForecaster(_settings()).fit(frame[frame["hour_utc"] < CUTOFF], "carbon_intensity")


def test_training_loss_falls(fitted):
    losses = fitted.train_losses_
    assert len(losses) == 4 and fitted.epochs_run_ == 4
    assert losses[-1] < 0.8 * losses[0], losses
    assert fitted.regions_ == sorted(REGIONS)
    assert "dswrf_w_per_m2" in fitted._weather  # DE and ERCO carry the GFS weather forecasts


def test_output_contract_and_bounds(fitted, frame):
    out = fitted.predict(pd.Timestamp("2021-07-03T05:30Z"), 48, frame)
    assert list(out.columns) == ["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"]
    assert sorted(out["region"].unique()) == sorted(REGIONS)
    assert (out["issued_at"] == pd.Timestamp("2021-07-03T06:00Z")).all()
    for _, part in out.groupby("region"):
        assert part["horizon_h"].tolist() == list(range(1, 49))
        assert part["target_time"].iloc[0] == pd.Timestamp("2021-07-03T06:00Z")
    assert np.isfinite(out[["p10", "p50", "p90"]].to_numpy()).all()
    assert (out["p10"] <= out["p50"]).all() and (out["p50"] <= out["p90"]).all() and (out["p10"] >= 0).all()
    assert (out["model"] == "tft").all()
    with pytest.raises(ValueError, match="horizon"):
        fitted.predict(CUTOFF, 49, frame)


def test_uses_only_data_known_at_issue(fitted, frame):
    issued = pd.Timestamp("2021-07-06T00:00Z")
    base = fitted.predict(issued, 24, frame)
    changed = frame.copy()
    after = changed["hour_utc"] >= issued
    changed.loc[after, COLUMN] = changed.loc[after, COLUMN] * 5
    pd.testing.assert_frame_equal(base, fitted.predict(issued, 24, changed))
    before = (changed["hour_utc"] < issued) & (changed["hour_utc"] >= issued - pd.Timedelta(hours=24))
    changed.loc[before, COLUMN] = changed.loc[before, COLUMN] * 2
    assert not np.allclose(base["p50"], fitted.predict(issued, 24, changed)["p50"])  # the encoder reads the past


def test_beats_climatology_and_the_seasonal_naive(fitted, frame):
    """Day-ahead forecasts of ten issues after the cut-off: the tiny TFT must beat each region's training mean (it
    reads the encoder and the calendar) and the seasonal naive (measured: MAPE 9.6 % against 10.9 %)."""
    from forecasting.data import mask_known
    from forecasting.models.naive import SeasonalNaive

    history = frame[frame["hour_utc"] < CUTOFF]
    mean = history.groupby("region")[COLUMN].mean()
    naive = SeasonalNaive(24).fit(history, "carbon_intensity")
    rows, naive_rows = [], []
    for issued in pd.date_range(CUTOFF, periods=10, freq="D"):
        rows.append(fitted.predict(issued, 24, mask_known(frame, issued)))
        naive_rows.append(naive.predict(issued, 24, mask_known(frame, issued)))
    actual = frame[["region", "hour_utc", COLUMN]].rename(columns={"hour_utc": "target_time"})
    scored = pd.concat(rows).merge(actual, on=["region", "target_time"])
    scored_naive = pd.concat(naive_rows).merge(actual, on=["region", "target_time"])
    ape_tft = ((scored["p50"] - scored[COLUMN]).abs() / scored[COLUMN]).mean()
    ape_clim = ((scored["region"].map(mean) - scored[COLUMN]).abs() / scored[COLUMN]).mean()
    ape_naive = ((scored_naive["p50"] - scored_naive[COLUMN]).abs() / scored_naive[COLUMN]).mean()
    assert len(scored) == len(scored_naive) == 10 * 24 * len(REGIONS)
    assert ape_tft < ape_clim, (ape_tft, ape_clim)
    assert ape_tft < ape_naive, (ape_tft, ape_naive)
    inside = ((scored[COLUMN] >= scored["p10"]) & (scored[COLUMN] <= scored["p90"])).mean()
    assert inside > 0.3


def test_save_load_and_registry_artifact_roundtrip(fitted, frame, tmp_path):
    from forecasting.models.tft_model import TFTForecaster
    from warehouse import model_registry

    issued = pd.Timestamp("2021-07-04T00:00Z")
    expected = fitted.predict(issued, 24, frame)
    fitted.save(tmp_path / "plain")
    pd.testing.assert_frame_equal(expected, TFTForecaster.load(tmp_path / "plain").predict(issued, 24, frame))
    model_registry.save_artifact(fitted, tmp_path / "reg")
    loaded = model_registry.load_artifact(tmp_path / "reg")
    assert isinstance(loaded, TFTForecaster) and loaded.train_losses_ == fitted.train_losses_
    pd.testing.assert_frame_equal(expected, loaded.predict(issued, 24, frame))


def test_seeded_training_is_reproducible(frame):
    from forecasting.models.tft_model import TFTForecaster

    history = frame[frame["hour_utc"] < CUTOFF]
    quick = _settings(max_epochs=1, limit_train_batches=3, history_days=20)
    a = TFTForecaster(quick).fit(history, "carbon_intensity")
    b = TFTForecaster(quick).fit(history, "carbon_intensity")
    assert a.train_losses_ == b.train_losses_
    pd.testing.assert_frame_equal(a.predict(CUTOFF, 24, frame), b.predict(CUTOFF, 24, frame))
