"""The Carbon app without Airflow (its authentication is the caller's dependency; the plugin passes Airflow's, which
tests/ui/test_browser.py checks): pages and JSON twins on a fresh warehouse and after the loop, the ledger's figures,
escaping, ids as parameters, authentication, and a writer holding the warehouse."""

from __future__ import annotations

import threading

import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

from ui import data
from ui.app import create_app
from warehouse.db import reader

TOKEN = {"Authorization": "Bearer good"}


def _authenticate(request: Request) -> None:
    """A stand-in for Airflow's check: one accepted bearer token."""
    if request.headers.get("authorization") != TOKEN["Authorization"]:
        raise HTTPException(status_code=401, detail="Not authenticated")


def _client(db) -> TestClient:
    app = create_app(_authenticate, login_url=lambda next_url: f"/auth/login?next={next_url}", db_path=db)
    return TestClient(app, root_path="/carbon")


@pytest.fixture
def looped(looped_warehouse) -> TestClient:
    return _client(looped_warehouse)


def test_a_fresh_warehouse_shows_empty_states(tmp_path):
    client = _client(tmp_path / "none.duckdb")  # not created yet
    overview = client.get("/api/overview", headers=TOKEN)
    assert overview.status_code == 200 and overview.json()["window"] is None
    assert "No job has ended yet" in client.get("/", headers=TOKEN).text
    assert client.get("/api/plan", headers=TOKEN).json()["plan"] is None
    assert "No plan yet" in client.get("/plan", headers=TOKEN).text
    job = client.get("/api/jobs/demo/j1", headers=TOKEN)
    assert job.status_code == 200 and job.json() == {"found": False, "job": "demo/j1"}
    assert not (tmp_path / "none.duckdb").exists()  # reading never creates the warehouse


def test_every_route_needs_authentication(looped):
    for path in ("/api/overview", "/api/plan", "/api/jobs/demo/20210715-job-00001"):
        reply = looped.get(path)
        assert reply.status_code == 401, path
        assert looped.get(path, headers={"Authorization": "Bearer bad"}).status_code == 401
    for path in ("/", "/plan", "/jobs/demo/20210715-job-00001"):
        reply = looped.get(path, follow_redirects=False)
        assert reply.status_code == 302, path
        assert reply.headers["location"].startswith("/auth/login?next=")


def test_the_overview_has_the_ledgers_figures(looped, looped_warehouse):
    from scheduling.output.ledger import ledger

    doc = looped.get("/api/overview", headers=TOKEN).json()
    window = doc["window"]
    assert (window["start"], window["end"], window["days"]) == ("2021-07-09T00:00:00Z", "2021-07-16T00:00:00Z", 7)
    book = ledger(window["start"], window["end"], db_path=looped_warehouse)
    assert doc["totals"] == book.totals and doc["totals"]["jobs"] > 0
    assert [d["realized_kgco2e"] for d in doc["days"]] == list(book.rollups["day"]["realized_kgco2e"])
    assert doc["ledger_command"] == "python -m scheduling ledger --from 2021-07-09 --to 2021-07-16 --json"
    assert doc["clusters"] and all(0 < c["utilization_pct"] < 100 for c in doc["clusters"])
    assert doc["regions"] and all(r["forecast_kgco2e"] > 0 and r["actual_kgco2e"] > 0 for r in doc["regions"])
    html = looped.get("/", headers=TOKEN).text
    assert f"<b>{doc['totals']['realized_kgco2e']:.3f}</b>realized kgCO2e" in html
    assert "<svg" in html and "<script" not in html


def test_the_plan_page_shows_the_latest_plan_and_why_jobs_wait(looped):
    doc = looped.get("/api/plan", headers=TOKEN).json()
    plan = doc["plan"]
    assert plan["plan_id"] == "rolling-lp@2021-07-15T11:00:00Z"  # the 12th and last hour of the loop
    assert len(doc["assignments"]) == plan["n_assigned"]
    later = [a for a in doc["assignments"] if a["start_time"] > plan["plan_time"]]
    assert [w["job_id"] for w in doc["waiting"]] == [a["job_id"] for a in later]
    assert all(w["why"].startswith("waits ") for w in doc["waiting"])
    reasons = {w["job_id"]: w["why"] for w in doc["waiting"]}
    assert doc["queued"] and all(q["why"] for q in doc["queued"])
    assert all(q["why"] == reasons[f"{q['tenant']}/{q['job_id']}"] for q in doc["queued"] if q["state"] == "planned")
    html = looped.get("/plan", headers=TOKEN).text
    assert plan["plan_id"] in html and "<svg" in html
    older = looped.get("/api/plan", params={"plan_id": "rolling-lp@2021-07-15T03:00:00Z"}, headers=TOKEN).json()
    assert older["plan"]["plan_id"] == "rolling-lp@2021-07-15T03:00:00Z"
    run = looped.get("/api/plan", params={"dag_id": "plan_hourly", "run_id": "manual__x"}, headers=TOKEN).json()
    assert run["plan"]["plan_id"] == plan["plan_id"] and "has stored no plan" in run["note"]


def test_the_job_page_shows_history_decision_and_realized_carbon(looped, looped_warehouse):
    finished = looped.get("/api/overview", headers=TOKEN).json()
    assert finished["totals"]["finished"] > 0
    plan = looped.get("/api/plan", params={"plan_id": "rolling-lp@2021-07-15T00:00:00Z"}, headers=TOKEN).json()
    with reader(looped_warehouse) as con:  # a job of that plan that has ended: it is in the ledger
        ended = {t + "/" + j for t, j in con.execute("SELECT tenant, job_id FROM marts.carbon_ledger").fetchall()}
    tenant, job_id = next(a["job_id"] for a in plan["assignments"] if a["job_id"] in ended).split("/")
    doc = looped.get(f"/api/jobs/{tenant}/{job_id}", headers=TOKEN).json()
    assert doc["found"] and doc["job"] == f"{tenant}/{job_id}"
    assert doc["history"][0]["event"] == "submitted"
    record = doc["explanations"][0]["record"]
    assert {"priority", "alternatives", "counterfactuals", "binding_constraints", "forecast_version"} <= set(record)
    html = looped.get(f"/jobs/{tenant}/{job_id}", headers=TOKEN).text
    assert f"Job {tenant}/{job_id}" in html and 'id="history"' in html and "Decisions (" in html
    assert "run now" in html and record["forecast_version"] in html
    assert doc["ledger"]["realized_kgco2e"] > 0 and f"{doc['ledger']['realized_kgco2e']:.3f}" in html


def test_the_job_page_shows_the_power_limit_timeline_with_a_card_per_change(looped, looped_warehouse):
    with reader(looped_warehouse) as con:
        changed = con.execute(
            "SELECT job_id, count(*) AS n, min(from_limit_w), min(to_limit_w) FROM plan.power_changes "
            "WHERE status = 'sent' GROUP BY job_id ORDER BY n DESC, job_id LIMIT 1"
        ).fetchone()
        assert changed is not None, "the looped day changes some running job's power limit"
        job, n = changed[0], changed[1]
        started = con.execute(
            "SELECT count(*) FROM raw.job_events WHERE planner_job_id = ? AND event = 'started'", [job]
        ).fetchone()[0]
    tenant, job_id = job.split("/")
    doc = looped.get(f"/api/jobs/{tenant}/{job_id}", headers=TOKEN).json()
    assert len(doc["power_changes"]) == n
    for change in doc["power_changes"]:
        assert f"{change['from_limit_w']:.0f} W to {change['to_limit_w']:.0f} W" in change["text"]
        assert "Limit kept" in change["text"]
    html = looped.get(f"/jobs/{tenant}/{job_id}", headers=TOKEN).text
    timeline = html.split('id="power"', 1)[1].split("</table>", 1)[0]
    assert timeline.count("<tr>") - 1 == n + min(started, len(doc["runs"]))  # each start, then each change
    assert html.count('class="card power-change"') == n


def test_markup_in_data_or_urls_is_text_and_ids_are_parameters(tmp_warehouse):
    from scheduling.queue.intake import submit_mappings
    from tests.scheduling.queue.helpers import good_job

    script = '<script>alert("x")</script>'
    job = good_job(job_type=script, workload_class="vision")
    report = submit_mappings([job], source="carbon-page-test", as_of="2021-07-15T12:00Z", db_path=tmp_warehouse)
    assert not report.rejected, report.rejected
    client = _client(tmp_warehouse)
    html = client.get("/jobs/ml/j1", headers=TOKEN).text
    assert script not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    missing = client.get("/jobs/ml/<img src=x onerror=alert(1)>", headers=TOKEN).text
    assert "<img" not in missing and "No job ml/&lt;img src=x onerror=alert(1)&gt;" in missing
    injected = client.get("/api/jobs/ml/j1' OR '1'='1", headers=TOKEN).json()
    assert injected == {"found": False, "job": "ml/j1' OR '1'='1"}
    assert client.get("/api/jobs/ml/j1", headers=TOKEN).json()["found"] is True


def test_a_writer_holding_the_warehouse_never_fails_a_page(looped, looped_warehouse, monkeypatch):
    from warehouse.db import writer

    monkeypatch.setattr(data, "BUSY_WAIT_S", 0.3)
    fresh = looped.get("/api/overview", headers=TOKEN).json()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer(looped_warehouse):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        stale = looped.get("/api/overview", headers=TOKEN)
        assert stale.status_code == 200
        assert stale.json()["stale"]["reason"] == "busy"
        assert stale.json()["totals"] == fresh["totals"]
        assert "A DAG is writing the warehouse" in looped.get("/", headers=TOKEN).text
        never_read = looped.get("/api/jobs/demo/never-read", headers=TOKEN)
        assert never_read.status_code == 503 and never_read.headers["retry-after"] == "5"
        page = looped.get("/jobs/demo/never-read", headers=TOKEN)
        assert page.status_code == 503 and 'http-equiv="refresh"' in page.text
    finally:
        release.set()
        holder.join()
    assert "stale" not in looped.get("/api/overview", headers=TOKEN).json()


def test_the_llm_narration_shows_when_the_chat_explainer_wrote_the_card(monkeypatch):
    from scheduling.explain.registry import make_explainer
    from scheduling.explain.template import TemplateExplainer
    from tests.scheduling.test_explain import RECORD, FakeChat
    from ui import pages

    card = pages.decision_card({"plan_id": "p", "record": RECORD, "text": TemplateExplainer().explain(RECORD)})
    assert "Narration" not in card and "Card text" in card
    for var in ("AIRFLOW_CONN_EXPLAINER_LLM", "EXPLAINER_LLM_API_KEY", "EXPLAINER_LLM_MODEL", "AIRFLOW_CTX_DAG_ID"):
        monkeypatch.delenv(var, raising=False)  # only the endpoint below
    with FakeChat() as chat:  # an OpenAI-compatible endpoint on 127.0.0.1
        monkeypatch.setenv("EXPLAINER_LLM_BASE_URL", chat.url + "/v1")
        text = make_explainer("chat").explain(RECORD)
    assert text.startswith("LLM card for")
    card = pages.decision_card({"plan_id": "p", "record": RECORD, "text": text})
    assert "Narration (explainer LLM)" in card and pages.esc(text) in card
