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


def _last_run(env: dict, dag_id: str) -> tuple[dict, list[tuple[str, str]]]:
    """Task states and Asset events (uri, emitting task) of the DAG's last run in the test's metadata DB."""
    db = sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")
    try:
        run_id = db.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", [dag_id]
        ).fetchone()[0]
        states = dict(
            db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", [dag_id, run_id]
            ).fetchall()
        )
        events = sorted(
            db.execute(
                "SELECT a.uri, e.source_task_id FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "WHERE e.source_dag_id = ? AND e.source_run_id = ?",
                [dag_id, run_id],
            ).fetchall()
        )
    finally:
        db.close()
    return states, events


def test_a_group_with_nothing_to_load_skips_and_emits_no_asset_event(airflow_home, data_dir):
    """A load task that would load nothing skips, and no event is emitted for its group: an event would start a
    transform run for data that did not change."""
    out = _dags_test(airflow_home, "ingest_energy", {"sources": ["zeus_power_sweep"]})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    states, events = _last_run(airflow_home, "ingest_energy")
    assert states == {
        "validate_params": "success",
        "load_energy": "success",
        "load_interference": "skipped",
        "publish_assets": "success",
    }
    assert events == [("warehouse://raw/energy", "publish_assets")]


def test_all_asset_events_of_an_ingest_run_come_from_one_task(airflow_home, data_dir):
    """Both groups loaded: both events are emitted by the one publish task, at once, so the transform DAG (scheduled
    on either Asset) starts one run for the ingest run, not one per load task."""
    out = _dags_test(airflow_home, "ingest_energy", {"sources": ["zeus_power_sweep", "gavel"]})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    states, events = _last_run(airflow_home, "ingest_energy")
    assert states["load_energy"] == states["load_interference"] == "success"
    assert events == [("warehouse://raw/energy", "publish_assets"), ("warehouse://raw/interference", "publish_assets")]
