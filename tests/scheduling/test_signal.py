"""The fleet file's `signal`: the hourly plan minimises the average (default) or WattTime's marginal intensity."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from scheduling.domain.fleet import fleet_from_spec
from scheduling.domain.fleet_file import DEFAULT_FLEET_PATH
from scheduling.planning.forecasts import GridSeries, make_forecasts
from scheduling.service import plan_forecasts

T = pd.Timestamp("2021-07-15T12:00Z")
EXAMPLE = "docs/examples/fleet.yaml"


def _fleet(signal: str | None, regions=("us-west", "eu-central")):
    spec = yaml.safe_load(open(EXAMPLE))
    if signal is not None:
        spec["signal"] = signal
    return fleet_from_spec(spec, EXAMPLE, regions=list(regions))


def _mart(db, marginal_zones=("CISO",)):
    """marts.grid_hourly for CISO and DE over 10 days: average 200 + hour, marginal 600 + hour where present."""
    from forecasting.data import add_calendar
    from warehouse.db import writer

    hours = pd.date_range(T - pd.Timedelta(days=9), T + pd.Timedelta(days=1), freq="h", inclusive="left")
    rows = []
    for zone in ("CISO", "DE"):
        for i, hour in enumerate(hours):
            rows.append(
                {
                    "region": zone,
                    "hour_utc": hour,
                    "carbon_intensity_direct_gco2_per_kwh": 200.0 + i % 24,
                    "signal_type": "average",
                    "carbon_intensity_marginal_gco2_per_kwh": 600.0 + i % 24 if zone in marginal_zones else None,
                    "marginal_data_source": "watttime" if zone in marginal_zones else None,
                    "renewable_share": 0.3,
                }
            )
    frame = add_calendar(pd.DataFrame(rows))
    with writer(db) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS marts")
        con.register("f", frame)
        con.execute("CREATE OR REPLACE TABLE marts.grid_hourly AS SELECT * FROM f")


def _live_forecasts(db, issued: pd.Timestamp, value: float, zone="CISO", hours=24):
    from warehouse.db import writer

    frame = pd.DataFrame(
        {
            "region": zone,
            "issued_at": issued,
            "hour_utc": pd.date_range(issued.floor("h"), periods=hours, freq="h"),
            "signal_type": "marginal",
            "basis": "production",
            "scope": "direct",
            "data_source": "watttime",
            "carbon_intensity_gco2_per_kwh": value,
        }
    )
    with writer(db) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS staging")
        con.register("f", frame)
        con.execute("CREATE OR REPLACE TABLE staging.stg_grid__live_forecasts AS SELECT * FROM f")


def test_the_default_is_average_and_a_bad_value_is_named():
    assert _fleet(None).signal == "average"
    assert "signal: average" in DEFAULT_FLEET_PATH.read_text()
    assert _fleet("marginal").signal == "marginal"
    with pytest.raises(ValueError, match=r"signal: must be one of average, marginal, got 'moer'"):
        _fleet("moer")


def test_marginal_actuals_come_from_the_marginal_column(tmp_warehouse):
    _mart(tmp_warehouse)
    average = GridSeries.load(["CISO"], T, T + pd.Timedelta(hours=24), source="warehouse", db_path=tmp_warehouse)
    marginal = GridSeries.load(
        ["CISO"], T, T + pd.Timedelta(hours=24), source="warehouse", db_path=tmp_warehouse, signal="marginal"
    )
    assert average.signal == "average" and marginal.signal == "marginal"
    assert average.ci.min() >= 200 and average.ci.max() < 224
    assert marginal.ci.min() >= 600 and marginal.ci.max() < 624


def test_a_zone_without_marginal_data_is_an_error_not_the_average(tmp_warehouse):
    _mart(tmp_warehouse, marginal_zones=("CISO",))
    with pytest.raises(ValueError, match=r"signal marginal: no carbon_intensity_marginal_gco2_per_kwh for .*\['DE'\]"):
        plan_forecasts(_fleet("marginal"), T, 24, db_path=tmp_warehouse)


def test_the_grid_files_have_no_marginal_signal(data_dir):
    with pytest.raises(ValueError, match="the grid files hold average intensity only"):
        GridSeries.load(["CISO"], T, T + pd.Timedelta(hours=24), source="files", data_dir=data_dir, signal="marginal")


def test_marginal_plan_uses_the_live_forecast_then_the_naive(tmp_warehouse):
    _mart(tmp_warehouse, marginal_zones=("CISO", "DE"))
    fleet = _fleet("marginal")
    naive = plan_forecasts(fleet, T, 24, db_path=tmp_warehouse)  # no live forecast stored yet
    F, version, meta = naive.at(T, 24)
    assert naive.name == "naive" and F.min() >= 600 and meta["fallback_share"] == 1.0

    _live_forecasts(tmp_warehouse, T + pd.Timedelta(hours=1), 999.0)  # issued after T: never used
    _live_forecasts(tmp_warehouse, T - pd.Timedelta(hours=2), 450.0)
    provider = plan_forecasts(fleet, T, 24, db_path=tmp_warehouse)
    F, version, meta = provider.at(T, 24)
    assert provider.name == "live" and version.startswith("staging.stg_grid__live_forecasts:watttime:watttime@")
    ciso, de = fleet.zones.index("CISO"), fleet.zones.index("DE")
    assert np.allclose(F[:22, ciso], 450.0)  # the 24 h issued at 10:00 cover 12:00 .. 09:00 the next day
    assert F[22:, ciso].min() >= 600 and F[:, de].min() >= 600  # the rest: naive of the marginal actuals
    assert 0 < meta["fallback_share"] < 1


def test_average_plan_is_unchanged_and_never_reads_the_live_forecasts(tmp_warehouse):
    _mart(tmp_warehouse, marginal_zones=("CISO", "DE"))
    _live_forecasts(tmp_warehouse, T - pd.Timedelta(hours=2), 450.0)
    provider = plan_forecasts(_fleet(None), T, 24, db_path=tmp_warehouse)
    F, _, _ = provider.at(T, 24)
    assert provider.grid.signal == "average" and F.min() >= 200 and F.max() < 224
    with pytest.raises(ValueError, match="forecasts are of the marginal signal; this grid is average"):
        make_forecasts("live", provider.grid, provider.zones, start=T, db_path=tmp_warehouse)
