"""submit_jobs: it parses and is wired as documented (typed Params for one job, enums from the fleet and the spec,
the submit task in the `warehouse` pool after validate_params), `airflow dags test` puts the form's job and a job
file into queue.jobs, and a bad value fails validate_params naming it before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.dags.conftest import DAGS, REPO_ROOT, airflow_env

_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags.get("submit_jobs")
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}}
if dag is not None:
    out["params"] = {k: dag.params.get_param(k).schema for k in dag.params}
    out["defaults"] = {k: dag.params[k] for k in dag.params}
    out["descriptions"] = {k: dag.params.get_param(k).description for k in dag.params}
    out["tasks"] = {t.task_id: {"pool": t.pool, "upstream": sorted(t.upstream_task_ids),
                                "outlets": sorted(a.uri for a in t.outlets)} for t in dag.tasks}
    out["schedule"] = repr(dag.timetable)
print(json.dumps(out))
"""
JOB = {
    "tenant": "ml",
    "job_id": "form-1",
    "gpus": 2,
    "cpu_milli": 8000,
    "memory_mib": 32768,
    "job_type": "ResNet-50 (batch size 64)",
    "est_duration_h": 3.5,
    "flexibility": 0.5,
    "home_region": "eu-north",
    "allowed_regions": ["eu-north", "eu-central"],
    "image": "registry.example/train:latest",
    "command": ["python", "train.py"],
}


@pytest.fixture(scope="module")
def bag(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("submit_dagbag")
    env = airflow_env(tmp / "home", tmp / "wh.duckdb")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_submit_jobs_is_wired_with_typed_params(bag):
    from scheduling.queue.spec import USER_FIELDS, WORKLOAD_CLASSES

    assert bag["errors"] == {}
    assert "None" in bag["schedule"] or "NullTimetable" in bag["schedule"]
    tasks = bag["tasks"]
    assert tasks["submit"]["pool"] == "warehouse" and tasks["submit"]["upstream"] == ["validate_params"]
    assert [u.rstrip("/") for u in tasks["submit"]["outlets"]] == ["warehouse://queue"]
    params = bag["params"]
    assert set(params) == set(USER_FIELDS) | {"file", "as_of", "replace"}
    assert all(bag["descriptions"][k] for k in params)
    assert params["gpus"]["type"] == "integer" and params["gpus"]["minimum"] == 1
    assert (params["gpu_milli"]["minimum"], params["gpu_milli"]["maximum"]) == (1, 1000)
    assert params["workload_class"]["enum"] == ["", *WORKLOAD_CLASSES]
    fleet = yaml.safe_load((REPO_ROOT / "scheduling" / "domain" / "fleet.yaml").read_text())
    assert params["home_region"]["enum"] == ["", *fleet["regions"]]
    assert params["allowed_regions"]["items"]["enum"] == list(fleet["regions"])
    assert set(params["gpu_models"]["items"]["enum"]) == {c["gpu_model"] for c in fleet["clusters"]}
    assert params["est_duration_h"]["type"] == ["null", "number"] and params["command"]["type"] == "array"


def _dags_test(env: dict, conf: dict):
    cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", "submit_jobs", "2021-07-15T12:00:00+00:00"]
    return subprocess.run(cmd + ["-c", json.dumps(conf)], env=env, capture_output=True, text=True, timeout=600)


def _rows(db: Path) -> list[tuple]:
    if not db.exists():
        return []
    with duckdb.connect(str(db), read_only=True) as con:
        if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'queue'").fetchone()[0]:
            return []
        return con.execute(
            "SELECT tenant, job_id, state, created_from, submitted_at FROM queue.jobs ORDER BY 1, 2"
        ).fetchall()


def test_the_form_submits_one_job(airflow_home, data_dir, tmp_path):
    env = {**airflow_home, "WAREHOUSE_PATH": str(tmp_path / "wh.duckdb")}
    out = _dags_test(env, JOB)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    (row,) = _rows(tmp_path / "wh.duckdb")
    assert row[:4] == ("ml", "form-1", "queued", "airflow:submit_jobs")
    assert row[4].isoformat().startswith("2021-07-15T12:00")  # the run's logical date, not the wall clock


def test_a_bad_value_fails_validate_params_naming_it(airflow_home, data_dir, tmp_path):
    env = {**airflow_home, "WAREHOUSE_PATH": str(tmp_path / "wh.duckdb")}
    out = _dags_test(env, {**JOB, "gpus": 16})  # within the Param's bounds, more than any node has
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "field 'gpus'" in log and "16" in log and "more GPUs than any node" in log
    assert _rows(tmp_path / "wh.duckdb") == []


def test_a_job_file_is_submitted(airflow_home, data_dir, tmp_path):
    env = {**airflow_home, "WAREHOUSE_PATH": str(tmp_path / "wh.duckdb")}
    out = _dags_test(env, {"file": str(REPO_ROOT / "docs" / "examples" / "jobs.yaml")})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert len(_rows(tmp_path / "wh.duckdb")) == 10
