"""The forecaster factory: every model by name, and a clear error for an unknown one."""
from __future__ import annotations

import pytest

from forecasting.models import registry


def test_unknown_model_is_unavailable():
    with pytest.raises(registry.ModelUnavailable):
        registry.make_model("no-such-model")
