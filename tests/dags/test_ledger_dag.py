"""ledger: it parses and is wired as documented (daily, build_ledger in the `warehouse` pool between validate_params
and report), a bad period fails naming the value, and `airflow dags test` on a warehouse the loop ran on rebuilds
the ledger marts and reports the day's jobs as the queue knows them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tests.conftest import operate_day
from tests.dags.conftest import DAGS, REPO_ROOT, airflow_env

_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags.get("ledger")
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}}
if dag is not None:
    out["schedule"] = repr(dag.timetable)
    out["catchup"] = dag.catchup
    out["params"] = {k: dag.params.get_param(k).schema for k in dag.params}
    out["defaults"] = {k: dag.params[k] for k in dag.params}
    out["tasks"] = {t.task_id: {"pool": t.pool, "upstream": sorted(t.upstream_task_ids),
                                "inlets": sorted(a.uri.rstrip("/") for a in t.inlets),
                                "outlets": sorted(a.uri.rstrip("/") for a in t.outlets)} for t in dag.tasks}
print(json.dumps(out))
"""
DAY = "2021-07-15"


@pytest.fixture(scope="module")
def bag(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ledger_dagbag")
    env = airflow_env(tmp / "home", tmp / "wh.duckdb")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(DAGS)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ledger_is_daily_and_wired(bag):
    assert bag["errors"] == {}
    assert "'0 0 * * *'" in bag["schedule"], bag["schedule"]  # @daily
    assert bag["catchup"] is False
    tasks = bag["tasks"]
    assert set(tasks) == {"validate_params", "build_ledger", "report"}
    assert tasks["build_ledger"]["pool"] == "warehouse" and tasks["build_ledger"]["upstream"] == ["validate_params"]
    assert tasks["build_ledger"]["inlets"] == ["warehouse://plan", "warehouse://raw/jobs"]
    assert tasks["build_ledger"]["outlets"] == ["warehouse://marts"]
    assert tasks["report"]["upstream"] == ["build_ledger", "validate_params"]
    assert tasks["report"]["pool"] != "warehouse"  # reads only
    assert set(bag["params"]) == {"start", "end"}
    assert bag["defaults"] == {"start": "", "end": ""}
    assert all(p["type"] == "string" and p["pattern"] for p in bag["params"].values())


def test_the_period_comes_from_the_params_or_the_run():
    from scheduling.tasks import resolve_ledger_run

    end = pd.Timestamp("2021-07-16T00:00Z")
    assert resolve_ledger_run({"start": "", "end": ""}, data_interval_end=end) == {
        "start": "2021-07-15T00:00:00Z",
        "end": "2021-07-16T00:00:00Z",
    }
    assert resolve_ledger_run({"start": "2021-07-01", "end": "2021-07-08"}, data_interval_end=end) == {
        "start": "2021-07-01T00:00:00Z",
        "end": "2021-07-08T00:00:00Z",
    }
    with pytest.raises(ValueError, match="no period end"):
        resolve_ledger_run({})
    with pytest.raises(ValueError, match=r"start '2021-07-20' must be before end '2021-07-16'"):
        resolve_ledger_run({"start": "2021-07-20", "end": "2021-07-16"})
    with pytest.raises(ValueError, match="2021-02-30"):
        resolve_ledger_run({"end": "2021-02-30"})


def _dags_test(env: dict, conf: dict | None = None, date: str = "2021-07-16T00:00:00+00:00"):
    cmd = [str(Path(sys.executable).parent / "airflow"), "dags", "test", "ledger", date]
    if conf is not None:
        cmd += ["-c", json.dumps(conf)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def test_a_bad_period_fails_at_trigger_naming_it(airflow_home, tmp_path):
    env = {**airflow_home, "VAR_DIR": str(tmp_path / "var")}
    out = _dags_test(env, {"end": "next tuesday"})  # Airflow's Param check (pattern), before any task
    assert out.returncode != 0
    assert "next tuesday" in out.stdout + out.stderr
    assert not (tmp_path / "var" / "reports").exists()


@pytest.fixture(scope="module")
def operated(tmp_path_factory, data_dir) -> dict:
    """A warehouse with the grid marts, on which the loop ran a day: trace jobs of DAY submitted, 24 hours planned
    and dispatched to the replay executor from its midnight."""
    root = tmp_path_factory.mktemp("ledger_loop")
    db = operate_day(root, data_dir, DAY, 40, 24)
    with duckdb.connect(str(db), read_only=True) as con:
        states = dict(
            con.execute(
                "SELECT state, count(*) FROM queue.jobs WHERE CAST(timezone('UTC', submitted_at) AS DATE) = ? "
                "GROUP BY 1",
                [DAY],
            ).fetchall()
        )
    return {"db": db, "root": root, "states": states}


@pytest.mark.slow
def test_dags_test_builds_and_reports_the_ledger_of_the_day(airflow_home, operated):
    ended = {s: operated["states"].get(s, 0) for s in ("finished", "failed", "cancelled")}
    assert ended["finished"] >= 5, operated["states"]  # the day's loop must have finished jobs to account for
    var = operated["root"] / "var"
    env = {**airflow_home, "WAREHOUSE_PATH": str(operated["db"]), "VAR_DIR": str(var)}
    out = _dags_test(env)  # empty Params: the day ending at the run's data interval end, DAY
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    report = var / "reports" / "ledger" / "20210715T00_20210716T00"
    assert (report / "index.html").exists() and (report / "charts" / "per_day.png").exists()
    totals = json.loads((report / "data.json").read_text())["totals"]
    # the ledger accounts for exactly the day's jobs that ended, as the queue knows them
    assert totals["jobs"] == sum(ended.values())
    assert (totals["finished"], totals["failed"], totals["cancelled"]) == (
        ended["finished"],
        ended["failed"],
        ended["cancelled"],
    )
    assert totals["realized_kgco2e"] > 0 and totals["counterfactual_kgco2e"] > 0
    assert totals["saving_pct"] is not None and totals["saving_pct"] < 100
    with duckdb.connect(str(operated["db"]), read_only=True) as con:
        days = con.execute("SELECT DISTINCT submitted_day FROM marts.carbon_ledger").fetchall()
    assert [str(d) for (d,) in days] == [DAY]
    assert (var / "dbt" / "ledger" / "run_results.json").exists()  # dbt artifacts kept out of transforms/target
