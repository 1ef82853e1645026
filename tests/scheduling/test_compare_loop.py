"""compare-loop on a small day: the loop (replay executor, exact run times) and the simulator value the same jobs
against the same run-now counterfactual and value the same decisions alike, and the user's warehouse is left as it
was."""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import pandas as pd
import pytest

from common.timeutil import utc
from scheduling.cli.compare_loop import compare_loop
from scheduling.evaluation.scenario import scenario_for_jobs
from scheduling.evaluation.simulator import execute
from scheduling.planning.problem import abs_hours
from scheduling.queue.trace import trace_frame
from scheduling.service import plan_fleet, plan_speed_model
from transforms.runner import build
from warehouse.ingest import ingest

DAY = "2021-07-15"
N_JOBS = 12


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_dir) -> dict:
    """compare-loop on a warehouse with the grid marts only (no forecasts: both plan on the seasonal naive), its
    working copy kept: {doc, db, before (the warehouse's hash before the run), kept (the copy)}."""
    root = tmp_path_factory.mktemp("compare_loop")
    db = root / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
    build(select="+grid_hourly", warehouse_path=db, target_path=root / "target")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    doc = compare_loop(DAY, N_JOBS, db=db, data_dir=data_dir, keep=root / "kept")
    return {"doc": doc, "db": db, "before": before, "kept": root / "kept" / "warehouse.duckdb"}


@pytest.mark.slow
def test_loop_and_simulator_value_the_same_jobs_alike(compared):
    doc = compared["doc"]
    assert hashlib.sha256(compared["db"].read_bytes()).hexdigest() == compared["before"]
    assert doc["forecasts"] == "naive" and doc["jobs_not_ended"] == 0
    loop, sim = doc["loop"], doc["simulator"]
    assert loop["finished"] == sim["jobs"] == doc["jobs_submitted"] and loop["failed"] == 0
    # the same jobs, speeds, power and actual intensity: the counterfactual agrees to rounding
    assert loop["run_now_kgco2e"] == pytest.approx(sim["run_now_kgco2e"], rel=1e-3)
    assert doc["saving_gap_pp"] == pytest.approx(loop["saving_pct"] - sim["saving_pct"], abs=0.01)
    assert loop["deadlines_met_pct"] == 100.0


@pytest.mark.slow
def test_the_ledger_values_the_loops_runs_as_the_simulator_would(compared, data_dir):
    """Each finished run's realized carbon in the ledger is what the simulator's `execute` gives the same decision
    (cluster, power option, start hour, run time): the run at the cluster's intensity, a move's data transfer at the
    mean of its home and the cluster's intensity in the start hour. The day's loop moves jobs out of their home
    region, so the transfer is part of the check."""
    kept = compared["kept"]
    with duckdb.connect(str(kept), read_only=True) as con:
        runs = con.execute(
            "SELECT r.planner_job_id, r.cluster, r.power_limit_w, r.started_at, r.actual_runtime_h, "
            "r.realized_kgco2e, a.transfer_kwh, r.power_changes FROM marts.job_runs AS r JOIN plan.assignments AS a "
            "ON a.plan_id = r.plan_id AND a.job_id = r.planner_job_id WHERE r.outcome = 'finished'"
        ).df()
    # compare-loop keeps every run at the limit it starts with, as `execute` does
    assert len(runs) == N_JOBS and (runs["power_changes"] == 0).all() and (runs["transfer_kwh"] > 0).any()
    fleet = plan_fleet(None, data_dir)
    jobs = trace_frame(DAY, N_JOBS, fleet, data_dir=data_dir)
    speeds, _ = plan_speed_model(jobs[["job_type"]], utc(DAY), db_path=kept, data_dir=data_dir, fleet=fleet)
    sc = scenario_for_jobs(jobs, fleet, DAY, 24, forecasts="naive", speed_model=speeds, db_path=kept, data_dir=data_dir)
    tbl = sc.table
    row = {f"demo/{utc(DAY):%Y%m%d}-{j}": i for i, j in enumerate(jobs["job_id"])}
    j = runs["planner_job_id"].map(row).to_numpy()
    c = runs["cluster"].map({name: i for i, name in enumerate(fleet.names)}).to_numpy()
    k = np.nanargmin(np.abs(tbl.limit_w[:, c] - runs["power_limit_w"].to_numpy()[None, :]), axis=0)
    n = tbl.n
    start_h, kk, cc, run_h = np.full(n, -1), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n)
    start_h[j] = abs_hours(pd.to_datetime(runs["started_at"], utc=True))
    kk[j], cc[j] = k, c
    run_h[j] = runs["actual_runtime_h"].to_numpy()
    simulated = execute(sc, start_h, kk, cc, run_h)["kg"][j]
    # (rtol: the intake rounds input_gb to the megabyte, the trace frame does not)
    np.testing.assert_allclose(runs["realized_kgco2e"].to_numpy(), simulated, rtol=1e-4, atol=1e-9)
