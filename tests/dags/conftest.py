"""An isolated, migrated Airflow home for DAG tests (SQLite), with the `warehouse` pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGS = REPO_ROOT / "dags"


def airflow_env(home: Path, warehouse: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__COSMOS__ENABLE_TELEMETRY="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        WAREHOUSE_PATH=str(warehouse),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(DAGS)]),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> dict[str, str]:
    """Environment of a migrated Airflow home; the tests run Airflow's own CLI in it."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = airflow_env(home, home / "warehouse.duckdb")
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    subprocess.run(
        [airflow, "pools", "set", "warehouse", "1", "DuckDB single writer"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return env
