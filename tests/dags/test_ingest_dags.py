"""`airflow dags test` runs each ingest DAG for real against the shared data into a temporary warehouse."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest


def _dags_test(env: dict, dag_id: str, conf: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id, "2021-07-01T00:00:00+00:00"]
    if conf is not None:
        cmd += ["-c", json.dumps(conf)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "dag_id, conf, table",
    [
        ("ingest_cluster", {"sources": ["openb_nodes", "pai_machine_specs"]}, "raw.openb_nodes"),
        ("ingest_energy", {"sources": ["zeus_power_sweep", "gavel"]}, "raw.zeus_power_sweep"),
        ("ingest_grid", {"sources": ["grid_dacf"]}, "raw.grid_published_forecasts"),
    ],
)
def test_airflow_dags_test_loads_rows(airflow_home, data_dir, dag_id, conf, table):
    out = _dags_test(airflow_home, dag_id, conf)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    with duckdb.connect(airflow_home["WAREHOUSE_PATH"], read_only=True) as con:
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] > 0


def test_bad_param_fails_before_any_work(airflow_home, data_dir):
    out = _dags_test(airflow_home, "ingest_cluster", {"sources": ["no_such_source"]})
    assert out.returncode != 0
    assert "no_such_source" in out.stdout + out.stderr


def test_a_group_with_nothing_to_load_skips_and_emits_no_asset_event(airflow_home, data_dir):
    """A load task that would load nothing skips: success would emit its Asset event and start a transform run
    for data that did not change."""
    out = _dags_test(airflow_home, "ingest_energy", {"sources": ["zeus_power_sweep"]})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    db = sqlite3.connect(Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db")
    try:
        run_id = db.execute("SELECT run_id FROM dag_run WHERE dag_id = 'ingest_energy' "
                            "ORDER BY id DESC LIMIT 1").fetchone()[0]
        states = dict(db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'ingest_energy' "
                                 "AND run_id = ?", [run_id]).fetchall())
        events = [uri for (uri,) in db.execute(
            "SELECT a.uri FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE e.source_dag_id = 'ingest_energy' AND e.source_run_id = ?", [run_id])]
    finally:
        db.close()
    assert states == {"validate_params": "success", "load_energy": "success", "load_interference": "skipped"}
    assert events == ["warehouse://raw/energy"]
