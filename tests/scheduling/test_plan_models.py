"""The hourly plan loads the latest *good* registered power model and predictor (cut-off at or before the planning
time), skips failed versions and unloadable artifacts, falls back (flagged) without one, and records the versions
it used in every explanation record."""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import pytest

PLAN_TIME = "2021-07-15T12:00Z"


def _plan(db, data_dir, tmp_path, dry_run=False):
    """The loop's plan of PLAN_TIME over a day of trace jobs submitted to the queue; its summary."""
    from scheduling import loop
    from scheduling.queue.intake import submit_file
    from scheduling.queue.trace import write_trace_file
    from scheduling.service import plan_fleet

    jobs = tmp_path / "jobs.yaml"
    write_trace_file(jobs, "2021-07-15", 30, plan_fleet(None, data_dir), data_dir=data_dir)
    submit_file(jobs, db_path=db, data_dir=data_dir)
    ctx = loop.context(PLAN_TIME, db_path=db, data_dir=data_dir, schedule_root=tmp_path / "schedules")
    return loop.plan(ctx, dry_run=dry_run)[1]


@pytest.fixture(scope="module")
def profiles(data_dir):
    from scheduling.models.measured import energy_profiles_from_files

    if not (data_dir / "energy" / "zeus" / "zeus_power_limit_sweep.csv").exists():
        pytest.skip("DATA_DIR lacks energy/zeus")
    return energy_profiles_from_files(data_dir)


@pytest.fixture(scope="module")
def predictor(data_dir):
    import torch

    from scheduling.models.measured import throughput_from_files
    from scheduling.models.performance.predictor import PerformancePredictor
    from scheduling.models.performance.prior import PriorConfig
    from scheduling.models.performance.refiner import RefinerConfig

    torch.set_num_threads(1)
    tiny = PriorConfig(n_models=1, epochs=150, hidden=32, dim=8, lr=1e-2)
    return PerformancePredictor.train(throughput_from_files(data_dir), tiny, RefinerConfig(epochs=20))


@pytest.fixture()
def registry_db(tmp_warehouse, tmp_path, monkeypatch, profiles, predictor):
    """Versions of both models around PLAN_TIME: good (07-01), corrupted good (07-08), failed (07-10, the newest
    before the plan), good but after the planning time (07-20)."""
    from scheduling.models.power import PowerModel
    from scheduling.models.registered import POWER_NAME, POWER_TARGET, PREDICTOR_NAME, PREDICTOR_TARGET
    from warehouse import model_registry as registry

    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    # the good power version lacks the RTX 6000 sweep, so options built from it are recognisably its own
    good_power = PowerModel(profiles[profiles.gpu_type != "rtx6000"])
    versions = {}
    for name, target, model in ((POWER_NAME, POWER_TARGET, good_power), (PREDICTOR_NAME, PREDICTOR_TARGET, predictor)):
        good = registry.register_model(model, name, target, "2021-07-01T00:00Z", db_path=tmp_warehouse)
        corrupt = registry.register_model(model, name, target, "2021-07-08T00:00Z", db_path=tmp_warehouse)
        victim = sorted(p for p in os.listdir(corrupt.artifact_path) if p != registry.MANIFEST)[0]
        with open(os.path.join(corrupt.artifact_path, victim), "ab") as handle:
            handle.write(b"tampered")
        failed = registry.register_model(
            None,
            name,
            target,
            "2021-07-10T00:00Z",
            status="failed",
            metrics={"error": "RuntimeError: training diverged"},
            db_path=tmp_warehouse,
        )
        future = registry.register_model(model, name, target, "2021-07-20T00:00Z", db_path=tmp_warehouse)
        versions[name] = {
            "good": good.version,
            "corrupt": corrupt.version,
            "failed": failed.version,
            "future": future.version,
        }
    return tmp_warehouse, versions


def test_resolve_registered_skips_failed_corrupt_and_future(registry_db):
    from scheduling.models.registered import POWER_NAME, resolve_registered

    db, versions = registry_db
    model, info = resolve_registered(POWER_NAME, as_of=PLAN_TIME, db_path=db)
    assert info["version"] == versions[POWER_NAME]["good"] and info["source"] == "registry"
    assert [s["version"] for s in info["skipped"]] == [versions[POWER_NAME]["corrupt"]]
    assert "rtx6000" not in set(model.profiles.gpu_type)
    _, newest = resolve_registered(POWER_NAME, db_path=db)  # no cut-off: the 07-20 version
    assert newest["version"] == versions[POWER_NAME]["future"]
    none, early = resolve_registered(POWER_NAME, as_of="2021-06-01", db_path=db)
    assert none is None and early["version"] is None and early["reason"]


def test_plan_uses_and_records_the_latest_good_versions(registry_db, data_dir, tmp_path):
    from scheduling import service as plan_service
    from scheduling.models.registered import POWER_NAME, PREDICTOR_NAME, resolve_registered
    from scheduling.planning.power_options import load_power_table
    from warehouse.db import reader

    db, versions = registry_db
    summary = _plan(db, data_dir, tmp_path)
    assert summary["explanations"] >= 1
    models = summary["models"]
    assert models["power"]["version"] == versions[POWER_NAME]["good"] and models["power"]["fallback"] is False
    assert models["power"]["skipped"] == [versions[POWER_NAME]["corrupt"]]
    assert models["predictor"]["version"] == versions[PREDICTOR_NAME]["good"]
    assert models["predictor"]["fallback"] is False
    with reader(db) as con:
        records = [
            json.loads(r[0])
            for r in con.execute(
                "SELECT record::VARCHAR FROM plan.explanations WHERE plan_id = ?", [summary["plan_id"]]
            ).fetchall()
        ]
    assert len(records) == summary["explanations"]
    assert {r["models"]["power"]["version"] for r in records} == {versions[POWER_NAME]["good"]}
    assert {r["models"]["predictor"]["version"] for r in records} == {versions[PREDICTOR_NAME]["good"]}

    # used, not only recorded: the options come from the registered sweep (no RTX 6000 -> the T4 keeps only its
    # default limit), the speeds from the registered predictor
    fleet = plan_service.plan_fleet(None, data_dir)
    table = load_power_table(fleet, data_dir=data_dir, db_path=db, as_of=PLAN_TIME)
    assert table.model_info["version"] == versions[POWER_NAME]["good"]
    assert len(table.options("T4")) == 1 and len(table.options("V100M32")) > 1
    fallback = load_power_table(fleet, data_dir=data_dir, db_path=tmp_path / "empty.duckdb", as_of=PLAN_TIME)
    assert fallback.model_info["fallback"] is True and len(fallback.options("T4")) > 1
    jobs = pd.DataFrame({"job_type": ["ResNet-50 (batch size 64)", "LM (batch size 20)"]})
    speed, info = plan_service.plan_speed_model(jobs, PLAN_TIME, db, data_dir)
    assert info["version"] == versions[PREDICTOR_NAME]["good"]
    model, _ = resolve_registered(PREDICTOR_NAME, as_of=PLAN_TIME, db_path=db)
    expected = model.isolated(jobs, "k80") / model.isolated(jobs, "v100")
    got = [speed.ratio["k80"][t] for t in jobs.job_type]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_plan_without_registered_models_falls_back_flagged(tmp_warehouse, data_dir, tmp_path):

    summary = _plan(tmp_warehouse, data_dir, tmp_path, dry_run=True)
    for kind in ("power", "predictor"):
        ref = summary["models"][kind]
        assert ref["version"] is None and ref["fallback"] is True and ref["reason"]
    assert summary["models"]["predictor"]["source"] == "gavel-isolated-throughputs"


def test_simulation_uses_the_power_model_registered_by_its_start(registry_db, data_dir):
    """A replayed period must not use a model trained after it started (07-20 is newer than the 07-15 start)."""
    from scheduling.evaluation.scenario import build_scenario
    from scheduling.models.registered import POWER_NAME

    db, versions = registry_db
    sc = build_scenario(
        start=PLAN_TIME,
        days=1,
        n_jobs=20,
        regions=2,
        load=0.5,
        forecasts="naive",
        grid_source="files",
        tail_days=1,
        db_path=db,
        data_dir=data_dir,
    )
    assert sc.config["power_options"] == f"registry:{POWER_NAME}@{versions[POWER_NAME]['good']}"
