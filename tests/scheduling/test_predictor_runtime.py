"""The predictor's numpy runtime: the torch networks' numbers from the saved weights, no torch in a plan, and
weight files that are not plain tensors refused with the file named."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from scheduling.models.performance.inference import PredictorRuntime
from scheduling.models.performance.weights import WeightsError, read_state
from scheduling.models.registered import predictor_speed_table

KNOWN = ["ResNet-50 (batch size 64)", "LM (batch size 20)", "A3C", "Transformer (batch size 64)", "CycleGAN"]
UNKNOWN = ["ResNet-18 (batch size 48)", "LM (batch size 7)", "Mystery (batch size 3)"]
PLAN_TIME = "2021-07-15T12:00Z"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def predictor(data_dir):
    from scheduling.models.measured import throughput_from_files
    from scheduling.models.performance.predictor import PerformancePredictor
    from scheduling.models.performance.prior import PriorConfig
    from scheduling.models.performance.refiner import RefinerConfig

    torch.set_num_threads(1)
    tiny = PriorConfig(n_models=2, epochs=150, hidden=32, dim=8, lr=1e-2)
    return PerformancePredictor.train(throughput_from_files(data_dir), tiny, RefinerConfig(epochs=20))


@pytest.fixture(scope="module")
def saved(predictor, tmp_path_factory):
    return predictor.save(tmp_path_factory.mktemp("predictor"))


def _observations(predictor) -> pd.DataFrame:
    """Runs as the plan observes them: a known and an unknown type 30 % slower than the prior on every GPU type
    (20 runs each, with a spread), another known type as estimated on the V100 (5 runs)."""
    rng = np.random.default_rng(0)
    rows = []
    for job_type, factor, gpus, n in (
        (KNOWN[0], 0.7, ("k80", "p100", "v100"), 20),
        (UNKNOWN[0], 0.7, ("p100", "v100"), 20),
        (KNOWN[1], 1.0, ("v100",), 5),
    ):
        for gpu in gpus:
            base = float(predictor.isolated({"job_type": job_type}, gpu, refined=False)[0])
            for spread in rng.lognormal(0.0, 0.1, n):
                rows.append(
                    {
                        "job_type": job_type,
                        "gpu_type": gpu,
                        "partner_job_type": None,
                        "steps_per_s": base * factor * spread,
                    }
                )
    return pd.DataFrame(rows)


def _max_rel(a: pd.DataFrame, b: pd.DataFrame) -> float:
    assert a.index.equals(b.index) and a.columns.equals(b.columns)
    return float(((a - b).abs() / b.abs()).to_numpy().max())


def test_speed_table_equals_the_torch_predictors(predictor, saved):
    runtime = PredictorRuntime.load(saved)
    types = KNOWN + UNKNOWN
    assert _max_rel(predictor_speed_table(runtime, types), predictor_speed_table(predictor, types)) < 1e-6
    obs = _observations(predictor)
    numpy_table = predictor_speed_table(runtime, types, obs)
    torch_table = predictor_speed_table(predictor, types, obs)
    # the observed types moved: the comparison covers the refiner's posterior, not only network 1
    assert numpy_table.loc[KNOWN[0], "v100"] < 0.8 and numpy_table.loc[UNKNOWN[0], "v100"] < 0.8
    # float32 networks; torch's float32 Cholesky of 20-60 observations is itself good to ~cond(K) x 6e-8 only
    assert _max_rel(numpy_table, torch_table) < 1e-4
    assert len(runtime.feedback) == 0  # the observations went to a copy


def test_runtime_predictions_match_beyond_the_speed_table(predictor, saved):
    runtime = PredictorRuntime.load(saved)
    a, b = pd.DataFrame({"job_type": KNOWN + UNKNOWN[:1]}), pd.DataFrame({"job_type": UNKNOWN + KNOWN[:3]})
    for got, want in zip(runtime.colocated(a, b, "p100"), predictor.colocated(a, b, "p100")):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    obs = _observations(predictor)
    cells = obs.assign(partner_job_type=KNOWN[2]).iloc[::7]
    ours, theirs = runtime.copy(), predictor.copy()
    ours.observe(obs)
    theirs.observe(obs)
    got, want = ours.predict_cells(cells), theirs.predict_cells(cells)
    np.testing.assert_allclose(got["prior_steps_per_s"], want["prior_steps_per_s"], rtol=1e-6)
    np.testing.assert_allclose(got["steps_per_s"], want["steps_per_s"], rtol=1e-4)
    np.testing.assert_allclose(got["log_std"], want["log_std"], rtol=1e-3, atol=1e-5)


def test_weights_are_read_with_their_dtype_shape_stride_and_offset(saved, tmp_path):
    for name in ("prior.pt", "refiner.pt"):
        ours, theirs = read_state(saved / name), torch.load(saved / name, weights_only=True)
        ours, theirs = (ours, theirs) if isinstance(ours, list) else ([ours], [theirs])
        for mine, state in zip(ours, theirs, strict=True):
            assert list(mine) == list(state)
            for key, tensor in state.items():
                assert mine[key].dtype == tensor.numpy().dtype and np.array_equal(mine[key], tensor.numpy()), key
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    views = {"t": base.T, "slice": base[1:, 2:5], "long": torch.arange(5), "flags": torch.tensor([True, False])}
    torch.save(views, tmp_path / "views.pt")  # the views share one storage: offsets and strides into it
    back = read_state(tmp_path / "views.pt")
    for key, tensor in views.items():
        assert back[key].dtype == tensor.numpy().dtype and np.array_equal(back[key], tensor.numpy()), key


def test_unexpected_weight_files_are_refused_with_the_file_named(saved, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((saved / "prior.pt").read_bytes()[:1000])
    with pytest.raises(WeightsError, match="truncated.pt"):
        read_state(truncated)
    torch.save({"weight": torch.zeros(2), "hook": json.dumps}, tmp_path / "code.pt")
    with pytest.raises(WeightsError, match=r"code.pt: refuses to unpickle json.dumps"):
        read_state(tmp_path / "code.pt")
    # a storage whose size disagrees with its tensor
    with zipfile.ZipFile(saved / "refiner.pt") as src, zipfile.ZipFile(tmp_path / "short.pt", "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, data[:-4] if item.filename.endswith("/data/0") else data)
    with pytest.raises(WeightsError, match="short.pt: storage 0 holds"):
        read_state(tmp_path / "short.pt")
    # a readable file whose state dict is not the configured network's
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    for name in ("prior.json", "prior.pt", "refiner.json", "feedback.csv", "predictor.json"):
        (artifact / name).write_bytes((saved / name).read_bytes())
    state = torch.load(saved / "refiner.pt", weights_only=True)
    state["deep.0.weight"] = state["deep.0.weight"][:, :3].contiguous()
    torch.save(state, artifact / "refiner.pt")
    with pytest.raises(WeightsError, match=r"refiner.pt: deep.0.weight is float32 \(32, 3\), expected float32"):
        PredictorRuntime.load(artifact)


def test_a_version_whose_weights_do_not_load_is_skipped(predictor, tmp_warehouse, tmp_path, monkeypatch):
    """Checksums intact (the file was registered that way) but the weights are not the network's: the registry
    skips the version, naming the file, and the plan uses the older good one."""
    from scheduling.models.registered import PREDICTOR_NAME, PREDICTOR_TARGET, resolve_registered
    from warehouse import model_registry as registry

    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    good = registry.register_model(
        predictor, PREDICTOR_NAME, PREDICTOR_TARGET, "2021-07-01T00:00Z", db_path=tmp_warehouse
    )
    bad = registry.register_model(
        predictor, PREDICTOR_NAME, PREDICTOR_TARGET, "2021-07-08T00:00Z", db_path=tmp_warehouse
    )
    path = os.path.join(bad.artifact_path, "prior.pt")
    torch.save({"not": torch.zeros(1)}, path)
    manifest_path = os.path.join(bad.artifact_path, registry.MANIFEST)
    with open(manifest_path) as handle:
        manifest = json.load(handle)
    manifest["files"]["prior.pt"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)
    model, info = resolve_registered(PREDICTOR_NAME, as_of=PLAN_TIME, db_path=tmp_warehouse)
    assert isinstance(model, PredictorRuntime) and info["version"] == good.version
    [skipped] = info["skipped"]
    assert (
        skipped["version"] == bad.version and "prior.pt: expected a non-empty list of state dicts" in skipped["error"]
    )


PLAN_SCRIPT = """
import json, sys
from scheduling import loop
from scheduling.queue.intake import submit_file
from scheduling.queue.trace import write_trace_file
from scheduling.service import plan_fleet
from warehouse.config import data_dir

db, jobs, root, plan_time = sys.argv[1:5]
write_trace_file(jobs, "2021-07-15", 30, plan_fleet(None, data_dir()), data_dir=data_dir())
submit_file(jobs, db_path=db, data_dir=data_dir())
ctx = loop.context(plan_time, db_path=db, data_dir=data_dir(), schedule_root=root)
summary = loop.plan(ctx, dry_run=True)[1]
print(json.dumps({"torch": "torch" in sys.modules, "predictor": summary["models"]["predictor"]}))
"""


def test_a_plan_does_not_import_torch(predictor, tmp_warehouse, tmp_path, monkeypatch):
    from scheduling.models.registered import PREDICTOR_NAME, PREDICTOR_TARGET
    from warehouse import model_registry as registry

    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    record = registry.register_model(
        predictor, PREDICTOR_NAME, PREDICTOR_TARGET, "2021-07-01T00:00Z", db_path=tmp_warehouse
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    args = [str(tmp_warehouse), str(tmp_path / "jobs.yaml"), str(tmp_path / "schedules"), PLAN_TIME]
    done = subprocess.run(
        [sys.executable, "-c", PLAN_SCRIPT, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["predictor"]["version"] == record.version and result["predictor"]["fallback"] is False
    assert result["torch"] is False
