"""Seasonal naive and LightGBM: real (tiny) training, beating naive on a short window, no look-ahead."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.data import mask_known
from forecasting.evaluation.backtest import rolling_forecasts, score
from forecasting.evaluation.metrics import mape
from forecasting.models.lgbm import LGBMForecaster
from forecasting.models.naive import SeasonalNaive

TRAIN_END = pd.Timestamp("2021-04-01", tz="UTC")
CONTRACT = ["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"]


def tiny_lgbm(**kw):
    params = dict(horizon=24, n_estimators=60, learning_rate=0.1, issue_hours=(0, 6, 12, 18))
    params.update(kw)
    return LGBMForecaster(**params)


@pytest.fixture(scope="module")
def history(grid_frame):
    return grid_frame[grid_frame["hour_utc"] < TRAIN_END]


@pytest.fixture(scope="module")
def fitted_lgbm(history):
    return tiny_lgbm().fit(history, "carbon_intensity")


def _garbage_future(frame: pd.DataFrame, T: pd.Timestamp) -> pd.DataFrame:
    """Every observed value from T on replaced by nonsense (targets, mix, flags): a model that reads any of them
    changes its output."""
    out = frame.copy()
    future = out["hour_utc"] >= T
    rng = np.random.default_rng(0)
    for col in out.columns:
        if col.endswith(("_mw", "_kwh", "_share")):
            out.loc[future, col] = rng.uniform(1e5, 1e6, future.sum())
    return out


def test_naive_returns_the_same_hour_of_the_last_known_day(grid_frame, history):
    model = SeasonalNaive(24).fit(history, "carbon_intensity")
    T = pd.Timestamp("2021-04-05", tz="UTC")
    out = model.predict(T, 48, grid_frame)
    assert list(out.columns) == CONTRACT
    de = grid_frame[grid_frame["region"] == "DE"].set_index("hour_utc")["carbon_intensity_direct_gco2_per_kwh"]
    row = out[(out["region"] == "DE") & (out["horizon_h"] == 30)].iloc[0]
    # h = 30 → target 2021-04-06 05:00; the last day whose 05:00 is known is 2021-04-04.
    assert row["target_time"] == pd.Timestamp("2021-04-06 05:00", tz="UTC")
    assert row["p50"] == pytest.approx(de[pd.Timestamp("2021-04-04 05:00", tz="UTC")])
    assert (out["p10"] <= out["p50"]).all() and (out["p50"] <= out["p90"]).all()
    weekly = SeasonalNaive(168).fit(history, "carbon_intensity").predict(T, 24, grid_frame)
    row = weekly[(weekly["region"] == "DE") & (weekly["horizon_h"] == 3)].iloc[0]
    assert row["p50"] == pytest.approx(de[pd.Timestamp("2021-03-29 02:00", tz="UTC")])


def test_lgbm_output_contract_and_quantile_order(fitted_lgbm, grid_frame):
    T = pd.Timestamp("2021-04-10", tz="UTC")
    out = fitted_lgbm.predict(T, 24, grid_frame)
    assert list(out.columns) == CONTRACT
    assert len(out) == 48 and set(out["region"]) == {"CISO", "DE"}
    assert out["horizon_h"].tolist()[:24] == list(range(1, 25))
    assert (out["target_time"] == out["issued_at"] + (out["horizon_h"] - 1) * pd.Timedelta(hours=1)).all()
    assert (out["p10"] <= out["p50"]).all() and (out["p50"] <= out["p90"]).all()
    assert out[["p10", "p50", "p90"]].notna().all().all()


def test_lgbm_training_loss_falls_with_boosting(history):
    """More boosting rounds → lower in-sample pinball loss of the P50 (the model really learns)."""
    model = tiny_lgbm(quantiles=(0.5,), n_estimators=80)
    X, y, _ = model.training_rows(history, "DE", "carbon_intensity_direct_gco2_per_kwh")
    import lightgbm as lgb

    booster = lgb.LGBMRegressor(**model._params(0.5)).fit(X, y)
    losses = [np.mean(np.abs(y - booster.predict(X, num_iteration=k))) for k in (1, 10, 40, 80)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.5 * losses[0]


def test_lgbm_beats_seasonal_naive_on_april(fitted_lgbm, history, grid_frame):
    naive = SeasonalNaive(24).fit(history, "carbon_intensity")
    end = "2021-04-28"
    scored = {}
    for model in (fitted_lgbm, naive):
        f = rolling_forecasts(model, grid_frame, "2021-04-01", end, horizon=24, context_days=14)
        s = score(f, grid_frame, "carbon_intensity", end)
        scored[model.name] = mape(s["actual"], s["p50"])
    assert scored["lgbm"] < 0.9 * scored["naive-24"], scored


@pytest.mark.parametrize("target", ["carbon_intensity", "wind"])
def test_lgbm_no_leakage(history, grid_frame, target):
    model = tiny_lgbm(n_estimators=20).fit(history, target) if target == "wind" else None
    model = model or tiny_lgbm(n_estimators=20).fit(history, target)
    T = pd.Timestamp("2021-04-12", tz="UTC")
    clean = model.predict(T, 24, grid_frame)
    dirty = model.predict(T, 24, _garbage_future(grid_frame, T))
    pd.testing.assert_frame_equal(clean, dirty)


def test_naive_no_leakage(history, grid_frame):
    model = SeasonalNaive(24).fit(history, "solar")
    T = pd.Timestamp("2021-04-12", tz="UTC")
    pd.testing.assert_frame_equal(
        model.predict(T, 96, grid_frame), model.predict(T, 96, _garbage_future(grid_frame, T))
    )


def test_feature_builder_refuses_to_read_the_future(history):
    from forecasting.models.lgbm import FeatureSpec, RegionSeries, build_features

    series = RegionSeries(history[history["region"] == "DE"], ["carbon_intensity_direct_gco2_per_kwh"])
    spec = FeatureSpec("carbon_intensity_direct_gco2_per_kwh")
    X, t, T = build_features(series, "DE", np.array([500]), np.arange(1, 97), spec)
    assert (t >= T).all() and len(X) == 96
    # Lag features only ever read indices < T: a value at T itself must not influence them.
    series.arrays["carbon_intensity_direct_gco2_per_kwh"][500:] = 1e9
    X2, _, _ = build_features(series, "DE", np.array([500]), np.arange(1, 97), spec)
    pd.testing.assert_frame_equal(X, X2)


def test_masked_input_gives_the_same_forecast(fitted_lgbm, grid_frame):
    T = pd.Timestamp("2021-04-15", tz="UTC")
    pd.testing.assert_frame_equal(
        fitted_lgbm.predict(T, 24, grid_frame), fitted_lgbm.predict(T, 24, mask_known(grid_frame, T))
    )
