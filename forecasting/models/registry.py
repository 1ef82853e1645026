"""The forecasters by name, as configured: `make_model(name, target, tiny=False, **kwargs)`.

- `naive-24`, `naive-168`: seasonal naive (same hour on the last known day / week);
- `lgbm`: LightGBM with quantile objectives on lags, calendar and weather forecasts;
- `mix`: carbon intensity composed from per-source generation forecasts with the emission factors;
- `ensemble`: weights and P10–P90 calibration fitted on a validation window and re-fitted on the weeks before each
  issue; for solar and wind wrapped in the operator-forecast blend;
- `prophet`: Prophet per region with a residual correction;
- `tft`: one Temporal Fusion Transformer across regions.

`tiny=True` shrinks the models for tests and demos (fewer trees, shorter windows and history, a small TFT). Heavy
libraries (LightGBM, Prophet, torch) are imported only when a model is fitted or loaded, so building one is cheap.
"""

from __future__ import annotations

from collections.abc import Callable

from common.registry import Registry, UnknownNameError
from forecasting.base import Forecaster
from forecasting.models.blend import PublishedBlendForecaster
from forecasting.models.ensemble import EnsembleForecaster
from forecasting.models.lgbm import LGBMForecaster
from forecasting.models.mix import MixCompositeForecaster
from forecasting.models.naive import SeasonalNaive
from forecasting.models.prophet_model import ProphetForecaster
from forecasting.models.tft_model import TFTForecaster, TFTSettings

ALIASES = {"naive": "naive-24", "seasonal-naive-24": "naive-24", "seasonal-naive-168": "naive-168"}
CI_ONLY_MODELS = ("mix",)  # models that forecast carbon intensity only
TINY = {"n_estimators": 60}  # the boosted models' tiny setting


class ModelUnavailable(UnknownNameError):
    """A model name that `make_model` does not know."""


def applicable(model: str, target: str) -> bool:
    """The mix composite forecasts carbon intensity only; every other model forecasts every target."""
    return target == "carbon_intensity" or model not in CI_ONLY_MODELS


def _naive(period: int) -> Callable[..., Forecaster]:
    def build(target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
        kwargs.pop("horizon", None)
        return SeasonalNaive(period=period, **kwargs)

    return build


def _lgbm(target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
    return LGBMForecaster(**({**TINY, **kwargs} if tiny else kwargs))


def _mix(target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
    return MixCompositeForecaster(**({**TINY, **kwargs} if tiny else kwargs))


def _ensemble(target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
    """Carbon intensity: LightGBM + mix composite + seasonal naive, weights and calibration on the validation window,
    re-fitted at every issue on the previous `rolling_days`; solar, wind: the operator blend over the same kind of
    ensemble of LightGBM and seasonal naive."""
    horizon = kwargs.pop("horizon", 96)
    boost = TINY if tiny else {}
    windows = {"validation_days": 14, "rolling_days": 14} if tiny else {}
    windows.update({k: kwargs.pop(k) for k in ("validation_days", "rolling_days", "weighting", "refit") if k in kwargs})
    if target == "carbon_intensity":
        members = [
            LGBMForecaster(horizon=horizon, **boost),
            MixCompositeForecaster(horizon=horizon, **boost),
            SeasonalNaive(24),
        ]
        return EnsembleForecaster(members, horizon=horizon, **windows, **kwargs)
    members = [LGBMForecaster(horizon=horizon, **boost), SeasonalNaive(24)]
    inner = EnsembleForecaster(members, horizon=horizon, name="ensemble-base", **windows)
    return PublishedBlendForecaster(inner, name="ensemble", **kwargs)


def _prophet(target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
    horizon = kwargs.pop("horizon", None)
    if horizon and horizon > kwargs.get("max_horizon", 168):
        kwargs["max_horizon"] = int(horizon)
    if tiny:
        kwargs.setdefault("history_days", 120)
        kwargs.setdefault("max_horizon", 96)
    return ProphetForecaster(**kwargs)


def _tft(target: str = "carbon_intensity", tiny: bool = False, settings=None, **kwargs) -> Forecaster:
    horizon = kwargs.pop("horizon", None)
    if settings is None:
        settings = TFTSettings.tiny(**kwargs) if tiny else TFTSettings.full(**kwargs)
    if horizon and horizon > settings.max_prediction_length:
        settings.max_prediction_length = int(horizon)
    return TFTForecaster(settings)


FORECASTERS = Registry("forecaster")
FORECASTERS.register("naive-24", _naive(24))
FORECASTERS.register("naive-168", _naive(168))
FORECASTERS.register("lgbm", _lgbm)
FORECASTERS.register("mix", _mix)
FORECASTERS.register("ensemble", _ensemble)
FORECASTERS.register("prophet", _prophet)
FORECASTERS.register("tft", _tft)
MODEL_NAMES = FORECASTERS.names


def make_model(name: str, target: str = "carbon_intensity", tiny: bool = False, **kwargs) -> Forecaster:
    """A fresh, unfitted forecaster by name (MODEL_NAMES, or an alias in ALIASES).

    `horizon` (hours) sizes the models that train per horizon; the naive ones ignore it. Raises ModelUnavailable
    (an UnknownNameError) for an unknown name."""
    name = ALIASES.get(name, name)
    if name not in FORECASTERS:
        raise ModelUnavailable(f"unknown forecaster {name!r}; known: {', '.join(MODEL_NAMES)}")
    return FORECASTERS.create(name, target=target, tiny=tiny, **kwargs)
