"""plan_hourly and evaluate: they parse, are wired as documented (pool, Assets, Params), their policy lists match
the planner's, and `airflow dags test` fails fast on a bad policy or planning time, naming the value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from scheduling.service import DEFAULT_DEADLINE_RESERVE, MAX_DEADLINE_RESERVE
from tests.dags.conftest import DAGS, REPO_ROOT, airflow_env

_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id in ("plan_hourly", "evaluate", "predictor"):
    dag = bag.dags.get(dag_id)
    if dag is None:
        continue
    out["dags"][dag_id] = {
        "schedule": repr(dag.timetable),
        "params": {k: dag.params.get_param(k).schema for k in dag.params},
        "defaults": {k: dag.params[k] for k in dag.params},
        "tasks": {t.task_id: {"pool": t.pool, "inlets": sorted(a.uri for a in t.inlets),
                              "outlets": sorted(a.uri for a in t.outlets),
                              "upstream": sorted(t.upstream_task_ids)} for t in dag.tasks},
    }
stats = {str(s.file): (s.duration.total_seconds() if hasattr(s.duration, "total_seconds") else float(s.duration))
         for s in bag.dagbag_stats}
out["parse_s"] = {k: v for k, v in stats.items() if k in ("plan_hourly.py", "evaluate.py")}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bag(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("plan_dagbag")
    env = airflow_env(tmp / "home", tmp / "wh.duckdb")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dags_parse_quickly_and_are_wired(bag):
    assert bag["errors"] == {}
    assert {"plan_hourly", "evaluate"} <= set(bag["dags"])
    assert all(s < 2.0 for s in bag["parse_s"].values()), bag["parse_s"]
    plan = bag["dags"]["plan_hourly"]
    assert "'0 * * * *'" in plan["schedule"], plan["schedule"]  # @hourly
    task = plan["tasks"]["plan"]
    assert task["pool"] == "warehouse" and task["upstream"] == ["sync", "validate_params"]
    assert plan["tasks"]["sync"]["upstream"] == ["validate_params"]
    assert plan["tasks"]["sync"]["outlets"] == ["warehouse://raw/jobs"]
    assert plan["tasks"]["dispatch"]["upstream"] == ["plan", "validate_params"]
    assert task["outlets"] == ["warehouse://plan/"] or task["outlets"] == ["warehouse://plan"]
    assert {u.rstrip("/") for u in task["inlets"]} == {
        "warehouse://forecast",
        "warehouse://marts",
        "warehouse://model",
        "warehouse://queue",
    }
    params = plan["params"]
    names = {"as_of", "policy", "regions", "horizon_hours", "deadline_reserve", "pause_for_carbon",
             "preempt_for_deadlines", "dry_run"}  # fmt: skip
    assert set(params) == names
    assert params["pause_for_carbon"]["type"] == "boolean" and plan["defaults"]["pause_for_carbon"] is False
    assert params["preempt_for_deadlines"]["type"] == "boolean" and plan["defaults"]["preempt_for_deadlines"] is False
    assert (params["horizon_hours"]["minimum"], params["horizon_hours"]["maximum"]) == (24, 168)
    # the form's reserve is the command line's: same default and bounds as the service
    reserve = params["deadline_reserve"]
    assert (reserve["minimum"], reserve["maximum"]) == (0, MAX_DEADLINE_RESERVE)
    assert plan["defaults"]["deadline_reserve"] == DEFAULT_DEADLINE_RESERVE
    assert params["dry_run"]["type"] == "boolean" and params["as_of"]["type"] == "string"
    evaluate = bag["dags"]["evaluate"]
    assert set(evaluate["params"]) >= {"policies", "period_start", "days", "jobs", "regions", "load"}
    assert evaluate["params"]["load"]["enum"] == [0.5, 0.8]
    assert (evaluate["params"]["days"]["minimum"], evaluate["params"]["days"]["maximum"]) == (1, 31)
    assert evaluate["tasks"]["simulate_and_report"]["upstream"] == ["validate_params"]
    # lineage: the predictor DAG's registrations are the plan's model inputs
    train = bag["dags"]["predictor"]["tasks"]["train_and_register"]
    assert {u.rstrip("/") for u in train["outlets"]} == {"warehouse://model"}


def test_policy_and_region_enums_match_the_planner_and_fleet(bag):
    from scheduling.domain.fleet_file import DEFAULT_FLEET_PATH, fleet_regions
    from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES

    plan = bag["dags"]["plan_hourly"]["params"]
    assert plan["policy"]["enum"] == list(POLICY_NAMES)
    assert bag["dags"]["plan_hourly"]["defaults"]["policy"] == DEFAULT_POLICY
    assert plan["regions"]["items"]["enum"] == fleet_regions()  # the configured fleet (FLEET_PATH)
    evaluate = bag["dags"]["evaluate"]["params"]
    assert evaluate["policies"]["items"]["enum"] == list(POLICY_NAMES)
    assert evaluate["regions"]["items"]["enum"] == fleet_regions(DEFAULT_FLEET_PATH)  # the simulator's fleet


def test_fleet_path_sets_the_plan_regions_without_numpy_at_parse_time(tmp_path):
    probe = (
        "import json, sys; import dagutils.params as p; heavy = [m for m in ('numpy', 'pandas') if m in sys.modules]; "
        "print(json.dumps([p.FLEET_REGIONS, p.SIMULATOR_REGIONS, heavy]))"
    )
    env = airflow_env(tmp_path / "home", tmp_path / "wh.duckdb")
    env["FLEET_PATH"] = "docs/examples/fleet.yaml"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    plan_regions, simulator_regions, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert plan_regions == ["us-west", "eu-north", "eu-central"]
    assert simulator_regions[:6] == ["us-west", "us-south", "us-east", "us-northeast", "eu-north", "eu-central"]
    assert heavy == []


def _dags_test(env: dict, dag_id: str, conf: dict | None = None, date: str = "2021-07-15T12:00:00+00:00"):
    cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id, date]
    if conf is not None:
        cmd += ["-c", json.dumps(conf)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "conf, needle",
    [
        ({"policy": "fastest-please"}, "fastest-please"),  # Airflow's Param check (enum), before any task
        ({"as_of": "half past noon"}, "half past noon"),  # Airflow's Param check (pattern), before any task
        pytest.param(
            {"as_of": "2021-13-45T00:00Z"},
            "2021-13-45T00:00Z",  # the validate_params task (slower)
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_params_fail_fast_naming_the_value(airflow_home, conf, needle):
    out = _dags_test(airflow_home, "plan_hourly", conf)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert needle in log
    assert "schedule dir" not in log  # the planning task never ran
    wh = Path(airflow_home["WAREHOUSE_PATH"])
    if wh.exists():
        with duckdb.connect(str(wh), read_only=True) as con:
            n = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'plan'").fetchone()
        assert n[0] == 0


@pytest.mark.slow
def test_plan_hourly_dags_test_writes_plan_and_schedule(airflow_home, data_dir, tmp_path):
    env = {**airflow_home, "SCHEDULES_DIR": str(tmp_path / "schedules")}
    out = _dags_test(env, "plan_hourly", {"as_of": "2021-07-15T12:00Z", "horizon_hours": 72})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert (tmp_path / "schedules" / "2021-07-15T12-00Z" / "index.json").exists()
    with duckdb.connect(airflow_home["WAREHOUSE_PATH"], read_only=True) as con:
        row = con.execute("SELECT plan_id, created_from FROM plan.plans").fetchall()
    assert ("rolling-lp@2021-07-15T12:00:00Z", "airflow:plan_hourly") in row


@pytest.mark.slow
def test_evaluate_dags_test_writes_the_report(airflow_home, data_dir, tmp_path):
    env = {**airflow_home, "VAR_DIR": str(tmp_path / "var")}
    out = _dags_test(
        env,
        "evaluate",
        {
            "policies": ["priority", "performance-first"],
            "period_start": "2021-07-01",
            "days": 1,
            "jobs": 12,
            "regions": 2,
            "load": 0.5,
            "max_cards": 2,
        },
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "evaluation report: " in log
    index = next((tmp_path / "var" / "reports" / "evaluate").glob("*/index.html"))
    assert index.exists()
