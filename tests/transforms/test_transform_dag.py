"""The transform DAG parses fast from the manifest, and is wired as documented (pool, Assets, layers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGS = REPO_ROOT / "dags"

_PROBE = r"""
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags.get("transform")
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()},
       "duration_s": [s.duration.total_seconds() for s in bag.dagbag_stats]}
if dag is not None:
    out.update(
        tasks=sorted(t.task_id for t in dag.tasks),
        pools=sorted({t.pool for t in dag.tasks}),
        groups=sorted(dag.task_group.children),
        schedule=(
            sorted(a.uri for a in dag.timetable.asset_condition.objects)
            if hasattr(dag.timetable, "asset_condition")
            else None
        ),
        outlets=sorted(o.uri for t in dag.tasks for o in (t.outlets or [])),
        roots=sorted(t.task_id for t in dag.roots),
    )
from transforms import cosmos_config
out["load_mode"] = cosmos_config.load_mode().value
print(json.dumps(out))
"""


def _parse(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(tmp_path / "home"),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__COSMOS__ENABLE_TELEMETRY="False",
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(DAGS)]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS / "transform.py")],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_transform_dag_parses_from_the_manifest_and_is_wired(tmp_path, fresh_manifest):
    dag = _parse(tmp_path)
    assert dag["errors"] == {}
    assert dag["load_mode"] == "dbt_manifest"
    # from the manifest it parses well under a second (benchmarks/bench_dag_parse.py, 2 s budget), `dbt ls` would
    # take many seconds: load_mode above tells them apart; the time only needs a margin a loaded 2-core host keeps
    assert max(dag["duration_s"]) < 10.0, dag["duration_s"]
    assert dag["pools"] == ["warehouse"]
    assert {"staging", "intermediate", "marts"} <= set(dag["groups"])
    assert "marts.grid_hourly_model_build" in dag["tasks"] and "publish_marts" in dag["tasks"]
    assert dag["roots"] == ["test_raw_sources"]
    assert dag["outlets"] == ["warehouse://marts/"]
    if dag["schedule"] is not None:
        assert dag["schedule"] == sorted(f"warehouse://raw/{g}" for g in ("cluster", "energy", "interference", "grid"))


def test_stale_manifest_falls_back_to_dbt_ls(tmp_path, monkeypatch):
    from transforms import cosmos_config

    monkeypatch.setattr(cosmos_config, "MANIFEST_PATH", tmp_path / "missing.json")
    assert cosmos_config.load_mode() is cosmos_config.LoadMode.DBT_LS
    assert not cosmos_config.manifest_is_fresh(tmp_path / "missing.json")
