"""The Prometheus metrics (`/carbon/metrics`): their values against the ledger and the queue's own commands, the
endpoint's token and its snapshot while a writer holds the warehouse, the alert rules under promtool, the Grafana
dashboard's queries, and a real Prometheus server scraping the endpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ui.app import METRICS_TOKEN_ENV, create_app
from ui.metrics import MetricsCache

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "carbon-planner.json"


def _no_auth() -> None:
    """The pages' authentication is Airflow's; /metrics does not use it."""


def _samples(text: str) -> dict[str, list]:
    """Metric name -> its samples (name, labels, value) of an exposition text."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _families(text: str) -> set[str]:
    """Every metric name the text declares (samples or not; counters with and without `_total`)."""
    names = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    return names | {n + "_total" for n in names}


def _cli(*args, db) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "scheduling", *args, "--db", str(db), "--json"], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def scraped(looped_warehouse) -> str:
    client = TestClient(create_app(_no_auth, db_path=looped_warehouse), root_path="/carbon")
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return reply.text


@pytest.fixture(scope="module")
def book(looped_warehouse) -> dict:
    return _cli("ledger", db=looped_warehouse)


def test_metrics_equal_the_ledger_and_the_queue(scraped, book, looped_warehouse):
    samples = _samples(scraped)
    totals = book["totals"]
    assert totals["finished"] > 0
    value = {name: s[0].value for name, s in samples.items() if len(s) == 1}
    assert value["carbon_planner_saving_ratio"] == pytest.approx(totals["saving_pct"] / 100, abs=5e-5)
    assert value["carbon_planner_deadlines_met_ratio"] == pytest.approx(totals["deadlines_met_pct"] / 100, abs=5e-5)
    assert value["carbon_planner_deadline_regret_ratio"] == pytest.approx(totals["deadline_regret_pct"] / 100, abs=5e-5)
    realized = sum(s.value for s in samples["carbon_planner_realized_co2e_grams_total"])
    run_now = sum(s.value for s in samples["carbon_planner_run_now_co2e_grams_total"])
    assert realized == pytest.approx(1000 * totals["realized_kgco2e"], abs=1e-2)
    assert run_now == pytest.approx(1000 * totals["counterfactual_kgco2e"], abs=1e-2)
    ended = Counter()
    for s in samples["carbon_planner_jobs_ended_total"]:
        ended[s.labels["outcome"]] += s.value
    assert ended["finished"] == totals["finished"] and ended["failed"] == totals["failed"]
    # the queue: per state, as `python -m scheduling jobs list --json` lists it
    listed = _cli("jobs", "list", db=looped_warehouse)
    rows = listed["jobs"] if isinstance(listed, dict) else listed
    by_state = Counter(r["state"] for r in rows)
    exposed = Counter()
    for s in samples["carbon_planner_queue_jobs"]:
        exposed[s.labels["state"]] += s.value
    assert {k: v for k, v in exposed.items() if v} == dict(by_state)


def test_the_loop_and_the_fleet_are_reported(scraped, looped_warehouse):
    from scheduling.service import plan_fleet
    from tests.ui.conftest import DAY

    samples = _samples(scraped)
    last_hour = samples["carbon_planner_loop_last_plan_time_seconds"][0].value
    assert last_hour == pytest.approx(time.mktime(time.strptime(f"{DAY} 11", "%Y-%m-%d %H")) - time.timezone, abs=1)
    written = samples["carbon_planner_loop_last_plan_written_timestamp_seconds"][0].value
    lag = samples["carbon_planner_loop_lag_seconds"][0].value
    assert 0 <= lag and written + lag == pytest.approx(time.time(), abs=600)  # written + lag: when it was read
    steps = {s.labels["step"]: s.value for s in samples["carbon_planner_loop_step_duration_seconds"]}
    assert set(steps) == {"sync", "plan", "dispatch"} and all(v > 0 for v in steps.values())
    assert {s.labels["step"]: s.value for s in samples["carbon_planner_loop_step_failed"]} == dict.fromkeys(steps, 0)
    assert {s.labels["executor"]: s.value for s in samples["carbon_planner_executor_reachable"]} == {"replay": 1.0}
    fleet = plan_fleet(None).sampled()
    capacity = {s.labels["cluster"]: s.value for s in samples["carbon_planner_gpu_milli_capacity"]}
    assert capacity == {c.name: 1000.0 * c.n_gpus for c in fleet.clusters}
    allocated = {s.labels["cluster"]: s.value for s in samples["carbon_planner_gpu_milli_allocated"]}
    assert all(0 <= allocated[c] <= capacity[c] for c in allocated) and sum(allocated.values()) > 0
    assert {s.labels["zone"] for s in samples["carbon_planner_grid_data_age_seconds"]} == set(fleet.zones)


def test_labels_never_name_a_job(scraped):
    allowed = {"state", "tenant", "reason", "step", "executor", "cluster", "outcome", "result", "service", "zone",
               "region", "quantile", "model", "target", "version", "status"}  # fmt: skip
    labels = {k for family in text_string_to_metric_families(scraped) for s in family.samples for k in s.labels}
    assert labels <= allowed


def test_a_token_guards_the_endpoint_when_set(looped_warehouse, monkeypatch):
    monkeypatch.setenv(METRICS_TOKEN_ENV, "s3cret")
    client = TestClient(create_app(_no_auth, db_path=looped_warehouse), root_path="/carbon")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_a_scrape_never_waits_for_a_writer(looped_warehouse, tmp_path):
    """With a writer holding the warehouse, a scrape answers with the last snapshot at once and refreshes in the
    background; once the writer is gone, the refresh lands."""
    from warehouse.db import writer

    db = tmp_path / "warehouse.duckdb"
    shutil.copyfile(looped_warehouse, db)
    cache = MetricsCache(db, max_age_s=0.0, read_timeout_s=60.0)
    first = cache.text()
    first_at = cache._at
    with writer(db):
        answered = cache.text()  # a refresh now would wait up to 60 s for the writer: the answer does not
        assert cache.refreshing
    meta = b"# HELP carbon_planner_metrics_snapshot"
    assert answered.split(meta)[0] == first.split(meta)[0]  # the same snapshot
    deadline = time.monotonic() + 60
    while cache.refreshing and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not cache.refreshing and cache._at > first_at


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (deploy/install-services.sh prometheus)")
    return path


def test_alert_rules_pass_promtool():
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(RULES / "alerts.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True, text=True)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_a_runbook():
    import yaml

    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((RULES / "alerts_test.yml").read_text())
    fired = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert names == fired
    runbook = (ROOT / "docs" / "operating.md").read_text()
    for name in names:
        assert f'<a id="alert-{name.lower()}"></a>' in runbook, name


def test_the_dashboard_queries_only_exposed_metrics(scraped):
    dashboard = json.loads(DASHBOARD.read_text())
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])
    exposed = _families(scraped)
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 10
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    used = {m for q in queries for m in re.findall(r"carbon_planner_[a-z0-9_]+", q)}
    assert used and used <= exposed, sorted(used - exposed)
    assert {"carbon_planner_saving_ratio", "carbon_planner_queue_jobs", "carbon_planner_grid_intensity_gco2_per_kwh",
            "carbon_planner_forecast_intensity_gco2_per_kwh"} <= used  # fmt: skip


# ------------------------------------------------------------------------------------------------ real Prometheus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, what: str, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def served_app(looped_warehouse):
    """The Carbon app on a local port (uvicorn in a thread), as the Airflow API server mounts it at /carbon."""
    import uvicorn
    from fastapi import FastAPI

    outer = FastAPI()
    outer.mount("/carbon", create_app(_no_auth, db_path=looped_warehouse))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(outer, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait(lambda: server.started, "the app to listen")
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def test_a_real_prometheus_scrapes_the_endpoint(served_app, book, looped_warehouse, tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus is not installed (deploy/install-services.sh prometheus)")
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    shutil.copyfile(RULES / "alerts.yml", tmp_path / "alerts.yml")
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [alerts.yml]\nscrape_configs:\n"
        f"  - job_name: carbon-planner\n    metrics_path: /carbon/metrics\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{served_app}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")
    command = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _ok(f"{base}/-/ready"), "Prometheus to be ready")

        def query(expr: str) -> list:
            reply = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10).json()
            return reply["data"]["result"] if reply.get("status") == "success" else []

        up = _wait(lambda: query('up{job="carbon-planner"} == 1'), "a successful scrape")
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{served_app}"
        totals = book["totals"]
        saving = _wait(lambda: query("carbon_planner_saving_ratio"), "the saving")
        assert float(saving[0]["value"][1]) == pytest.approx(totals["saving_pct"] / 100, abs=5e-5)
        met = query("carbon_planner_deadlines_met_ratio")
        assert float(met[0]["value"][1]) == pytest.approx(totals["deadlines_met_pct"] / 100, abs=5e-5)
        realized = query("sum(carbon_planner_realized_co2e_grams_total) / 1000")
        assert float(realized[0]["value"][1]) == pytest.approx(totals["realized_kgco2e"], abs=1e-5)
        listed = _cli("jobs", "list", db=looped_warehouse)
        rows = listed["jobs"] if isinstance(listed, dict) else listed
        states = query("sum by (state) (carbon_planner_queue_jobs)")
        by_state = {r["metric"]["state"]: float(r["value"][1]) for r in states}
        assert {k: int(v) for k, v in by_state.items() if v} == dict(Counter(r["state"] for r in rows))
        rules = requests.get(f"{base}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} >= {"CarbonPlannerStalled", "CarbonPlannerDeadlineRegret"}
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
