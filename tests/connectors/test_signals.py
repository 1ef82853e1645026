"""Live rows through dbt: WattTime's marginal values never reach the average-signal columns (the training target)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.connectors.conftest import END, START
from warehouse.connectors.ingest import ingest_live
from warehouse.db import reader


def test_marginal_rows_stay_out_of_the_average_target(api, config, client, keys, tmp_warehouse, tmp_path):
    from forecasting.base import target_column
    from transforms.runner import build

    ingest_live(["CISO"], START, END, config=config, client=client)
    build(select="+int_grid__ci_selected", warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    with reader(tmp_warehouse) as con:
        raw = con.execute(
            "SELECT hour_utc, data_source, signal_type, scope, carbon_intensity_gco2_per_kwh AS ci "
            "FROM raw.grid_carbon_intensity WHERE region = 'CISO'"
        ).df()
        chosen = con.execute(
            "SELECT * FROM intermediate.int_grid__ci_selected WHERE region = 'CISO' ORDER BY hour_utc"
        ).df()
    assert set(zip(raw["data_source"], raw["signal_type"])) == {("eia930", "average"), ("watttime", "marginal")}
    assert len(chosen) == 6
    # the target (carbon_intensity -> the direct column) holds EIA-930's average values only
    assert target_column("carbon_intensity") == "carbon_intensity_direct_gco2_per_kwh"
    assert set(chosen["direct_data_source"]) == {"eia930"} and set(chosen["direct_signal_type"]) == {"average"}
    eia = raw[(raw["data_source"] == "eia930") & (raw["scope"] == "direct")].set_index("hour_utc")["ci"]
    moer = raw[raw["data_source"] == "watttime"].set_index("hour_utc")["ci"]
    hours = pd.to_datetime(chosen["hour_utc"], utc=True)
    assert chosen["carbon_intensity_direct_gco2_per_kwh"].to_numpy() == pytest.approx(eia.loc[hours].to_numpy())
    # the marginal values have their own column, never a fallback for a missing average
    assert set(chosen["marginal_data_source"]) == {"watttime"}
    assert chosen["carbon_intensity_marginal_gco2_per_kwh"].to_numpy() == pytest.approx(moer.loc[hours].to_numpy())
    assert chosen["lifecycle_data_source"].eq("eia930").all()
