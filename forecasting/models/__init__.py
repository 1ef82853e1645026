"""Forecasters behind `forecasting.base.Forecaster`.

`make_model(name, target)` builds the configured model by name:

- `naive-24`, `naive-168`: seasonal naive (same hour on the last known day / week), `naive.py`;
- `lgbm`: LightGBM with quantile objectives on lags, calendar and weather forecasts, `lgbm.py`;
- `mix`: carbon intensity composed from per-source generation forecasts with the emission factors, `mix.py`;
- `ensemble`: weights and P10–P90 calibration fitted on a validation window (re-fitted on the weeks before each
  issue), with the operators' published solar/wind forecasts blended in where known, `ensemble.py`.

Prophet and TFT live in `prophet_model.py` / `tft_model.py` and are built by `forecasting.registry.make_model`, which
also builds these by delegating here; `EnsembleForecaster` accepts any `Forecaster` as a member.
"""
from __future__ import annotations

from forecasting.models.naive import SeasonalNaive

__all__ = ["SeasonalNaive", "make_model", "MODEL_NAMES"]

MODEL_NAMES = ("naive-24", "naive-168", "lgbm", "mix", "ensemble")


TINY = {"n_estimators": 60}


def make_model(name: str, target: str = "carbon_intensity", tiny: bool = False, **kwargs):
    """A fresh, unfitted model of this package by name (see MODEL_NAMES).

    `tiny=True` shrinks the boosted models (60 trees) and the ensemble's windows, for tests and demos."""
    if name in ("naive", "naive-24", "seasonal-naive-24"):
        kwargs.pop("horizon", None)
        return SeasonalNaive(period=24, **kwargs)
    if name in ("naive-168", "seasonal-naive-168"):
        kwargs.pop("horizon", None)
        return SeasonalNaive(period=168, **kwargs)
    if name == "lgbm":
        from forecasting.models.lgbm import LGBMForecaster

        return LGBMForecaster(**({**TINY, **kwargs} if tiny else kwargs))
    if name == "mix":
        from forecasting.models.mix import MixCompositeForecaster

        return MixCompositeForecaster(**({**TINY, **kwargs} if tiny else kwargs))
    if name == "ensemble":
        from forecasting.models.ensemble import default_ensemble

        return default_ensemble(target, tiny=tiny, **kwargs)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
