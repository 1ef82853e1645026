"""TIME_SCHEDULES: on (default), every time-scheduled DAG keeps its cron; off, none of them has a time schedule and
the Asset-scheduled transform is unchanged; a bad value fails every such DAG file, naming the variable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.dags.conftest import DAGS, REPO_ROOT

_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"errors": {k.rsplit("/", 1)[-1]: str(v) for k, v in bag.import_errors.items()},
                  "schedules": {d: repr(dag.timetable) for d, dag in bag.dags.items()}}))
"""
TIMED = {
    "plan_hourly": "0 * * * *",
    "ingest_grid": "0 * * * *",
    "forecast_predict": "0 * * * *",
    "forecast_train": "0 0 * * *",
    "ledger": "0 0 * * *",
    "predictor": "0 0 * * 0",
}


def _parse(airflow_home: dict, value: str | None) -> dict:
    env = dict(airflow_home)
    env.pop("TIME_SCHEDULES", None)
    if value is not None:
        env["TIME_SCHEDULES"] = value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", [None, "on"])
def test_time_schedules_on_by_default(airflow_home, value):
    bag = _parse(airflow_home, value)
    assert bag["errors"] == {}
    for dag_id, cron in TIMED.items():
        assert f"'{cron}'" in bag["schedules"][dag_id], (dag_id, bag["schedules"][dag_id])


def test_time_schedules_off_leaves_only_asset_schedules(airflow_home):
    bag = _parse(airflow_home, "off")
    assert bag["errors"] == {}
    for dag_id in TIMED:
        assert "NullTimetable" in bag["schedules"][dag_id], (dag_id, bag["schedules"][dag_id])
    assert "Asset" in bag["schedules"]["transform"], bag["schedules"]["transform"]


def test_bad_time_schedules_value_names_the_variable(airflow_home):
    bag = _parse(airflow_home, "sometimes")
    assert set(bag["errors"]) == {f"{d}.py" for d in TIMED}, bag["errors"]
    assert all("TIME_SCHEDULES='sometimes'" in e for e in bag["errors"].values()), bag["errors"]
