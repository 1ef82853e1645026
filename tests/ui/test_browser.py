"""The Carbon pages in a real browser inside a real Airflow: `airflow standalone` with the repository's plugins
folder on a warehouse the loop ran on; headless Chromium logs in through Airflow's own log-in page, opens the
overview, the plan, a job page and the Carbon entry of Airflow's navigation, and the pages show the figures of
`python -m scheduling ledger --json` and the warehouse. Without a session the pages and their JSON are refused.
Screenshots are kept under $TEST_ARTIFACTS_DIR (default var/test-artifacts)/carbon-pages/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import duckdb
import pytest
import requests

from tests.conftest import REPO_ROOT
from tests.e2e.harness import PASSWORD, USER, AirflowServer
from tests.ui.browser import Browser, chromium_path

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="chromium is not installed (deploy/install-services.sh chromium, as root)"
)

ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", REPO_ROOT / "var" / "test-artifacts")) / "carbon-pages"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, looped_warehouse) -> Path:
    """A copy of the looped warehouse: the plan_hourly run below adds an hour to it."""
    path = tmp_path_factory.mktemp("carbon_warehouse") / "warehouse.duckdb"
    shutil.copyfile(looped_warehouse, path)
    return path


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, warehouse):
    root = tmp_path_factory.mktemp("carbon_airflow")
    var = root / "var"
    server = AirflowServer(
        home=root / "home",
        warehouse=warehouse,
        extra_env={"VAR_DIR": str(var), "SCHEDULES_DIR": str(var / "schedules")},
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        assert not server.leftovers()


@pytest.fixture(scope="module")
def browser(tmp_path_factory, airflow):
    """A browser logged in through Airflow's log-in page, which sends it back to the Carbon overview."""
    chromium = Browser(tmp_path_factory.mktemp("chromium"), width=1280, height=1000)
    try:
        chromium.open(f"{airflow.base}/carbon/")
        chromium.wait_until("location.pathname.startsWith('/auth/login') && document.querySelectorAll('input').length")
        chromium.type_into("input[name=username], input:not([type=password])", USER)
        chromium.type_into("input[type=password]", PASSWORD)
        chromium.evaluate("document.querySelector('button[type=submit]').click()")
        chromium.wait_until("location.pathname === '/carbon/' && document.getElementById('totals') !== null")
        yield chromium
    finally:
        chromium.close()


def _ledger_cli(db: Path, start: str, end: str, out: Path) -> dict:
    reply = subprocess.run(
        [sys.executable, "-m", "scheduling", "ledger", "--from", start, "--to", end, "--db", str(db)]
        + ["--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert reply.returncode == 0, reply.stderr[-2000:]
    return json.loads(reply.stdout)


def test_without_a_session_pages_and_json_are_refused(airflow):
    for path in ("/carbon/api/overview", "/carbon/api/plan", "/carbon/api/jobs/demo/x"):
        assert requests.get(f"{airflow.base}{path}", timeout=30).status_code == 401, path
        forged = {"Authorization": "Bearer not-a-token"}
        assert requests.get(f"{airflow.base}{path}", headers=forged, timeout=30).status_code in (401, 403)
        cookie = {"_token": "not-a-token"}
        assert requests.get(f"{airflow.base}{path}", cookies=cookie, timeout=30).status_code in (401, 403)
    for path in ("/carbon/", "/carbon/plan", "/carbon/jobs/demo/x"):
        reply = requests.get(f"{airflow.base}{path}", allow_redirects=False, timeout=30)
        assert reply.status_code == 302 and reply.headers["location"].startswith("/auth/login?next="), path
    token = {"Authorization": f"Bearer {airflow.token}"}
    assert requests.get(f"{airflow.base}/carbon/api/overview", headers=token, timeout=30).status_code == 200


def test_the_metrics_need_no_airflow_session(airflow):
    """A Prometheus scraper holds no Airflow session: /carbon/metrics answers the exposition text without one."""
    reply = requests.get(f"{airflow.base}/carbon/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    assert "# TYPE carbon_planner_saving_ratio gauge" in reply.text


def test_the_plugin_adds_the_nav_entry_and_the_dag_run_view(airflow):
    plugins = airflow.api("GET", "/plugins").json()["plugins"]
    carbon = next(p for p in plugins if p["name"] == "carbon")
    assert [a["url_prefix"] for a in carbon["fastapi_apps"]] == ["/carbon"]
    views = {v["destination"]: v for v in carbon["external_views"]}
    assert views["nav"]["name"] == "Carbon" and views["nav"]["href"] == "/carbon/"
    assert views["dag_run"]["href"] == "/carbon/plan?dag_id={DAG_ID}&run_id={RUN_ID}"


def test_overview_shows_the_ledger_figures(browser, airflow, warehouse, tmp_path):
    shown = browser.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#totals .kpi')]"
        ".map(k => [k.dataset.key, k.querySelector('b').textContent]))"
    )
    doc = requests.get(
        f"{airflow.base}/carbon/api/overview", headers={"Authorization": f"Bearer {airflow.token}"}, timeout=30
    ).json()
    start, end = doc["window"]["start"][:10], doc["window"]["end"][:10]
    totals = _ledger_cli(warehouse, start, end, tmp_path / "ledger")["totals"]
    assert totals["jobs"] > 0
    assert shown == {
        "realized kgCO2e": f"{totals['realized_kgco2e']:.3f}",
        "run-now kgCO2e": f"{totals['counterfactual_kgco2e']:.3f}",
        "saving %": f"{totals['saving_pct']:.3f}",
        "deadlines met %": f"{totals['deadlines_met_pct']:.3f}",
        "deadline regret %": f"{totals['deadline_regret_pct']:.3f}",
        "jobs": str(totals["jobs"]),
        "finished": str(totals["finished"]),
        "failed": str(totals["failed"]),
    }
    days = browser.evaluate("[...document.querySelectorAll('#per-day tr')].slice(1).map(r => r.cells.length)")
    assert len(days) == len(doc["days"]) >= 1
    assert browser.evaluate("document.querySelectorAll('svg').length") >= 3
    browser.screenshot(ARTIFACTS / "overview.png")


def test_plan_page_shows_the_latest_plan(browser, airflow, warehouse):
    with duckdb.connect(str(warehouse), read_only=True) as con:
        plan_id, n_assigned = con.execute(
            "SELECT plan_id, n_assigned FROM plan.plans ORDER BY plan_time DESC LIMIT 1"
        ).fetchone()
    browser.open(f"{airflow.base}/carbon/plan")
    assert plan_id in browser.evaluate("document.body.innerText")
    assert browser.evaluate("document.querySelectorAll('svg rect[fill-opacity=\"0.85\"]').length") == n_assigned
    browser.screenshot(ARTIFACTS / "plan.png")


def test_job_page_shows_history_decision_and_realized_carbon(browser, airflow, warehouse):
    with duckdb.connect(str(warehouse), read_only=True) as con:
        tenant, job_id, realized = con.execute(
            "SELECT tenant, job_id, realized_kgco2e FROM marts.carbon_ledger WHERE outcome = 'finished' "
            "ORDER BY saving_kgco2e DESC LIMIT 1"
        ).fetchone()
        changes = con.execute(
            "SELECT count(*) FROM queue.job_history WHERE tenant = ? AND job_id = ?", [tenant, job_id]
        ).fetchone()[0]
    browser.open(f"{airflow.base}/carbon/jobs/{tenant}/{job_id}")
    text = browser.evaluate("document.body.innerText")
    assert f"Job {tenant}/{job_id}" in text
    assert browser.evaluate("document.querySelectorAll('#history tr').length") == changes + 1
    assert browser.evaluate("document.querySelector('#ledger').innerText").count(f"{realized:.3f}") == 1
    assert browser.evaluate("document.querySelectorAll('.decision').length") >= 1
    assert "run now" in text and "Binding constraints" in text and "Forecast:" in text
    browser.screenshot(ARTIFACTS / "job.png")


def test_the_carbon_entry_opens_inside_airflow(browser, airflow):
    browser.open(f"{airflow.base}/plugin/carbon")
    src = browser.wait_until("document.querySelector('iframe') && document.querySelector('iframe').src", 60)
    assert src.endswith("/carbon/")
    browser.wait_until(
        "(() => { const d = document.querySelector('iframe').contentDocument;"
        " return d && d.getElementById('totals') !== null; })()",
        60,
    )
    browser.screenshot(ARTIFACTS / "airflow-nav.png")


def test_a_plan_hourly_run_links_to_the_plan_it_wrote(browser, airflow):
    run_id = airflow.trigger("plan_hourly", {"as_of": "2021-07-15T12:00Z"})  # the hour after the loop's twelve
    state = airflow.wait_for_run("plan_hourly", run_id, timeout_s=400)
    assert state == "success", airflow.failed_task_logs("plan_hourly", run_id)
    browser.open(f"{airflow.base}/carbon/plan?dag_id=plan_hourly&run_id={quote(run_id)}")
    text = browser.evaluate("document.body.innerText")
    assert f"The plan written by plan_hourly run {run_id}." in text
    assert "rolling-lp@2021-07-15T12:00:00Z" in text
    browser.open(f"{airflow.base}/dags/plan_hourly/runs/{quote(run_id)}/plugin/carbon-plan")
    src = browser.wait_until("document.querySelector('iframe') && document.querySelector('iframe').src", 60)
    assert src.endswith(f"/carbon/plan?dag_id=plan_hourly&run_id={quote(run_id, safe='')}"), src
    browser.screenshot(ARTIFACTS / "dag-run-plan.png")
