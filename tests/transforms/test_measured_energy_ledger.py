"""The ledger values a job's energy from its own meter: a CodeCarbon emissions.csv and a ZeusMonitor log loaded by the
telemetry source, keyed to planner job ids, become the measured energy of those jobs' attempts in marts.job_runs and
marts.carbon_ledger (an executor's own report wins; jobs without either keep the power model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scheduling.executors.events import load_events
from scheduling.output.ledger import LEDGER_SELECT, ledger, write_ledger_report
from scheduling.output.plan_store import StoredPlan, write_plan
from transforms.runner import build
from warehouse.db import reader
from warehouse.ingest import ingest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "telemetry"
CODECARBON = FIXTURES / "codecarbon_node-d.csv"
ZEUS = FIXTURES / "zeus_node-e.csv"
T0 = pd.Timestamp("2021-07-15T12:00:00Z")
# planner job id -> (started, ended) minutes after T0, energy the executor reported (kWh)
JOBS = {
    "lab/resnet50-cc": (5, 57, None),  # CodeCarbon, 4 flushes
    "lab/vit-zeus": (10, 47, None),  # Zeus, two windows x 2 GPUs
    "lab/plain": (0, 30, None),  # no meter: power model
    "lab/reported": (0, 20, 0.9),  # the executor's report wins over the Zeus log below
}


def _plan() -> None:
    rows = []
    for job in JOBS:
        rows.append(
            {
                "job_id": job,
                "cluster": "fra-a100",
                "region": "eu-central",
                "zone": "DE",
                "start_time": T0,
                "end_time": T0 + pd.Timedelta(hours=1),
                "submit_time": T0 - pd.Timedelta(minutes=30),
                "deadline": T0 + pd.Timedelta(hours=6),
                "power_limit_w": 400.0,
                "draw_kw": 0.5,
                "transfer_kwh": 0.0,
                "home_cluster": "fra-a100",
                "home_zone": "DE",
                "run_now_kw": 0.5,
                "run_now_duration_h": 1.0,
                "expected_energy_kwh": 0.5,
                "expected_kgco2e": 0.2,
                "status": "assigned",
            }
        )
    write_plan(StoredPlan(plan_time=T0, policy="carbon", forecast_version=None, assignments=pd.DataFrame(rows)))


def _events(plan_id: str) -> pd.DataFrame:
    rows = []
    for job, (start, end, kwh) in JOBS.items():
        tenant, job_id = job.split("/")
        base = {"tenant": tenant, "job_id": job_id, "planner_job_id": job, "plan_id": plan_id, "attempt": 1}
        base |= {"cluster": "fra-a100", "node": "node-d", "executor_ref": job_id}
        rows.append(base | {"event": "dispatched", "event_time": T0})
        rows.append(base | {"event": "started", "event_time": T0 + pd.Timedelta(minutes=start)})
        rows.append(base | {"event": "finished", "event_time": T0 + pd.Timedelta(minutes=end), "energy_kwh": kwh})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def ledger_warehouse(tmp_path_factory, data_dir) -> Path:
    root = tmp_path_factory.mktemp("metered_ledger")
    db = root / "warehouse.duckdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WAREHOUSE_PATH", str(db))
        ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
        assert build(select="+grid_hourly", warehouse_path=db, target_path=root / "target").ok
        meters = root / "data" / "telemetry" / "node-d"
        meters.mkdir(parents=True)
        shutil.copy(CODECARBON, meters / "emissions.csv")
        (meters / "emissions.json").write_text(json.dumps({"tz": "Europe/Berlin", "host": "node-d"}))
        shutil.copy(ZEUS, meters / "zeus.csv")
        shutil.copy(ZEUS, meters / "zeus-copy.csv")  # the same log twice: counted once
        (meters / "reported.csv").write_text(
            "start_time,window_name,elapsed_time,gpu0_energy\n"
            f"{(T0 + pd.Timedelta(minutes=1)).timestamp()},lab/reported,1000.0,500000.0\n"
        )
        ingest(["telemetry"], data_dir=root / "data", db_path=db, progress=False)
        _plan()
        with reader(db) as con:
            (plan_id,) = con.execute("SELECT plan_id FROM plan.plans").fetchone()
        load_events(_events(plan_id), "replay", T0, T0 + pd.Timedelta(hours=1), db_path=db)
        result = build(select=list(LEDGER_SELECT), warehouse_path=db, target_path=root / "target")
        assert result.ok, result.output[-3000:]
    return db


def _runs(db: Path) -> dict[str, tuple]:
    with reader(db) as con:
        rows = con.execute(
            "SELECT tenant || '/' || job_id, energy_kwh, energy_source, energy_meter, actual_runtime_h, "
            "realized_kgco2e, mean_ci_gco2_per_kwh FROM marts.job_runs"
        ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_job_runs_take_the_jobs_own_meters_as_measured_energy(ledger_warehouse):
    runs = _runs(ledger_warehouse)
    emissions = pd.read_csv(CODECARBON)
    resnet_kwh = emissions.loc[emissions["project_name"] == "lab/resnet50-cc", "energy_consumed"].iloc[-1]
    zeus = pd.read_csv(ZEUS)
    vit_kwh = zeus[["gpu0_energy", "gpu1_energy"]].to_numpy().sum() / 3.6e6
    with reader(ledger_warehouse) as con:  # the run (12:05-12:57) lies in one hour: DE's intensity then
        (de_noon,) = con.execute(
            "SELECT carbon_intensity_direct_gco2_per_kwh FROM marts.grid_hourly WHERE region = 'DE' AND hour_utc = ?",
            [T0],
        ).fetchone()
    kwh, source, meter, _, kg, ci = runs["lab/resnet50-cc"]
    assert (source, meter) == ("measured", "codecarbon") and kwh == pytest.approx(resnet_kwh, rel=1e-12)
    assert ci == pytest.approx(de_noon, rel=1e-12)
    assert kg == pytest.approx(resnet_kwh * de_noon / 1000.0, rel=1e-9)  # the measured energy at the zone's intensity
    kwh, source, meter, *_ = runs["lab/vit-zeus"]
    assert (source, meter) == ("measured", "zeus") and kwh == pytest.approx(vit_kwh, rel=1e-12)
    kwh, source, meter, runtime_h, *_ = runs["lab/plain"]
    assert (source, meter) == ("power_model", None) and kwh == pytest.approx(0.5 * runtime_h)
    kwh, source, meter, *_ = runs["lab/reported"]
    assert (source, meter, kwh) == ("measured", "executor", 0.9)


def test_carbon_ledger_shows_the_meter(ledger_warehouse):
    with reader(ledger_warehouse) as con:
        ledger = dict(
            con.execute(
                "SELECT tenant || '/' || job_id, (energy_source, energy_meter) FROM marts.carbon_ledger"
            ).fetchall()
        )
        daily = con.execute("SELECT sum(jobs), sum(measured_energy_jobs) FROM marts.carbon_ledger_daily").fetchone()
        metered = con.execute(
            "SELECT tenant || '/' || job_id, energy_meter, meter_readings "
            "FROM intermediate.int_jobs__metered_energy ORDER BY 1"
        ).fetchall()
    assert ledger == {
        "lab/resnet50-cc": ("measured", "codecarbon"),
        "lab/vit-zeus": ("measured", "zeus"),
        "lab/plain": ("power_model", None),
        "lab/reported": ("measured", "executor"),
    }
    assert daily == (4, 3)
    # the Zeus log loaded under two names counts once: 2 windows x 2 GPUs
    assert metered == [("lab/reported", "zeus", 1), ("lab/resnet50-cc", "codecarbon", 4), ("lab/vit-zeus", "zeus", 4)]


def test_the_ledger_command_reports_the_measured_jobs(ledger_warehouse, tmp_path):
    book = ledger("2021-07-15", "2021-07-16", db_path=ledger_warehouse)
    assert book.totals["jobs"] == 4 and book.totals["measured_energy_pct"] == 75.0
    meters = dict(zip(book.jobs["tenant"] + "/" + book.jobs["job_id"], book.jobs["energy_meter"]))
    assert meters["lab/resnet50-cc"] == "codecarbon" and meters["lab/vit-zeus"] == "zeus"
    assert (write_ledger_report(book, tmp_path / "report")).exists()
