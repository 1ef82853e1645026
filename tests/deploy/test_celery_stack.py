"""The scale-out stack running the pipeline (slow, `make test-all`): Airflow with the CeleryExecutor, its metadata
database on a throwaway PostgreSQL, Redis as the broker and two Celery workers runs ingest (three DAGs, two of them at
once) -> transform (started by ingest_grid's Asset event) -> forecast_predict (tiny models) and submit_jobs (what
planning needs) -> plan_hourly, through the REST API. Afterwards the plan is in the warehouse, both workers ran
tasks, and nothing the stack started is left.

The warehouse is DuckLake: its catalog in a database of the same PostgreSQL, its data files in a local folder (the
two workers share this machine's file system, as they would share object storage), written by every task.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from tests.deploy.celery_stack import WORKERS, CeleryStack
from tests.deploy.pg import lake_on, throwaway_redis
from tests.e2e.test_pipeline_e2e import AS_OF, JOBS_FILE, _asset_triggered_run, _ok, _run
from warehouse import db

pytestmark = pytest.mark.slow


def test_celery_workers_run_ingest_transform_plan(postgres, extension_directory, tmp_path, data_dir, monkeypatch):
    var = tmp_path / "var"
    warehouse = var / "warehouse.duckdb"  # never created: the tasks write the lake
    lake = lake_on(postgres, "ducklake_stack", tmp_path / "lake", extension_directory)
    for key, value in lake.items():
        monkeypatch.setenv(key, value)
    db.init_catalog()  # once, before parallel writers (docs/scale-out.md)
    hosts: Counter = Counter()
    timings = {}
    t0 = time.monotonic()
    with throwaway_redis() as redis:
        stack = CeleryStack(
            home=tmp_path / "airflow",
            warehouse=warehouse,
            postgres_port=postgres["port"],
            postgres_password=postgres["password"],
            broker_url=redis["url"],
            extra_env={
                "VAR_DIR": str(var),
                "SCHEDULES_DIR": str(var / "schedules"),
                "MODELS_DIR": str(var / "models"),
                "DATA_DIR": str(data_dir),
                "AIRFLOW__CORE__PARALLELISM": "2",
                "LIVE_GRID_REGIONS": "",
                **lake,
            },
        ).start()
        timings["start"] = time.monotonic() - t0
        try:
            t = time.monotonic()
            both = {dag_id: stack.trigger(dag_id) for dag_id in ("ingest_cluster", "ingest_energy")}
            for dag_id, run_id in both.items():
                _ok(stack, dag_id, run_id)
                hosts.update(stack.task_hosts(dag_id, run_id).values())
            timings["ingest_cluster+energy"] = time.monotonic() - t

            t = time.monotonic()
            stack.wait_for_dag("transform")
            stack.pause("transform", False)
            run_id = _run(stack, "ingest_grid", {})
            hosts.update(stack.task_hosts("ingest_grid", run_id).values())
            run_id = _asset_triggered_run(stack, "transform")
            _ok(stack, "transform", run_id, timeout_s=900)
            hosts.update(stack.task_hosts("transform", run_id).values())
            timings["ingest_grid+transform"] = time.monotonic() - t

            t = time.monotonic()
            for dag_id, conf in (
                (
                    "forecast_predict",
                    {
                        "as_of": AS_OF,
                        "tiny": True,
                        "regions": ["CISO", "DE", "ERCO"],
                        "models": ["lgbm"],
                        "horizon": 96,
                    },
                ),
                ("submit_jobs", {"file": str(JOBS_FILE), "as_of": AS_OF}),
                ("plan_hourly", {"as_of": AS_OF, "regions": [], "dry_run": False}),
            ):
                run_id = _run(stack, dag_id, conf)
                hosts.update(stack.task_hosts(dag_id, run_id).values())
            timings["forecast+submit+plan"] = time.monotonic() - t
        finally:
            stack.stop()
            timings["total"] = time.monotonic() - t0
            print("celery stack timings (s):", json.dumps({k: round(v) for k, v in timings.items()}))
            print("tasks per worker:", dict(hosts))
        assert stack.leftovers() == []

    ran_on = {h for h in hosts if h}
    assert ran_on <= set(WORKERS), hosts  # every task ran on a Celery worker
    assert ran_on == set(WORKERS), f"one worker ran every task: {hosts}"
    assert not warehouse.exists()
    with db.reader() as con:
        plans = con.execute(
            "SELECT plan_id, n_assigned FROM plan.plans WHERE plan_time = ?::TIMESTAMPTZ", [AS_OF]
        ).fetchall()
        marts = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'marts'").fetchone()
    assert len(plans) == 1 and plans[0][1] > 0, plans
    assert marts[0] > 0
