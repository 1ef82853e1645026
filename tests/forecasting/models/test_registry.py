"""The forecaster factory: every model by name, and a clear error for an unknown one."""

from __future__ import annotations

import pytest

from forecasting.models import registry


def test_unknown_model_is_unavailable():
    with pytest.raises(registry.ModelUnavailable):
        registry.make_model("no-such-model")


def test_every_name_builds_an_unfitted_forecaster():
    from forecasting.base import Forecaster

    for name in registry.MODEL_NAMES:
        model = registry.make_model(name, "carbon_intensity", tiny=True, horizon=48)
        assert isinstance(model, Forecaster), name
    assert registry.make_model("seasonal-naive-168").period == 168
    assert registry.make_model("lgbm", tiny=True).n_estimators == registry.TINY["n_estimators"]
    assert registry.make_model("ensemble", "wind").name == "ensemble"  # the operator blend over the ensemble
    assert not registry.applicable("mix", "wind") and registry.applicable("mix", "carbon_intensity")
