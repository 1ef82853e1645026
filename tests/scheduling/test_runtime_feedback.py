"""Runtime feedback: finished runs are observations for the predictor's refiner."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd

from scheduling.domain.fleet import GpuModel
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
