"""Predictor: data frames, network 1 (real tiny training), network 2 (refinement), persistence, registry."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pandas as pd
import pytest
import torch

from scheduling.evaluation import predictor_baselines as B
from scheduling.models.measured import THROUGHPUT_COLUMNS, load_throughput, throughput_from_files
from scheduling.models.performance.features import PerfTables, build_tables, mape
from scheduling.models.performance.feedback import feedback_cells, flag_unit_mismatch
from scheduling.models.performance.prior import PriorConfig, PriorModel
from scheduling.models.performance.refiner import Refiner, RefinerConfig

torch.set_num_threads(1)
TINY = PriorConfig(n_models=1, epochs=150, hidden=32, dim=8, lr=1e-2)


@pytest.fixture(scope="module")
def gavel_dir():
    from warehouse.config import data_dir

    path = data_dir()
    if not (path / "interference" / "gavel" / "gavel_sim_isolated_throughputs.csv").exists():
        pytest.skip(f"DATA_DIR {path} lacks interference/gavel")
    return path


@pytest.fixture(scope="module")
def throughput(gavel_dir):
    return throughput_from_files(gavel_dir)


@pytest.fixture(scope="module")
def tables(throughput):
    return build_tables(throughput, "simulation")


@pytest.fixture(scope="module")
def prior(tables):
    return PriorModel(TINY).fit(tables)


def test_throughput_frame_matches_contract(throughput):
    assert list(throughput.columns) == THROUGHPUT_COLUMNS
    assert set(throughput.measurement_set) == {"simulation", "physical", "oracle"}
    assert set(throughput.gpu_type) == {"k80", "p100", "v100"}
    iso = throughput[throughput.partner_job_type.isna()]
    assert (iso[iso.feasible].normalized_throughput == 1.0).all()
    pairs = throughput[throughput.partner_job_type.notna() & throughput.feasible]
    ratio = pairs.steps_per_s / pairs.isolated_steps_per_s
    assert np.allclose(ratio, pairs.normalized_throughput, rtol=1e-4)
    # Gavel profiled only 1-GPU x 1-GPU pairs: every pair with a multi-GPU job is infeasible
    assert not throughput[throughput.partner_job_type.notna() & (throughput.scale_factor > 1)].feasible.any()
    oracle_iso = iso[iso.measurement_set == "oracle"]
    assert len(oracle_iso) == 26 * 3
    assert oracle_iso.batch_size.isna().sum() == 2 * 3  # A3C and CycleGAN have no batch size


def test_load_throughput_reads_the_mart_and_falls_back(throughput, tmp_warehouse):
    # no warehouse yet: file fallback
    assert len(load_throughput(tmp_warehouse)) == len(throughput)
    with pytest.raises(FileNotFoundError):
        load_throughput(tmp_warehouse, fallback=False)
    from warehouse.db import writer

    sample = throughput.sample(200, random_state=0)
    with writer(tmp_warehouse) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS marts")
        con.register("sample", sample)
        con.execute("CREATE TABLE marts.gpu_throughput AS SELECT * FROM sample")
    back = load_throughput(tmp_warehouse)
    assert len(back) == 200
    expected = sample.sort_values(
        ["measurement_set", "gpu_type", "consolidated", "job_type", "scale_factor", "partner_job_type"],
        na_position="first",
        kind="mergesort",
    ).reset_index(drop=True)
    pd.testing.assert_frame_equal(back[["job_type", "steps_per_s"]], expected[["job_type", "steps_per_s"]])


def test_tables_dedupe_and_pair_ids(tables):
    # 1-GPU unconsolidated rows are identical duplicates and dropped
    assert not any(k.endswith("x1u") for k in tables.jobs.index)
    assert tables.pairs.groupby("pair_id").size().max() <= 6  # 2 directions x 3 GPU types
    assert (tables.pairs.log_norm <= 0).all()


def test_prior_loss_falls_and_beats_mean_per_job(tables):
    """Real tiny training on a small split: hold out 20 % of the unordered pairs (all GPUs, both directions)."""
    pair_ids = np.array(sorted(tables.pairs.pair_id.unique()), dtype=object)
    np.random.default_rng(0).shuffle(pair_ids)
    test_mask = tables.pairs.pair_id.isin(set(pair_ids[: len(pair_ids) // 5]))
    train, test = tables.pairs[~test_mask], tables.pairs[test_mask]
    model = PriorModel(TINY).fit(PerfTables(tables.jobs, tables.iso, train))
    loss = model.history[0]
    assert loss[-1] < 0.2 * loss[0]
    norm, _co = model.predict_pair_table(tables, test)
    ours = mape(norm, test.normalized_throughput)
    baseline = mape(np.exp(B.pair_mean_per_job(train, test)), test.normalized_throughput)
    assert ours < baseline, (ours, baseline)


def test_prior_predicts_unseen_gpu_cells_better_than_mean_per_job(tables):
    """Hide one fold of jobs on V100: network 1 still sees them on K80/P100 and other jobs on V100."""
    keys = np.array(sorted(tables.jobs.index), dtype=object)
    np.random.default_rng(1).shuffle(keys)
    hidden_keys = set(keys[: len(keys) // 5])
    hide_iso = (tables.iso.gpu_type == "v100") & tables.iso.job_key.isin(hidden_keys)
    hide_pair = (tables.pairs.gpu_type == "v100") & (
        tables.pairs.job_key.isin(hidden_keys) | tables.pairs.partner_key.isin(hidden_keys)
    )
    train, test = tables.iso[~hide_iso], tables.iso[hide_iso]
    model = PriorModel(TINY).fit(PerfTables(tables.jobs, train, tables.pairs[~hide_pair]))
    ours = mape(model.predict_iso_table(tables, test), test.steps_per_s)
    baseline = mape(np.exp(B.iso_mean_per_job(train, test)), test.steps_per_s)
    assert ours < baseline, (ours, baseline)


def test_prior_is_reproducible(tables):
    small = PerfTables(tables.jobs, tables.iso, tables.pairs.iloc[:300])
    cfg = PriorConfig(n_models=1, epochs=20, hidden=16, dim=4)
    a = PriorModel(cfg).fit(small).predict_iso_table(tables, tables.iso.iloc[:10])
    b = PriorModel(cfg).fit(small).predict_iso_table(tables, tables.iso.iloc[:10])
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_unit_mismatch_flags_recommendation(throughput, prior):
    cells = feedback_cells(throughput, prior)
    flags = flag_unit_mismatch(cells)
    flagged = sorted(flags.index[flags])
    assert flagged and all(k.startswith("Recommendation") for k in flagged)


def test_refiner_reduces_error_after_feedback(throughput, prior):
    """Network 2 trained on other families' oracle feedback; for a held-out family, 20 observed cells of a job
    must cut the error on its unobserved cells well below the prior's."""
    cells = feedback_cells(throughput, prior)
    flags = flag_unit_mismatch(cells)
    cells = cells[~cells.job_key.isin(flags.index[flags])].reset_index(drop=True)
    test_family = "ResNet-18"
    test_types = set(cells.job_type[cells.model_family == test_family])
    train = cells[(cells.model_family != test_family) & ~cells.partner_job_type.isin(test_types)]
    refiner = Refiner(RefinerConfig(epochs=60)).fit(train)
    assert refiner.history[-1] < refiner.history[0]
    rng = np.random.default_rng(0)
    prior_err, refined_err, zero_err = [], [], []
    for _key, group in cells[cells.model_family == test_family].groupby("job_key"):
        perm = rng.permutation(group.index.to_numpy())
        observed, target = cells.loc[perm[:20]], cells.loc[perm[20:]]
        mean, var = refiner.predict(observed, target)
        mean0, _ = refiner.predict(observed.iloc[:0], target)
        truth = target.steps_per_s.to_numpy()
        prior_err.append(np.abs(np.exp(target.prior_log) - truth) / truth)
        refined_err.append(np.abs(np.exp(target.prior_log + mean) - truth) / truth)
        zero_err.append(np.abs(np.exp(target.prior_log + mean0) - truth) / truth)
        assert (var > 0).all()
    prior_mape = np.mean(np.concatenate(prior_err))
    assert np.mean(np.concatenate(refined_err)) < 0.7 * prior_mape
    assert np.mean(np.concatenate(zero_err)) == pytest.approx(prior_mape, rel=1e-6)  # no feedback: the prior


def test_performance_predictor_online_feedback_and_persistence(throughput, tmp_path):
    from scheduling.models.performance.predictor import PerformancePredictor

    predictor = PerformancePredictor.train(throughput, TINY, RefinerConfig(epochs=30))
    job = {"job_type": "ResNet-50 (batch size 64)"}
    other = {"job_type": "LM (batch size 20)"}
    before = predictor.isolated([job, other], "v100")
    assert (before > 0).all()
    norm_a, norm_b = predictor.colocated(job, other, "v100")
    assert 0 < norm_a[0] <= 1 and 0 < norm_b[0] <= 1
    # the job runs 1.5x faster than predicted on K80 and P100: V100 estimate moves up, the other job's does not
    observed = predictor.isolated([job, job], ["k80", "p100"]) * 1.5
    predictor.observe([dict(job, gpu_type=g, steps_per_s=v) for g, v in zip(["k80", "p100"], observed)])
    after = predictor.isolated([job, other], "v100")
    assert after[0] > before[0] * 1.1
    assert after[1] == pytest.approx(before[1], rel=1e-6)
    assert predictor.refit_refiner() is False  # one job with feedback: keep the learnt kernel
    # unseen job type: feature-based estimate
    assert predictor.isolated({"job_type": "ResNet-18 (batch size 48)"}, "p100")[0] > 0
    predictor.save(tmp_path / "m")
    loaded = PerformancePredictor.load(tmp_path / "m")
    np.testing.assert_allclose(loaded.isolated([job, other], "v100"), after, rtol=1e-5)


def test_train_and_register_and_load_latest_good(throughput, tmp_warehouse, tmp_path, monkeypatch):
    from scheduling.evaluation.predictor_eval import EvalConfig
    from scheduling.models.registered import load_latest_good
    from scheduling.tasks import train_models as train_and_register

    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    cfg = EvalConfig(prior=TINY, refiner=RefinerConfig(epochs=20))
    result = train_and_register(db_path=tmp_warehouse, as_of="2021-06-01T00:00Z", evaluate=False, eval_config=cfg)
    assert result["gpu-predictor"]["status"] == "good", result
    assert result["gpu-power"]["status"] == "good", result
    predictor = load_latest_good("gpu-predictor", db_path=tmp_warehouse)
    assert predictor.isolated({"job_type": "A3C"}, "k80")[0] > 0
    power = load_latest_good("gpu-power", db_path=tmp_warehouse)
    assert len(power.options("v100", "resnet50/imagenet", 1.0)) == 7
    assert load_latest_good("gpu-power", as_of="2020-01-01", db_path=tmp_warehouse) is None
    from warehouse.db import reader

    with reader(tmp_warehouse) as con:
        cols = [r[0] for r in con.execute("DESCRIBE model.registry").fetchall()]
    assert cols == [
        "model_name",
        "target",
        "version",
        "trained_at",
        "params",
        "metrics",
        "artifact_path",
        "status",
        "created_at",
    ]


@pytest.mark.slow
def test_predictor_eval_quick_cli(gavel_dir, tmp_path, capsys):
    import json

    from scheduling.cli import main

    report = tmp_path / "results.md"
    assert main(["predictor-eval", "--json", "--quick", "--from-files", "--report", str(report)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"protocol1_pairs", "protocol2_gpu_holdout", "protocol3_refinement", "targets"} <= set(out)
    assert "| 1. held-out co-location pairs" in report.read_text()
