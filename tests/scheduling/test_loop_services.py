"""Inference services through the real loop (replay executor, shared grid and ServeGen data) on a fleet of two
8-GPU H100 clusters, us-west (CISO: clean in the Californian evening) and eu-central (DE: cleaner around European
midday), with one batch job beside them.

* The service follows the cleaner forecast (no move threshold here): its replicas in us-west go to 0 in an hour whose
  forecast there is dirtier than in eu-central, and come back in a cleaner one; each scaling reaches the executor
  exactly once.
* Every configuration chosen keeps the latency target at the demand planned per replica (recomputed with the
  serving model); the GPUs the replicas hold are capacity the batch job never gets.
* What the replay served equals ServeGen's rate of the hour (recomputed from the trace, laid 14 days back) served
  with the serving model, and the service ledger values it at the actual intensity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecasting.data import service_load_hourly
from scheduling import loop
from scheduling.domain.fleet import load_fleet
from scheduling.executors.replay import ReplayExecutor
from scheduling.executors.service_log import apply_scalings, read_scalings
from scheduling.models.serving import at_load, key_of, serving_model
from scheduling.planning.serving import ServingPolicy
from scheduling.queue.intake import submit_file
from scheduling.queue.service_intake import submit_service_file
from scheduling.service import plan_forecasts
from warehouse.db import reader

DAY = pd.Timestamp("2021-07-15T00:00Z")
H = pd.Timedelta(hours=1)
HOURS = 26
FLEET = """version: 1
regions: {us-west: {zone: CISO}, eu-central: {zone: DE}}
gpu_models: {H100: {idle_w: 70, peak_w: 700, relative_speed: 3.0}}
clusters:
  - name: usw-h100
    region: us-west
    gpu_model: H100
    pue: 1.2
    node_groups: [{count: 1, gpus: 8, cpus: 112, memory_gib: 1024}]
  - name: euc-h100
    region: eu-central
    gpu_model: H100
    pue: 1.2
    node_groups: [{count: 1, gpus: 8, cpus: 112, memory_gib: 1024}]
"""
SERVICES = """services:
  - tenant: ml
    service_id: chat
    model: meta-llama/Llama-3.1-8B-Instruct
    gpu_models: [H100]
    latency_slo_ms: 100
    home_region: us-west
    allowed_regions: [us-west, eu-central]
    rate_source: servegen:language/m-small
"""
JOBS = """jobs:
  - tenant: t
    job_id: train
    submitted_at: 2021-07-15T00:00:00Z
    gpus: 8
    cpu_milli: 8000
    memory_mib: 32768
    job_type: ResNet-50 (batch size 64)
    est_duration_h: 4
    deadline: 2021-07-16T12:00:00Z
    home_region: us-west
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory, data_dir):
    from transforms.runner import build
    from warehouse.ingest import ingest

    tmp = tmp_path_factory.mktemp("services_loop")
    db = tmp / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
    assert build(select="+grid_hourly", warehouse_path=db, target_path=tmp / "target").ok
    (tmp / "fleet.yaml").write_text(FLEET)
    fleet = load_fleet(tmp / "fleet.yaml", data_dir=data_dir)
    (tmp / "services.yaml").write_text(SERVICES)
    (tmp / "jobs.yaml").write_text(JOBS)
    report = submit_service_file(tmp / "services.yaml", as_of=DAY, fleet=fleet, db_path=db, data_dir=data_dir)
    assert not report.rejected
    assert not submit_file(tmp / "jobs.yaml", fleet_path=tmp / "fleet.yaml", db_path=db, data_dir=data_dir).rejected
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp / "s", fleet=fleet,
                    executors=dict.fromkeys(fleet.names, executor),
                    serving=ServingPolicy(move_saving=0.0, yield_to_batch=False, hold_hours=None))  # fmt: skip
    results = loop.run_hours(DAY, HOURS, **settings)
    assert build(select="stg_services__usage+", warehouse_path=db, target_path=tmp / "target").ok
    with reader(db) as con:
        provisions = con.execute("SELECT * FROM plan.service_provisions ORDER BY plan_time").df()
        usage = con.execute("SELECT * FROM raw.service_usage ORDER BY hour_utc").df()
        ledger = con.execute("SELECT * FROM marts.service_ledger ORDER BY hour_utc").df()
        grid = con.execute(
            "SELECT region, hour_utc, carbon_intensity_direct_gco2_per_kwh AS ci FROM marts.grid_hourly"
        ).df()
    return dict(db=db, fleet=fleet, executor=executor, results=results, settings=settings, provisions=provisions,
                usage=usage, ledger=ledger, grid=grid, data_dir=data_dir)  # fmt: skip


def test_the_service_leaves_a_dirty_hour_and_returns_in_a_clean_one(served):
    p, fleet = served["provisions"], served["fleet"]
    assert p["cluster"].notna().all() and len(p) == HOURS
    zones = list(fleet.zones)
    for row in p.itertuples():
        F = plan_forecasts(fleet, row.plan_time, 24, served["db"], served["data_dir"]).at(row.plan_time, 1)[0][0]
        here, there = F[zones.index(row.zone)], F[zones.index("DE" if row.zone == "CISO" else "CISO")]
        assert here <= there + 1e-9, (row.plan_time, row.cluster, here, there)  # the cleaner forecast, every hour
    scalings = read_scalings(db_path=served["db"])
    usw = scalings[scalings["cluster"] == "usw-h100"].sort_values("scaled_at")
    downs, ups = usw[usw["replicas"] == 0], usw[(usw["replicas"] > 0) & (usw["from_replicas"] == 0)]
    assert len(downs) and len(ups), usw[["scaled_at", "from_replicas", "replicas"]]
    first_down = downs["scaled_at"].min()
    assert ups["scaled_at"].max() > first_down  # down in a dirty hour, then up again in a clean one
    assert (scalings["status"] == "sent").all()
    # carried out exactly once: the executor holds one scaling per logged row, and carrying them out again sends none
    assert len(served["executor"].serving.scalings()) == len(scalings)
    for plan_id in scalings["plan_id"].unique():
        again = apply_scalings(plan_id, served["executor"], served["db"])
        assert not again["sent"] and not again["reconciled"]


def test_every_configuration_keeps_the_target_and_its_gpus_are_taken(served):
    model = serving_model(served["data_dir"])
    p = served["provisions"]
    for row in p.itertuples():
        point = at_load(model, key_of(row.curve), row.planned_tokens_per_s / row.replicas, row.batch_cap)
        assert not point.saturated and point.latency_ms <= row.latency_slo_ms
        assert row.gpus == row.replicas * key_of(row.curve).num_gpus <= 8
    # the batch job's 8 GPUs never share a cluster-hour with the service's replicas
    runs = served["executor"].runs()
    assert len(runs) == 1
    run = runs.iloc[0]
    for t in pd.date_range(run["start_time"].floor("h"), run["true_end"] - H, freq="h"):
        held = p[(p["plan_time"] == t) & (p["cluster"] == run["cluster"])]
        assert held.empty, (t, run["cluster"])


def test_the_replay_serves_the_trace_and_the_ledger_values_it(served):
    model = serving_model(served["data_dir"])
    usage, ledger, grid = served["usage"], served["ledger"], served["grid"]
    assert len(usage) == HOURS - 1  # every hour before the last plan's, each in one cluster
    trace = service_load_hourly(served["data_dir"])
    trace = trace[trace["region"] == "language/m-small"].set_index("hour_utc")
    scalings = served["executor"].serving.scalings()
    for row in usage.itertuples():
        source = trace.loc[row.hour_utc - pd.Timedelta(days=14)]  # ServeGen's 14 days, laid from 2021-07-01
        demand = source["requests_per_s"] * source["mean_output_tokens"]
        assert row.demand_tokens_per_s == pytest.approx(demand)
        scaling = scalings[(scalings["cluster"] == row.cluster) & (scalings["scaled_at"] <= row.hour_utc)].iloc[-1]
        point = at_load(model, key_of(scaling["curve"]), demand / scaling["replicas"], scaling["batch_cap"])
        assert row.energy_kwh == pytest.approx(scaling["replicas"] * point.power_w / 1000.0)
        assert row.tokens == pytest.approx(scaling["replicas"] * point.served_tokens_per_s * 3600.0)
    ci = grid.set_index(["region", "hour_utc"])["ci"]
    for row in ledger.itertuples():
        u = usage[usage["hour_utc"] == row.hour_utc].iloc[0]
        expected = u["energy_kwh"] * 1.2 * ci[(u["zone"], row.hour_utc)] / 1000.0
        assert row.kgco2e == pytest.approx(expected)
        assert row.g_per_1k_tokens == pytest.approx(1e6 * expected / u["tokens"])
    assert ledger["slo_met"].all()
    assert np.isfinite(ledger["static_kgco2e"]).all() and (ledger["static_gpus"] >= 1).all()


def test_running_an_hour_again_changes_nothing(served):
    db = served["db"]
    with reader(db) as con:
        before = con.execute("SELECT * FROM plan.service_provisions ORDER BY plan_id, service").df()
        usage = con.execute("SELECT * FROM raw.service_usage ORDER BY hour_utc").df()
    loop.run_hour(DAY + 12 * H, **served["settings"])
    with reader(db) as con:
        after = con.execute("SELECT * FROM plan.service_provisions ORDER BY plan_id, service").df()
        usage_after = con.execute("SELECT * FROM raw.service_usage ORDER BY hour_utc").df()
    pd.testing.assert_frame_equal(before, after)
    pd.testing.assert_frame_equal(usage, usage_after)


def test_the_carbon_pages_show_the_service(served):
    from fastapi.testclient import TestClient

    from ui.app import create_app

    client = TestClient(create_app(lambda: None, db_path=served["db"]), root_path="/carbon")
    listed = client.get("/carbon/api/services").json()
    assert [s["service"] for s in listed["services"]] == ["ml/chat"]
    ledger = served["ledger"]
    row = listed["services"][0]
    assert row["service_hours"] == len(ledger)
    assert row["g_per_1k_tokens"] == pytest.approx(1e6 * ledger["kgco2e"].sum() / ledger["tokens"].sum(), abs=1e-6)
    one = client.get("/carbon/api/services/ml/chat").json()
    assert len(one["hours"]) == len(ledger) and one["provisions"][0]["explanation"]
    html = client.get("/carbon/services/ml/chat").text
    assert "Carbon per 1k output tokens" in html and "<polyline" in html and 'id="hours"' in html
    assert 'href="/carbon/services/ml/chat"' in client.get("/carbon/services").text


def test_a_service_whose_rate_source_cannot_be_read_leaves_the_others_planned(tmp_path, data_dir):
    from scheduling.service_hours import demand

    services = pd.DataFrame(
        [
            {"service": "ml/gone", "tenant": "ml", "service_id": "gone", "rate_source": f"file:{tmp_path}/none.csv",
             "rate_scale": 1.0},
            {"service": "ml/chat", "tenant": "ml", "service_id": "chat", "rate_source": "servegen:language/m-small",
             "rate_scale": 1.0},
        ]
    )  # fmt: skip
    got = demand(services, DAY + 12 * H, data_dir=data_dir).set_index("service")
    assert np.isnan(got.loc["ml/gone", "forecast_p90"]) and got.loc["ml/gone", "wanted"] == 0.0
    assert got.loc["ml/chat", "wanted"] > 0 and np.isfinite(got.loc["ml/chat", "forecast_p90"])


def test_yielding_to_batch_leaves_the_gpus_the_last_plan_starts_jobs_on(served, tmp_path):
    """With `yield_to_batch`, a service skips a cluster whose GPUs the previous hour's plan starts batch jobs on in
    this hour while another cluster can serve it, and still gets served when every cluster is claimed; `hold_hours`
    bounds how long the batch plan holds the replicas."""
    import shutil

    from scheduling.service_hours import batch_starts, plan_service_hour
    from warehouse.db import writer

    db = tmp_path / "warehouse.duckdb"
    shutil.copyfile(served["db"], db)
    T = DAY + HOURS * H
    fleet, executors = served["fleet"], served["settings"]["executors"]

    def cluster_of(policy):
        out = plan_service_hour(T, "yield-test", fleet, executors, None, horizon_hours=24, db_path=db,
                                data_dir=served["data_dir"], policy=policy)  # fmt: skip
        return out["provisions"].set_index("service").loc["ml/chat", "cluster"], out["rows"]

    free_choice, _ = cluster_of(ServingPolicy(move_saving=0.0, yield_to_batch=False))
    other = next(n for n in fleet.names if n != free_choice)
    with reader(db) as con:
        previous = con.execute(
            "SELECT plan_id FROM plan.plans WHERE plan_time = ?", [(T - H).to_pydatetime()]
        ).fetchone()
    assert previous is not None

    def claim(cluster: str) -> None:
        with writer(db) as con:
            con.execute(
                "INSERT INTO plan.assignments (plan_id, job_id, cluster, start_time, end_time, gpu_count, gpu_milli, "
                "status) VALUES (?, ?, ?, ?, ?, 8, 1000, 'tentative')",
                [previous[0], f"t/batch-{cluster}", cluster, T.to_pydatetime(), (T + 4 * H).to_pydatetime()],
            )

    claim(free_choice)
    assert batch_starts(T, db)[free_choice] >= 8
    yielding = ServingPolicy(move_saving=0.0, yield_to_batch=True, hold_hours=1)
    moved, rows = cluster_of(yielding)
    assert moved == other
    assert (pd.to_datetime(rows["end_time"], utc=True) == T + H).all()  # held for one hour only
    claim(other)
    served_anyway, _ = cluster_of(yielding)
    assert served_anyway == free_choice  # every cluster claimed: the cheapest free GPUs, as without yielding
