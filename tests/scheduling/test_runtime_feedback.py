"""Runtime feedback: finished runs are observations for the predictor's refiner, and the next plan's run-time
estimates use them.

The end-to-end test runs the operating loop on a one-cluster V100 fleet with the replay executor, a registered tiny
predictor and jobs submitted through the intake. One job type really runs 30 % slower than its estimate (the replay
truth file); after 20 or more of its runs have finished, the next plan's estimate for a new job of that type is
within 10 % of the truth (it was 30 % off without the runs), the explanation names the refiner state used, and the
plan starts that job earlier: its true run time leaves less room before the deadline. The replay truth is the run
time whatever the power limit, so the V100s here run at their default limit only (a registered power model without
V100 sweeps): the truth is then the run time at the limit the plan chose, as a real executor would report it."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import shutil

import duckdb
import numpy as np
import pandas as pd
import pytest

from scheduling.domain.fleet import GpuModel
from scheduling.domain.jobs import SpeedModel
from scheduling.models.performance.runs import feedback_summary, run_observations

X = "ResNet-50 (batch size 64)"  # really runs 30 % slower than estimated
Y = "LM (batch size 20)"  # runs as estimated
SLOWDOWN = 0.7
X_EST_H, Y_EST_H = 1.5, 1.0
START = pd.Timestamp("2021-07-15T04:00Z")
MODELS = {
    "V100": GpuModel("V100", 40, 300, gavel="v100"),
    "P100": GpuModel("P100", 30, 250, gavel="p100"),
    "T4": GpuModel("T4", 10, 70, relative_speed=0.5),
}


# ------------------------------------------------------------------------------------------------ pure parts


def _runs(rows):
    frame = pd.DataFrame(rows, columns=["job_id", "job_type", "gpu_model", "speed", "planned_h", "actual_h", "h"])
    frame["finished_at"] = pd.Timestamp("2021-07-15T00:00Z") + pd.to_timedelta(frame.pop("h"), unit="h")
    return frame


def test_run_observations_turn_runs_into_isolated_throughputs():
    runs = _runs(
        [
            ("t/a", X, "V100", 1.0, 2.0, 2.5, 3),  # realized speed 0.8 on a V100
            ("t/b", X, "P100", 0.5, 2.0, 1.0, 4),  # 1.0 relative to the reference, on a P100
            ("t/c", X, "T4", 0.5, 2.0, 4.0, 5),  # 0.25 on a T4 (relative speed 0.5) = 0.5 as a V100
            ("t/d", X, "A100", 1.0, 1.0, 1.0, 6),  # a GPU model the fleet does not know
            ("t/e", Y, "V100", np.nan, 1.0, 1.0, 7),  # no speed recorded
            ("t/f", Y, "V100", 1.0, 1.0, 0.0, 8),  # no run time
            ("t/g", "unknown type", "V100", 1.0, 1.0, 1.0, 9),  # no T0
        ]
    )
    obs = run_observations(runs, {X: 10.0, Y: 4.0}, MODELS)
    assert list(obs["job_id"]) == ["t/a", "t/b", "t/c"]
    assert list(obs["gpu_type"]) == ["v100", "p100", "v100"]
    np.testing.assert_allclose(obs["realized_speed"], [0.8, 1.0, 0.25])
    np.testing.assert_allclose(obs["steps_per_s"], [8.0, 10.0, 5.0])
    assert obs["partner_job_type"].isna().all()
    assert feedback_summary(obs) == {"runs": 3, "job_types": 1, "latest_finished_at": "2021-07-15T05:00:00Z"}
    assert feedback_summary(obs.iloc[:0]) == {"runs": 0, "job_types": 0, "latest_finished_at": None}


def test_run_observations_keep_the_newest_runs_per_job_type_and_gpu_type():
    rows = [(f"t/x{i:02d}", X, "V100" if i % 2 else "T4", 1.0, 1.0, 1.0, i) for i in range(10)]
    rows += [(f"t/y{i:02d}", Y, "V100", 1.0, 1.0, 1.0, i) for i in range(3)]
    obs = run_observations(_runs(rows), {X: 1.0, Y: 1.0}, MODELS, per_key=2)
    # V100 and T4 both count as v100 for the refiner: X keeps its two newest runs of either, Y its two newest
    assert sorted(obs["job_id"]) == ["t/x08", "t/x09", "t/y01", "t/y02"]
    assert obs["finished_at"].is_monotonic_increasing


def test_speed_model_absolute_table_scales_every_gpu_by_the_job_types_v100_speed():
    fleet_models = MODELS
    table = pd.DataFrame({"k80": [0.2, 0.3], "p100": [0.6, 0.9], "v100": [1.0, 0.75]}, index=[Y, X])
    model = SpeedModel(table=table, absolute=True)
    assert model.speed(Y, fleet_models["V100"]) == 1.0 and model.speed(Y, fleet_models["T4"]) == 0.5
    assert model.speed(X, fleet_models["V100"]) == 0.75
    assert model.speed(X, fleet_models["P100"]) == pytest.approx(0.9)
    assert model.speed(X, fleet_models["T4"]) == pytest.approx(0.5 * 0.75)
    assert model.speed("A3C", fleet_models["V100"]) == 1.0  # a job type the table lacks: no feedback
    # a throughput table (the measured fallback) only counts through its ratios: V100 stays the reference
    raw = SpeedModel(table=table * 40.0)
    assert raw.speed(X, fleet_models["V100"]) == 1.0 and raw.speed(X, fleet_models["P100"]) == pytest.approx(1.2)


# ------------------------------------------------------------------------------------------------ a trained predictor


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


def test_without_runs_the_speeds_are_the_registered_versions_ratios(predictor, data_dir):
    """No observation: the absolute table gives exactly the speeds of the version's throughput ratios (plans are
    what they were without feedback), and the cached registered object is never changed."""
    from scheduling.models.registered import predictor_speed_table
    from scheduling.service import plan_fleet

    fleet = plan_fleet(None, data_dir)
    types = pd.Series([X, Y, "A3C", "Transformer (batch size 64)", X])
    table = predictor_speed_table(predictor, types)
    assert (table["v100"] == 1.0).all()
    raw = pd.DataFrame({g: predictor.isolated(pd.DataFrame({"job_type": table.index}), g) for g in table.columns})
    raw.index = table.index
    assert np.array_equal(
        SpeedModel(table=table, absolute=True).matrix(types, fleet), SpeedModel(table=raw).matrix(types, fleet)
    )
    before = len(predictor.feedback)
    obs = pd.DataFrame({"job_type": [X], "gpu_type": ["v100"], "partner_job_type": [None], "steps_per_s": [1.0]})
    refined = predictor_speed_table(predictor, types, obs)
    assert len(predictor.feedback) == before and refined.loc[X, "v100"] != 1.0


# ------------------------------------------------------------------------------------------------ the loop


def _fleet(truth, data_dir):
    from scheduling.domain.fleet import fleet_from_spec

    spec = {
        "version": 1,
        "regions": {"us-west": {"zone": "CISO"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [
            {
                "name": "usw-v100",
                "region": "us-west",
                "gpu_model": "V100",
                "pue": 1.15,
                "node_groups": [{"count": 4, "name_prefix": "v100x8", "gpus": 8, "cpus": 64, "memory_gib": 512}],
                "executor": {"kind": "replay", "truth": str(truth), "failure_rate": 0.1, "seed": 0},
            }
        ],
    }
    return fleet_from_spec(spec, "runtime-feedback fleet", data_dir=data_dir)


def _job(job_id, job_type, est_h, submitted_at, **fields):
    return {
        "tenant": "lab",
        "job_id": job_id,
        "submitted_at": submitted_at.isoformat(),
        "gpus": 1,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "job_type": job_type,
        "est_duration_h": est_h,
        "home_region": "us-west",
        **fields,
    }


def _truth_h(job_id, job_type, est_h):
    """X: 30 % slower than estimated, with a run-to-run spread (lognormal, sigma 0.1); Y: as estimated."""
    from scheduling.executors.replay import noise_factor

    return est_h / SLOWDOWN * noise_factor(job_id, 0.1, seed=1) if job_type == X else est_h


def _batch(name, n_x, n_y, submitted_at):
    jobs = [_job(f"{name}-x{i:02d}", X, X_EST_H, submitted_at, flexibility=1.0) for i in range(n_x)]
    jobs += [_job(f"{name}-y{i:02d}", Y, Y_EST_H, submitted_at, flexibility=1.0) for i in range(n_y)]
    return jobs


@pytest.fixture()
def registered(tmp_warehouse, tmp_path, monkeypatch, predictor, data_dir):
    """The tiny predictor and a power model without V100 sweeps (V100s at their default limit), registered."""
    from scheduling.models.measured import energy_profiles_from_files
    from scheduling.models.power import PowerModel
    from scheduling.models.registered import POWER_NAME, POWER_TARGET, PREDICTOR_NAME, PREDICTOR_TARGET
    from warehouse import model_registry as registry

    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    profiles = energy_profiles_from_files(data_dir)
    power = PowerModel(profiles[profiles["gpu_type"].str.lower() != "v100"])
    registry.register_model(predictor, PREDICTOR_NAME, PREDICTOR_TARGET, "2021-07-01T00:00Z", db_path=tmp_warehouse)
    registry.register_model(power, POWER_NAME, POWER_TARGET, "2021-07-01T00:00Z", db_path=tmp_warehouse)
    return tmp_warehouse


def test_finished_runs_correct_the_next_plans_estimates(registered, tmp_path, data_dir):
    from scheduling import loop
    from scheduling.executors.runs import finished_runs
    from scheduling.models.performance.runs import reference_throughput
    from scheduling.models.registered import PREDICTOR_NAME, predictor_speed_table, resolve_registered
    from scheduling.planning.power_options import load_power_table
    from scheduling.queue.intake import fleet_facts, submit_mappings
    from scheduling.service import make_plan

    db = registered
    second, T = START + pd.Timedelta(hours=4), START + pd.Timedelta(hours=8)
    batches = [_batch("a", 12, 3, START), _batch("b", 14, 3, second)]
    new_job = _job("new-x", X, X_EST_H, T, deadline=(T + pd.Timedelta(hours=5)).isoformat())
    truth = tmp_path / "truth.csv"
    every = [j for jobs in batches for j in jobs] + [new_job]
    pd.DataFrame(
        {
            "job_id": [f"lab/{j['job_id']}" for j in every],
            "true_duration_h": [_truth_h(j["job_id"], j["job_type"], j["est_duration_h"]) for j in every],
        }
    ).to_csv(truth, index=False)
    fleet = _fleet(truth, data_dir)
    assert len(load_power_table(fleet, db_path=db, as_of=START).options("V100")) == 1
    facts = fleet_facts(fleet=fleet, data_dir=data_dir)
    settings = {"fleet": fleet, "db_path": db, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}

    def submit(jobs, at):
        report = submit_mappings(jobs, source=f"test@{at}", as_of=at, facts=facts, db_path=db, data_dir=data_dir)
        assert not report.rejected, report.rejected[:1]

    submit(batches[0], START)
    loop.run_hours(START, 4, **settings)
    submit(batches[1], second)
    loop.run_hours(second, 4, **settings)

    runs = finished_runs(T, db_path=db)
    x_runs = runs[runs["job_type"] == X]
    assert len(x_runs) >= 20 and (runs["finished_at"] < T).all()
    # a run that ends on the hour belongs to the next hour's sync window: the plan of that hour does not see it, now
    # or when it is replayed later
    on_hour = runs.loc[runs["finished_at"] == runs["finished_at"].dt.floor("h")].iloc[0]
    assert on_hour["job_type"] == Y
    assert on_hour["job_id"] not in set(finished_runs(on_hour["finished_at"], db_path=db)["job_id"])
    later_hour = on_hour["finished_at"] + pd.Timedelta(hours=1)
    assert on_hour["job_id"] in set(finished_runs(later_hour, db_path=db)["job_id"])
    with duckdb.connect(str(db), read_only=True) as con:
        failed = {
            r[0] for r in con.execute("SELECT planner_job_id FROM raw.job_events WHERE event = 'failed'").fetchall()
        }
    assert failed and not failed & set(runs["job_id"])  # failed runs are no observation
    # the plans that dispatched the second batch already used the first batch's runs
    later = x_runs[x_runs["job_id"].str.startswith("lab/b-")]
    assert len(later) and (later["speed"] < 0.8).all()

    # the next plan, with a new job of type X; the same plan on a copy of the warehouse without the runs
    submit([new_job], T)
    ctx = loop.context(T, **settings)
    pending, running, arrived = loop.inputs(ctx)
    blind = tmp_path / "no-runs.duckdb"
    shutil.copy(db, blind)
    with duckdb.connect(str(blind)) as con:
        con.execute("DELETE FROM raw.job_events")
    without, _ = make_plan(
        T, jobs=pending, running=running, arrived=arrived, fleet=fleet, db_path=blind, data_dir=data_dir
    )
    with_runs, summary, _ = loop.plan(ctx)
    rows = {k: p.assignments.set_index("job_id").loc["lab/new-x"] for k, p in (("runs", with_runs), ("none", without))}
    truth_h = X_EST_H / SLOWDOWN
    planned = {k: (r["end_time"] - r["start_time"]) / pd.Timedelta(hours=1) for k, r in rows.items()}
    errors = {k: abs(v - truth_h) / truth_h for k, v in planned.items()}
    assert errors["none"] == pytest.approx(1 - SLOWDOWN, abs=0.01) and errors["runs"] <= 0.10, errors
    assert rows["runs"]["speed"] == pytest.approx(X_EST_H / planned["runs"]) and rows["none"]["speed"] == 1.0

    # the explanation names the refiner state used
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute(
            "SELECT record::VARCHAR FROM plan.explanations WHERE plan_id = ? AND job_id = 'lab/new-x'",
            [summary["plan_id"]],
        ).fetchone()[0]
    feedback = json.loads(stored)["models"]["predictor"]["feedback"]
    assert feedback["runs"] == len(runs) >= 20 and feedback["job_types"] == 2
    assert feedback["latest_finished_at"] == runs["finished_at"].max().strftime("%Y-%m-%dT%H:%M:%SZ")
    assert without.explanation("lab/new-x")["models"]["predictor"]["feedback"]["runs"] == 0

    # the choice: the intensity falls over the next hours; without the runs the plan waits longer for it, with them
    # the job (really 2.1 h, not 1.5 h) starts earlier to end by its deadline
    assert rows["runs"]["start_time"] < rows["none"]["start_time"], rows
    assert rows["runs"]["end_time"] <= pd.Timestamp(new_job["deadline"])

    # the estimate of X after its first n runs (and of Y, which runs as estimated, after all of its runs)
    predictor, _ = resolve_registered(PREDICTOR_NAME, as_of=T, db_path=db)
    obs = run_observations(runs, reference_throughput(predictor, runs["job_type"]), fleet.gpu_models)
    by_n = {}
    for n in (1, 5, 10, 20):
        part = pd.concat([obs[obs["job_type"] == X].iloc[:n], obs[obs["job_type"] == Y]])
        speed = predictor_speed_table(predictor, [X, Y], part)
        by_n[n] = abs(X_EST_H / speed.loc[X, "v100"] - truth_h) / truth_h
        assert speed.loc[Y, "v100"] == pytest.approx(1.0, rel=0.05)
    assert by_n[20] <= 0.10, by_n
