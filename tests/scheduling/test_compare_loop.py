"""compare-loop on a small day: the loop (replay executor, exact run times) and the simulator value the same jobs
against the same run-now counterfactual, and the user's warehouse is left as it was."""

from __future__ import annotations

import hashlib

import pytest

from scheduling.cli.compare_loop import compare_loop
from transforms.runner import build
from warehouse.ingest import ingest

DAY = "2021-07-15"


@pytest.mark.slow
def test_loop_and_simulator_value_the_same_jobs_alike(tmp_path, data_dir):
    db = tmp_path / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
    build(select="+grid_hourly", warehouse_path=db, target_path=tmp_path / "target")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    doc = compare_loop(DAY, 12, db=db, data_dir=data_dir)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert doc["forecasts"] == "naive" and doc["jobs_not_ended"] == 0
    loop, sim = doc["loop"], doc["simulator"]
    assert loop["finished"] == sim["jobs"] == doc["jobs_submitted"] and loop["failed"] == 0
    # the same jobs, speeds, power and actual intensity: the counterfactual agrees to rounding
    assert loop["run_now_kgco2e"] == pytest.approx(sim["run_now_kgco2e"], rel=1e-3)
    assert doc["saving_gap_pp"] == pytest.approx(loop["saving_pct"] - sim["saving_pct"], abs=0.01)
    assert loop["deadlines_met_pct"] == 100.0
