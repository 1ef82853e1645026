"""Ensemble weights and conformal calibration, the mix composite, the operator blend: real tiny fits, no leakage."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pandas as pd
import pytest

from forecasting.base import Forecaster
from forecasting.evaluation.backtest import rolling_forecasts, score
from forecasting.evaluation.metrics import coverage, error_pct_of_mean, mape
from forecasting.models import ensemble as ens
from forecasting.models.blend import PublishedBlendForecaster
from forecasting.models.frames import ForecastMemory
from forecasting.models.lgbm import LGBMForecaster
from forecasting.models.mix import MixCompositeForecaster
from forecasting.models.naive import SeasonalNaive

TRAIN_END = pd.Timestamp("2021-04-01", tz="UTC")


def fresh(model):
    """A deep copy with every forecast memory emptied, so nothing cached from earlier calls is reused."""
    model = copy.deepcopy(model)
    seen = set()

    def walk(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Forecaster):
            for key, value in list(vars(obj).items()):
                if isinstance(value, ForecastMemory):
                    setattr(obj, key, ForecastMemory())
                elif isinstance(value, list) and value and all(isinstance(v, ForecastMemory) for v in value):
                    if key == "_memory" and isinstance(obj, ens.EnsembleForecaster):
                        continue  # the ensemble's validation forecasts are part of its fitted state
                    setattr(obj, key, [ForecastMemory() for _ in value])
                else:
                    walk(value)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(model)
    return model


def _garbage_future(frame, T):
    out = frame.copy()
    future = out["hour_utc"] >= T
    for col in out.columns:
        if col.endswith(("_mw", "_kwh", "_share")) and not col.startswith("published_"):
            out.loc[future, col] = 1e6
    return out


def test_fit_weights_recovers_the_best_member():
    rng = np.random.default_rng(1)
    y = rng.uniform(100, 200, 400)
    good = y + rng.normal(0, 2, 400)
    bad = y + rng.normal(0, 30, 400)
    w = ens.fit_weights(np.column_stack([bad, good]), y, relative=True)
    assert w[1] > 0.85 and w.sum() == pytest.approx(1.0) and (w >= 0).all()
    w_fast = ens.fit_weights_fast(np.column_stack([bad, good, bad]), y, relative=False)
    assert w_fast[1] > 0.85 and w_fast.sum() == pytest.approx(1.0)


def test_conformal_offsets_reach_the_nominal_coverage():
    rng = np.random.default_rng(2)
    y = rng.normal(0, 1, 5000)
    p50 = np.zeros_like(y)
    p10, p90 = p50 - 0.5, p50 + 0.5  # far too narrow: ~38 % coverage
    lo, hi = ens.conformal_offsets(p10[:2500], p50[:2500], p90[:2500], y[:2500])
    a, b = ens.apply_offsets(p10[2500:], p50[2500:], p90[2500:], lo, hi, floor=1e-6, nonnegative=False)
    assert coverage(y[2500:], a, b) == pytest.approx(80, abs=3)


class Constant(Forecaster):
    """A deliberately bad member: the training mean for every hour."""

    name = "constant"

    def fit(self, history, target):
        self.col = {"carbon_intensity": "carbon_intensity_direct_gco2_per_kwh"}.get(target, target)
        self.mean = history.groupby("region")[self.col].mean()
        return self

    def predict(self, issued_at, horizon, data):
        T = pd.Timestamp(issued_at)
        rows = []
        for region, m in self.mean.items():
            h = np.arange(1, horizon + 1)
            rows.append(
                pd.DataFrame(
                    {
                        "region": region,
                        "issued_at": T,
                        "target_time": T + (h - 1) * pd.Timedelta(hours=1),
                        "horizon_h": h,
                        "p10": m * 0.9,
                        "p50": m,
                        "p90": m * 1.1,
                        "model": self.name,
                    }
                )
            )
        return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def fitted_ensemble(grid_frame):
    members = [
        LGBMForecaster(horizon=24, n_estimators=30, learning_rate=0.2, issue_hours=(0, 12)),
        SeasonalNaive(24),
        Constant(),
    ]
    model = ens.EnsembleForecaster(members, validation_days=14, rolling_days=7, horizon=24)
    return model.fit(grid_frame[grid_frame["hour_utc"] < TRAIN_END], "carbon_intensity")


def test_ensemble_weighs_down_a_bad_member_and_accepts_any_forecaster(fitted_ensemble):
    w = fitted_ensemble.weights()
    assert set(w["region"]) == {"CISO", "DE"}
    assert (w["constant"] <= 0.25).all()
    assert np.allclose(w[["lgbm", "naive-24", "constant"]].sum(axis=1), 1.0)


def test_ensemble_backtest_is_calibrated_and_beats_naive(fitted_ensemble, grid_frame):
    f = rolling_forecasts(fitted_ensemble, grid_frame, "2021-04-01", "2021-04-21", horizon=24, context_days=20)
    s = score(f, grid_frame, "carbon_intensity", "2021-04-21")
    naive = SeasonalNaive(24).fit(grid_frame[grid_frame["hour_utc"] < TRAIN_END], "carbon_intensity")
    n = score(
        rolling_forecasts(naive, grid_frame, "2021-04-01", "2021-04-21", 24, context_days=10),
        grid_frame,
        "carbon_intensity",
        "2021-04-21",
    )
    assert mape(s["actual"], s["p50"]) < mape(n["actual"], n["p50"])
    assert 65 <= coverage(s["actual"], s["p10"], s["p90"]) <= 95
    assert (s["p10"] <= s["p50"]).all() and (s["p50"] <= s["p90"]).all()


def test_ensemble_no_leakage(fitted_ensemble, grid_frame):
    T = pd.Timestamp("2021-04-20", tz="UTC")
    window = grid_frame[grid_frame["hour_utc"] >= T - pd.Timedelta(days=20)]
    clean = fresh(fitted_ensemble).predict(T, 24, window)
    dirty = fresh(fitted_ensemble).predict(T, 24, _garbage_future(window, T))
    pd.testing.assert_frame_equal(clean, dirty)


@pytest.fixture(scope="module")
def fitted_mix(grid_frame):
    model = MixCompositeForecaster(horizon=24, n_estimators=25, learning_rate=0.2, calibration_days=5)
    de = grid_frame[grid_frame["region"] == "DE"]
    return model.fit(de[de["hour_utc"] < TRAIN_END], "carbon_intensity")


def test_mix_composes_from_the_sources_and_beats_naive(fitted_mix, grid_frame):
    assert {"coal", "nat_gas"} <= set(fitted_mix._fuel_models)
    assert set(fitted_mix._plugins) == {"wind", "solar"}
    de = grid_frame[grid_frame["region"] == "DE"]
    f = rolling_forecasts(fitted_mix, de, "2021-04-01", "2021-04-20", horizon=24, context_days=20)
    s = score(f, de, "carbon_intensity", "2021-04-20")
    naive = SeasonalNaive(24).fit(de[de["hour_utc"] < TRAIN_END], "carbon_intensity")
    n = score(
        rolling_forecasts(naive, de, "2021-04-01", "2021-04-20", 24, context_days=10),
        de,
        "carbon_intensity",
        "2021-04-20",
    )
    assert mape(s["actual"], s["p50"]) < mape(n["actual"], n["p50"])


def test_mix_no_leakage(fitted_mix, grid_frame):
    T = pd.Timestamp("2021-04-15", tz="UTC")
    window = grid_frame[(grid_frame["hour_utc"] >= T - pd.Timedelta(days=20)) & (grid_frame["region"] == "DE")]
    clean = fresh(fitted_mix).predict(T, 24, window)
    dirty = fresh(fitted_mix).predict(T, 24, _garbage_future(window, T))
    pd.testing.assert_frame_equal(clean, dirty)


@pytest.fixture(scope="module")
def operator_setup(summer_frame):
    base = LGBMForecaster(horizon=24, n_estimators=30, learning_rate=0.2, issue_hours=(0,))
    blend = PublishedBlendForecaster(base, window_days=10, min_days=5)
    blend.fit(summer_frame[summer_frame["hour_utc"] < "2021-07-01"], "wind")
    return blend


def test_operator_blend_uses_the_published_forecast(operator_setup, summer_frame):
    f = rolling_forecasts(operator_setup, summer_frame, "2021-07-01", "2021-07-21", horizon=24, context_days=50)
    s = score(f, summer_frame, "wind", "2021-07-21").merge(
        summer_frame[["region", "hour_utc", "published_wind_mw"]].rename(columns={"hour_utc": "target_time"}),
        on=["region", "target_time"],
    )
    base = score(
        rolling_forecasts(operator_setup.base, summer_frame, "2021-07-01", "2021-07-21", 24, context_days=50),
        summer_frame,
        "wind",
        "2021-07-21",
    )
    de = s[s["region"] == "DE"]
    # Far better than the weather-only base; about as good as the published forecast itself.
    assert error_pct_of_mean(de["actual"], de["p50"]) < 0.6 * error_pct_of_mean(
        base[base["region"] == "DE"]["actual"], base[base["region"] == "DE"]["p50"]
    )
    assert error_pct_of_mean(de["actual"], de["p50"]) < 1.25 * error_pct_of_mean(de["actual"], de["published_wind_mw"])


def test_operator_blend_no_leakage_of_unpublished_forecasts(operator_setup, summer_frame):
    T = pd.Timestamp("2021-07-20", tz="UTC")
    window = summer_frame[summer_frame["hour_utc"] >= T - pd.Timedelta(days=50)]
    clean = fresh(operator_setup).predict(T, 24, window)
    dirty = _garbage_future(window, T)
    # The DE/SE forecast for the next CET day (from 22:00 UTC) is not published at 00:00 UTC: garbage it.
    late = dirty["hour_utc"] >= pd.Timestamp("2021-07-20 22:00", tz="UTC")
    dirty.loc[late & (dirty["region"] == "DE"), "published_wind_mw"] = 1e6
    dirty.loc[
        (dirty["hour_utc"] >= pd.Timestamp("2021-07-21 07:00", tz="UTC")) & (dirty["region"] == "CISO"),
        "published_wind_mw",
    ] = 1e6
    pd.testing.assert_frame_equal(clean, fresh(operator_setup).predict(T, 24, dirty))


def test_fitted_models_pickle_round_trip(fitted_ensemble, grid_frame):
    """The registry stores models with pickle: a round trip must forecast identically."""
    import pickle

    T = pd.Timestamp("2021-04-08", tz="UTC")
    window = grid_frame[grid_frame["hour_utc"] >= T - pd.Timedelta(days=20)]
    restored = pickle.loads(pickle.dumps(fresh(fitted_ensemble)))
    pd.testing.assert_frame_equal(fresh(fitted_ensemble).predict(T, 24, window), restored.predict(T, 24, window))


def test_ensemble_takes_an_offered_member_fitted_on_the_same_history(fitted_ensemble, grid_frame):
    """forecasting.service offers the models it already fitted on the same frame: the ensemble takes a member of the
    same class and parameters fitted up to the same hour (so it forecasts exactly as if it had fitted it itself), and
    refuses one fitted on another history or with other parameters."""
    history = grid_frame[grid_frame["hour_utc"] < TRAIN_END]
    end = history["hour_utc"].max() + pd.Timedelta(hours=1)
    lgbm_params = dict(horizon=24, n_estimators=30, learning_rate=0.2, issue_hours=(0, 12))

    def offered(**overrides):
        model = LGBMForecaster(**{**lgbm_params, **overrides}).fit(history, "carbon_intensity")
        model.offered_ = True  # a fitted attribute: ignored by the parameter comparison, visible after reuse
        return model

    def ensemble(offers):
        model = ens.EnsembleForecaster(
            [LGBMForecaster(**lgbm_params), SeasonalNaive(24), Constant()],
            validation_days=14,
            rolling_days=7,
            horizon=24,
        )
        model.offer_fitted(offers)
        return model.fit(history, "carbon_intensity")

    reused = ensemble([(offered(), "carbon_intensity", end)])
    assert getattr(reused._fitted[0], "offered_", False)
    T = TRAIN_END + pd.Timedelta(days=3)
    pd.testing.assert_frame_equal(
        fresh(reused).predict(T, 24, grid_frame), fresh(fitted_ensemble).predict(T, 24, grid_frame)
    )
    assert not hasattr(reused, "_offered") or reused._offered == []  # the offers are not kept in the artifact
    for offers in (
        [(offered(), "carbon_intensity", end - pd.Timedelta(hours=1))],  # another history
        [(offered(), "solar", end)],  # another target
        [(offered(n_estimators=31), "carbon_intensity", end)],
    ):  # other parameters
        assert not getattr(ensemble(offers)._fitted[0], "offered_", False)


def test_artifacts_pickled_with_the_old_module_paths_still_load():
    """Registered artifacts pickled while the operator blend and the forecast memory lived in ensemble.py name them
    there: the names must still resolve."""
    blob = pickle.dumps(PublishedBlendForecaster(SeasonalNaive(24)), protocol=0)
    old = blob.replace(b"forecasting.models.blend\n", b"forecasting.models.ensemble\n")
    old = old.replace(b"forecasting.models.frames\n", b"forecasting.models.ensemble\n")
    assert b"forecasting.models.blend\n" not in old and b"forecasting.models.frames\n" not in old
    model = pickle.loads(old)
    assert isinstance(model, PublishedBlendForecaster) and isinstance(model._memory, ForecastMemory)
