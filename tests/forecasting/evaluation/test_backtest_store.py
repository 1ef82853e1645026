"""`python -m forecasting backtest --store`: the issued forecasts land in forecast.forecasts (every horizon,
labelled), and the planner's warehouse provider replays the latest issue at or before each planning hour."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd


def test_backtest_store_writes_every_issue_and_the_planner_reads_them(grid_dir, tmp_warehouse, capsys):
    from forecasting.cli import main
    from forecasting.store import read_forecasts

    rc = main(
        [
            "backtest",
            "--region",
            "SE",
            "--model",
            "naive-24",
            "--start",
            "2021-07-01",
            "--end",
            "2021-07-03",
            "--horizon",
            "48",
            "--source",
            "files",
            "--no-plot",
            "--json",
            "--store",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stored"] == {"model": "naive-24", "model_version": "backtest-2021-07-01", "rows": 3 * 48}
    rows = read_forecasts(model="naive-24", target="carbon_intensity", regions=["SE"])
    assert len(rows) == 3 * 48  # all horizons, also those past --end (not only the scored ones)
    assert set(rows["model_version"]) == {"backtest-2021-07-01"} and not rows["is_fallback"].any()
    assert rows["target_time"].max() == pd.Timestamp("2021-07-04 23:00", tz="UTC")

    from scheduling.planning.forecasts import GridSeries, make_forecasts

    grid = GridSeries.load(["SE"], "2021-07-01", "2021-07-06", source="files", data_dir=grid_dir.parent)
    prov = make_forecasts("auto", grid, ["SE"], start="2021-07-01", end="2021-07-06")
    assert prov.name == "warehouse" and prov.model == "naive-24"
    F, version, meta = prov.at("2021-07-02 05:00", 24)
    issued = rows[rows["issued_at"] == pd.Timestamp("2021-07-02", tz="UTC")].set_index("target_time")["p50"]
    want = issued.loc[pd.date_range("2021-07-02 05:00", periods=24, freq="h", tz="UTC")].to_numpy()
    assert np.allclose(F[:, 0], want) and meta["fallback_share"] == 0.0
    assert "backtest-2021-07-01@2021-07-02T00:00:00+00:00" in version
