"""forecasting.tasks.validate: the issue time is the `as_of` Param, else the run's data interval end; a run with
neither (triggered without a logical date, e.g. with TIME_SCHEDULES=off) fails at once naming `as_of`."""

from __future__ import annotations

import pytest

from forecasting.tasks import validate


def test_as_of_param_wins_over_the_interval_end():
    out = validate({"regions": ["DE"], "as_of": "2021-07-15T12:00Z"}, "2021-07-16T00:00Z")
    assert out["as_of"] == "2021-07-15T12:00:00+00:00" and out["horizon"] == 96


def test_interval_end_when_as_of_is_empty():
    assert validate({"regions": ["DE"], "as_of": ""}, "2021-07-16T00:00Z")["as_of"] == "2021-07-16T00:00:00+00:00"


def test_no_as_of_and_no_interval_names_as_of():
    with pytest.raises(ValueError, match="as_of is empty"):
        validate({"regions": ["DE"], "as_of": ""}, None)
