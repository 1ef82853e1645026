"""Runtime feedback: finished runs are observations for the predictor's refiner; speeds relative to the V100
reference follow the refined throughputs, and without observations they are the registered version's ratios."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.fleet import GpuModel
from scheduling.domain.jobs import SpeedModel
from scheduling.models.performance.runs import feedback_summary, run_observations

X = "ResNet-50 (batch size 64)"
Y = "LM (batch size 20)"
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
