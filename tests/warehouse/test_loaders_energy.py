"""Energy loaders (Zeus, ML.ENERGY v2/v3, AcmeTrace) on the real files and on small bad inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from warehouse.loaders import all_sources
from warehouse.loaders.energy import load_zeus_profile, load_zeus_train_summary

ZEUS = "energy/zeus"


def _frames(name: str, data_dir) -> dict[str, pd.DataFrame]:
    """table -> concatenated frame of one source's batches (no rejections expected on real data)."""
    tables: dict[str, list[pd.DataFrame]] = {}
    for batch in all_sources()[name].batches(data_dir):
        assert batch.rejections == [], batch.rejections[:3]
        assert batch.batch_id.startswith(f"{name}:energy/")
        tables.setdefault(batch.table, []).append(batch.frame)
    return {t: pd.concat(f, ignore_index=True) for t, f in tables.items()}


def test_zeus_power_sweep_uses_the_derived_file_only(data_dir):
    source = all_sources()["zeus_power_sweep"]
    assert [p.name for p in source.files(data_dir)] == ["zeus_power_limit_sweep.csv"]
    sweep = _frames("zeus_power_sweep", data_dir)["raw.zeus_power_sweep"]
    assert len(sweep) == 1_609
    assert sweep.groupby("gpu_type").size().to_dict() == {"A40": 453, "P100": 270, "RTX6000": 410, "V100": 476}
    assert list(sweep.columns) == [
        "gpu_type",
        "dataset",
        "network",
        "batch_size",
        "optimizer",
        "power_limit_w",
        "time_per_epoch_s",
        "avg_power_w",
        "energy_per_epoch_j",
    ]
    np.testing.assert_allclose(sweep["energy_per_epoch_j"], sweep["time_per_epoch_s"] * sweep["avg_power_w"], rtol=1e-9)


def test_zeus_power_sweep_falls_back_to_the_summary_files(tmp_path, data_dir):
    (tmp_path / ZEUS).mkdir(parents=True)
    for gpu in ("a40", "p100", "rtx6000", "v100"):
        (tmp_path / ZEUS / f"summary_power_{gpu}.csv").symlink_to(data_dir / ZEUS / f"summary_power_{gpu}.csv")
    fallback = _frames("zeus_power_sweep", tmp_path)["raw.zeus_power_sweep"]
    derived = _frames("zeus_power_sweep", data_dir)["raw.zeus_power_sweep"]
    key = ["gpu_type", "dataset", "network", "batch_size", "optimizer", "power_limit_w"]
    merged = derived.merge(fallback, on=key, suffixes=("", "_fb"), validate="one_to_one")
    assert len(merged) == len(derived) == len(fallback) == 1_609
    for col in ("time_per_epoch_s", "avg_power_w", "energy_per_epoch_j"):
        np.testing.assert_allclose(merged[col], merged[f"{col}_fb"], rtol=1e-9)


def test_zeus_train_summary_nan_is_null(data_dir):
    train = _frames("zeus_train_summary", data_dir)["raw.zeus_train_summary"]
    assert len(train) == 3_759 and train["target_epoch"].isna().sum() == 849
    assert str(train["target_epoch"].dtype) == "Int64" and train["target_epoch"].min() == 1


def test_zeus_train_summary_bad_epochs_are_quarantined(tmp_path):
    path = tmp_path / "summary_train.csv"
    path.write_text(
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n"
        "c,s,8,adam,1e-3,1,0.5,3\n"
        "c,s,8,adam,1e-3,2,0.5,nan\n"
        "c,s,8,adam,1e-3,3,0.5,three\n"
        "c,s,8,adam,1e-3,4,0.5,-1\n"
        "c,s,8,adam,1e-3,5,0.5,2.5\n"
    )
    batch = load_zeus_train_summary(path, tmp_path)
    assert batch.frame["target_epoch"].tolist() == [3, pd.NA]
    assert [(r.row_number, r.field, r.reason.split(" (")[0]) for r in batch.rejections] == [
        (4, "target_epoch", "not a number"),
        (5, "target_epoch", "below minimum 0"),
        (6, "target_epoch", "not an integer"),
    ]


def test_zeus_profiles_long_form(data_dir):
    profiles = _frames("zeus_profiles", data_dir)["raw.zeus_profile_windows"]
    assert len(profiles) == 164
    four = profiles[
        (profiles["gpu_model"] == "A40") & (profiles["model_name"] == "resnet18") & (profiles["gpu_ids"] == "0,1,2,3")
    ]
    assert len(four) == 9 * 4 and set(four["gpu_index"]) == {0, 1, 2, 3} and set(four["num_gpus"]) == {4}
    assert sorted(four["power_limit_w"].unique()) == list(range(100, 301, 25))
    first = four[(four["window_index"] == 0) & (four["gpu_index"] == 0)].iloc[0]
    assert first["power_limit_w"] == 300 and first["energy_j"] == pytest.approx(3991.396999999881)
    assert first["avg_power_w"] == pytest.approx(3991.396999999881 / 33.27751154080033)
    v100 = profiles[profiles["gpu_model"] == "V100"]
    assert sorted(v100["power_limit_w"].unique()) == list(range(100, 251, 25))
    assert (profiles["energy_j"] >= 0).all()


def test_zeus_profile_bad_window_is_quarantined(tmp_path):
    path = tmp_path / "A40+toy+gpu0,1.csv"
    path.write_text(
        "start_time,window_name,elapsed_time,gpu0_energy,gpu1_energy\n"
        "10.0,__GlobalPowerLimitOptimizer_300,5.0,1500.0,1490.0\n"
        "16.0,__GlobalPowerLimitOptimizer_max,5.0,1400.0,1390.0\n"
        "22.0,__GlobalPowerLimitOptimizer_250,5.0,-3,1200.0\n"
        "28.0,__GlobalPowerLimitOptimizer_200,5.5,1100.0,1090.0\n"
    )
    batch = load_zeus_profile(path, tmp_path)
    assert batch.frame[["power_limit_w", "gpu_index"]].values.tolist() == [[300, 0], [300, 1], [200, 0], [200, 1]]
    assert batch.frame["window_index"].tolist() == [0, 0, 1, 1]
    assert sorted((r.row_number, r.field, r.reason) for r in batch.rejections) == [
        (3, "window_name", "window_name does not end in _<power limit W>"),
        (4, "gpu0_energy", "below minimum 0"),
    ]
    assert batch.batch_id == "zeus_profiles:A40+toy+gpu0,1.csv"


def test_mlenergy_v2(data_dir):
    tables = _frames("mlenergy_v2", data_dir)
    legacy = tables["raw.mlenergy_v2_legacy"]
    assert len(legacy) == 260
    assert legacy.groupby("gpu").size().to_dict() == {"A100": 84, "A40": 92, "V100": 84}
    assert set(legacy["task"]) == {"chat", "chat-concise", "instruct", "instruct-concise"}
    assert list(legacy.columns) == [
        "gpu",
        "task",
        "model",
        "throughput_tokens_per_s",
        "response_length_tokens",
        "latency_s",
        "energy_per_response_j",
    ]
    row = legacy[(legacy["gpu"] == "A100") & (legacy["task"] == "chat") & (legacy["model"] == "BAIR/koala-13b")]
    assert row["energy_per_response_j"].iloc[0] == pytest.approx(2144.8338435191445)
    runs = tables["raw.mlenergy_v2_llm_runs"]
    assert len(runs) == 356 and runs["energy_per_request_j"].min() > 0
    assert {"tensor_parallel", "pipeline_parallel", "avg_tpot_s", "max_batch_size_reqs"} <= set(runs.columns)
    diffusion = tables["raw.mlenergy_v2_diffusion_runs"]
    assert len(diffusion) == 118
    assert diffusion["energy_per_image_j"].notna().sum() == 86 and diffusion["energy_per_video_j"].notna().sum() == 32
    assert (diffusion["energy_per_image_j"].notna() != diffusion["energy_per_video_j"].notna()).all()


def test_mlenergy_v3(data_dir):
    v3 = _frames("mlenergy_v3", data_dir)["raw.mlenergy_v3_configurations"]
    assert len(v3) == 838
    assert {
        "avg_power_total_w",
        "energy_per_request_j",
        "energy_per_token_j",
        "output_throughput_tokens_per_s",
        "avg_output_len_tokens",
    } <= set(v3.columns)
    per_gpu = (v3["avg_power_total_w"] / v3["num_gpus"]).groupby(v3["gpu_model"]).median()
    assert 450 < per_gpu["H100"] < 550 and 650 < per_gpu["B200"] < 750


def test_acmetrace(data_dir):
    tables = _frames("acmetrace", data_dir)
    summary = tables["raw.acme_cluster_summary"]
    assert summary["cluster"].tolist() == ["Seren", "Kalos", "Philly", "Helios", "PAI"]
    assert "avg_run_time_gpu_s" in summary and summary.loc[4, "complete_rate_gpu"] is pd.NA
    cdfs = tables["raw.acme_utilization_cdfs"]
    assert len(cdfs) == 17_000 and cdfs.groupby(["cluster", "metric"]).size().eq(1000).all()
