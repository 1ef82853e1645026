"""The operate stage's parts that need no trained forecasters: which forecaster the loop issues, and the simulator
run of the loop's jobs (real grid files, an empty temporary warehouse, so the seasonal naive plans)."""

from __future__ import annotations

import pytest

from pipeline.operate import planning_forecast_models
from scheduling.evaluation.same_jobs import simulate_same_jobs
from scheduling.queue.trace import trace_jobs
from scheduling.service import plan_fleet

DAY = "2021-07-15"


def test_the_loop_issues_only_the_forecaster_the_plans_read():
    assert planning_forecast_models(["naive-24", "lgbm", "mix", "ensemble", "tft"]) == ["ensemble"]
    assert planning_forecast_models(["prophet", "lgbm"]) == ["lgbm"]
    assert planning_forecast_models(["arima"]) is None and planning_forecast_models([]) is None


def test_the_simulator_runs_the_loops_jobs_against_the_same_run_now(tmp_warehouse, data_dir):
    fleet = plan_fleet(None, data_dir)
    ids = [j["job_id"] for j in trace_jobs(DAY, 30, fleet, data_dir=data_dir)]
    rows = simulate_same_jobs(DAY, 30, fleet, ["rolling-lp", "performance-first"])
    assert [r["policy"] for r in rows] == ["rolling-lp", "performance-first"]
    assert {r["jobs"] for r in rows} == {len(ids)} and len({r["run_now_kgco2e"] for r in rows}) == 1
    carbon_aware, baseline = rows
    assert carbon_aware["kgco2e"] < baseline["kgco2e"]
    assert carbon_aware["saving_pct"] == pytest.approx(
        100 * (1 - carbon_aware["kgco2e"] / carbon_aware["run_now_kgco2e"]), abs=0.01
    )
    # summed over a subset: the jobs the ledger would count
    some = simulate_same_jobs(DAY, 30, fleet, ["rolling-lp"], job_ids=ids[:10])
    assert some[0]["jobs"] == 10 and some[0]["run_now_kgco2e"] < carbon_aware["run_now_kgco2e"]
