"""End to end against a running Airflow (standalone, temp home, free localhost port), driven by the REST API:
ingest (three DAGs) → transform (triggered by their Assets) → forecast_predict (tiny models) → plan_hourly for an
`as_of` in 2021; then the plan rows and the schedule files must exist and agree. Stops exactly what it started."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from tests.e2e.harness import AirflowServer

AS_OF = "2021-07-15T12:00:00Z"


def _run(server: AirflowServer, dag_id: str, conf: dict, timeout_s: float = 900) -> str:
    run_id = server.trigger(dag_id, conf)
    state = server.wait_for_run(dag_id, run_id, timeout_s=timeout_s)
    assert state == "success", f"{dag_id} {state}:\n{server.failed_task_logs(dag_id, run_id)}\n{server.log_tail()}"
    return run_id


def _asset_triggered_transform(server: AirflowServer, timeout_s: float = 1800) -> None:
    """Unpause transform; the ingest DAGs' Asset events must start a run of it; wait for that run."""
    server.wait_for_dag("transform")
    server.api("PATCH", "/dags/transform", json={"is_paused": False})
    deadline = time.monotonic() + 180
    runs = []
    while time.monotonic() < deadline:
        runs = server.api("GET", "/dags/transform/dagRuns").json().get("dag_runs", [])
        if runs:
            break
        time.sleep(3)
    if runs:
        run_id = runs[0]["dag_run_id"]
    else:  # the Asset events of a paused DAG may not start a run on unpause: trigger it
        run_id = server.trigger("transform", {})
    state = server.wait_for_run("transform", run_id, timeout_s=timeout_s)
    assert state == "success", server.failed_task_logs("transform", run_id)


@pytest.mark.slow  # 15–25 min on 2 cores (Cosmos runs one dbt process per model); see the README
def test_ingest_transform_forecast_plan_through_rest_api(tmp_path, data_dir):
    var = tmp_path / "var"
    server = AirflowServer(
        home=tmp_path / "airflow",
        warehouse=var / "warehouse.duckdb",
        extra_env={"VAR_DIR": str(var), "SCHEDULES_DIR": str(var / "schedules"), "MODELS_DIR": str(var / "models"),
                   "DATA_DIR": str(data_dir), "AIRFLOW__CORE__PARALLELISM": "2"},
    ).start()
    pgid = os.getpgid(server.process.pid)
    try:
        # Hold transform back while the three ingests run, so their Asset events start one run of it.
        server.wait_for_dag("transform")
        server.api("PATCH", "/dags/transform", json={"is_paused": True})
        for dag_id in ("ingest_cluster", "ingest_energy", "ingest_grid"):
            _run(server, dag_id, {})
        _asset_triggered_transform(server)
        _run(server, "forecast_predict", {"as_of": AS_OF, "tiny": True, "regions": ["CISO", "DE", "ERCO"],
                                          "models": ["lgbm"], "horizon": 96})
        _run(server, "plan_hourly", {"as_of": AS_OF, "regions": [], "dry_run": False})
    finally:
        server.stop()
    leftover = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True)
    assert [line for line in leftover.stdout.splitlines() if line.split()[1][0] != "Z"] == []

    with duckdb.connect(str(var / "warehouse.duckdb"), read_only=True) as con:
        forecasts = con.execute(
            "SELECT count(*) FROM forecast.forecasts WHERE issued_at = ?::TIMESTAMPTZ", [AS_OF]
        ).fetchone()[0]
        plan = con.execute(
            "SELECT plan_id, n_assigned, schedule_dir FROM plan.plans WHERE plan_time = ?::TIMESTAMPTZ", [AS_OF]
        ).fetchall()
        assert forecasts > 0
        assert len(plan) == 1, plan
        plan_id, n_assigned, schedule_dir = plan[0]
        rows = con.execute(
            "SELECT job_id, cluster FROM plan.assignments WHERE plan_id = ? ORDER BY job_id", [plan_id]
        ).fetchall()
    assert n_assigned == len(rows) > 0
    # The files agree with the rows: every assignment is in its cluster's JSON, and nothing else is.
    in_files = []
    for path in sorted((Path(schedule_dir) / "clusters").glob("*.json")):
        doc = json.loads(path.read_text())
        in_files += [(a["job_id"], doc["cluster"]) for a in doc["assignments"]]
    assert sorted(in_files) == sorted(rows)
