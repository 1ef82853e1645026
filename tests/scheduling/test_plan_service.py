"""plan_hourly end to end on the shared data (temporary warehouse and schedule root): the same planning time twice
gives identical files and plan.* rows, a dry run writes explanations only, later hours see the earlier plans
(dispatched jobs are no longer pending, running ones hold their GPUs), forecasts issued after the planning time
are never used, and bad settings fail before any work."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import numpy as np
import pandas as pd
import pytest

from scheduling import service as plan_service
from scheduling.output.plan_store import read_plan, table_digest
from scheduling.output.schedules import tree_digest, verify_schedule_dir
from scheduling.service import plan_hourly, validate_inputs
from scheduling.tasks import resolve_plan_run as resolve_run

T = "2021-07-15T12:00:00Z"


def _count(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchone()[0]


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "seconds"}


def test_same_planning_time_twice_is_identical(tmp_warehouse, tmp_path, data_dir):
    root = tmp_path / "schedules"
    first = plan_hourly(T, db_path=tmp_warehouse, schedule_root=root)
    assert first["plan_id"] == "rolling-lp@2021-07-15T12:00:00Z" and first["cold_start"] is True
    assert first["n_assigned"] >= 1 and first["schedule_dir"] == str(root / "2021-07-15T12-00Z")
    files, rows = tree_digest(first["schedule_dir"]), table_digest(tmp_warehouse)
    verify_schedule_dir(first["schedule_dir"])
    assert set(files) == set(first["files"])
    again = plan_hourly(T, db_path=tmp_warehouse, schedule_root=root)
    assert _strip(again) == _strip(first)
    assert tree_digest(again["schedule_dir"]) == files
    assert table_digest(tmp_warehouse) == rows
    plan = read_plan(first["plan_id"], db_path=tmp_warehouse)
    assert len(plan.assignments) == first["n_assigned"] and len(plan.explanations) == first["explanations"]
    assert plan.assignments["job_id"].str.startswith("20210715-job-").all()


def test_dry_run_writes_explanations_only(tmp_warehouse, tmp_path, data_dir):
    root = tmp_path / "schedules"
    out = plan_hourly(T, dry_run=True, db_path=tmp_warehouse, schedule_root=root)
    assert out["dry_run"] and out["schedule_dir"] is None and out["files"] == []
    assert out["tables"] == ["plan.explanations"]
    assert not root.exists() or not any(root.iterdir())
    assert _count(tmp_warehouse, "SELECT count(*) FROM plan.plans") == 0
    assert _count(tmp_warehouse, "SELECT count(*) FROM plan.assignments") == 0
    n = _count(tmp_warehouse, f"SELECT count(*) FROM plan.explanations WHERE plan_id = '{out['plan_id']}'")
    assert n == out["explanations"] >= 1


def test_next_hour_sees_the_previous_plan(tmp_warehouse, tmp_path, data_dir):
    root = tmp_path / "schedules"
    first = plan_hourly("2021-07-15T11:00Z", db_path=tmp_warehouse, schedule_root=root)
    second = plan_hourly(T, db_path=tmp_warehouse, schedule_root=root)
    assert second["cold_start"] is False
    p1 = read_plan(first["plan_id"], db_path=tmp_warehouse)
    p2 = read_plan(second["plan_id"], db_path=tmp_warehouse)
    started = p1.assignments[p1.assignments["start_time"] == p1.plan_time]
    assert len(started) >= 1
    assert not set(started["job_id"]) & set(p2.assignments["job_id"])  # dispatched jobs are not planned again
    still_running = (started["end_time"] > p2.plan_time).sum()
    assert second["n_running"] == still_running
    # the jobs dispatched an hour ago are history for the next plan (rolling-lp forecasts demand from recent
    # arrivals), not pending jobs
    assert first["n_arrived_dispatched"] == 0 and second["n_arrived_dispatched"] == len(started)
    tentative = set(p1.assignments["job_id"]) - set(started["job_id"])
    assert tentative <= set(p2.assignments["job_id"]) | set(p2.unplaced["job_id"])  # re-planned
    assert sorted(p.name for p in root.iterdir()) == [".lock", "2021-07-15T11-00Z", "2021-07-15T12-00Z"]


def test_only_forecasts_issued_by_the_planning_time_are_used(tmp_warehouse, tmp_path, data_dir):
    from forecasting.store import write_forecasts

    def rows(issued, value):
        hours = pd.date_range(pd.Timestamp(issued), periods=72, freq="h")
        return pd.DataFrame(
            [
                {
                    "issued_at": issued,
                    "target_time": h,
                    "region": z,
                    "target": "carbon_intensity",
                    "p10": value - 10,
                    "p50": value,
                    "p90": value + 10,
                    "model": "lgbm",
                    "model_version": "v-test",
                }
                for z in ("CISO", "DE")
                for h in hours
            ]
        )

    write_forecasts(rows("2021-07-15T13:00Z", 999.0), db_path=tmp_warehouse)  # issued after T: never used
    late = plan_hourly(T, dry_run=True, db_path=tmp_warehouse, schedule_root=tmp_path / "s")
    assert late["forecast_source"] == "warehouse" and "@none" in late["forecast_version"]
    write_forecasts(rows("2021-07-15T11:00Z", 50.0), db_path=tmp_warehouse)
    used = plan_hourly(T, dry_run=True, db_path=tmp_warehouse, schedule_root=tmp_path / "s")
    assert "forecast.forecasts:lgbm:v-test@2021-07-15T11:00:00" in used["forecast_version"]


def test_pending_set_is_deterministic_per_as_of(data_dir):
    from scheduling.domain.fleet import load_fleet

    fleet = load_fleet()
    a = plan_service.job_stream("2021-07-14T20:00Z", T, fleet)
    b = plan_service.job_stream("2021-07-14T20:00Z", T, fleet)
    pd.testing.assert_frame_equal(a, b)
    assert a["submit_time"].between(pd.Timestamp("2021-07-14T20:00Z"), pd.Timestamp(T)).all()
    assert {j[:8] for j in a["job_id"]} == {"20210714", "20210715"}
    day = plan_service.daily_jobs("2021-07-15", fleet)
    assert len(day) <= plan_service.jobs_per_day() and day["job_id"].is_unique


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"as_of": "not-a-time"}, "'not-a-time'"),
        ({"as_of": ""}, "as_of is required"),
        ({"policy": "fastest"}, "'fastest'"),
        ({"horizon_hours": 500}, "500"),
        ({"horizon_hours": "48"}, "'48'"),
        ({"regions": ["atlantis"]}, "atlantis"),
    ],
)
def test_bad_settings_fail_before_any_work(kwargs, needle):
    args = {"as_of": T, "policy": "priority", "regions": None, "horizon_hours": 168, **kwargs}
    with pytest.raises(ValueError) as err:
        validate_inputs(**args)
    assert needle in str(err.value)


def test_resolve_run_takes_the_planning_time_from_the_run():
    params = {"as_of": "", "policy": "greedy-carbon", "regions": [], "horizon_hours": 48, "dry_run": True}
    out = resolve_run(params, data_interval_end=pd.Timestamp("2021-07-15T13:00Z"))
    assert out == {
        "as_of": "2021-07-15T13:00:00Z",
        "policy": "greedy-carbon",
        "regions": [],
        "horizon_hours": 48,
        "dry_run": True,
    }
    assert resolve_run({**params, "as_of": "2021-07-15T09:30+00:00"})["as_of"] == "2021-07-15T09:00:00Z"
    with pytest.raises(ValueError, match="no planning time"):
        resolve_run(params)
    with pytest.raises(ValueError, match="dry_run"):
        resolve_run({**params, "dry_run": "yes"}, data_interval_end=pd.Timestamp(T))


def test_cli_rejects_a_bad_policy_with_exit_code_2():
    out = subprocess.run(
        [sys.executable, "-m", "scheduling", "plan-hourly", "--as-of", T, "--policy", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "'nope'" in out.stderr and out.stdout == ""


@pytest.mark.slow
def test_cli_json_run(tmp_warehouse, tmp_path, data_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduling",
            "plan-hourly",
            "--as-of",
            T,
            "--json",
            "--schedule-root",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["plan_id"] == "rolling-lp@2021-07-15T12:00:00Z" and doc["n_assigned"] >= 1
    assert np.isfinite(doc["expected_kgco2e"])
