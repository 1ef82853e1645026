"""Cluster-trace loaders (openb, PAI specs, Philly) on the real files, plus one full ingest of every file source
of cluster/energy/interference/telemetry with the exact expected counts."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from warehouse.db import reader
from warehouse.ingest import ingest, summarize
from warehouse.loaders import all_sources
from warehouse.loaders.cluster import openb_nodes, openb_pods

MY_SOURCES = [
    "openb_pods",
    "openb_nodes",
    "pai_machine_specs",
    "philly_runtimes",
    "philly_job_distribution",
    "zeus_power_sweep",
    "zeus_train_summary",
    "zeus_profiles",
    "mlenergy_v2",
    "mlenergy_v3",
    "acmetrace",
    "gavel",
    "telemetry",
]
EXPECTED_ROWS = {
    "raw.openb_pods": 199_197,
    "raw.openb_nodes": 1_213 + 1_523,
    "raw.pai_machine_specs": 1_897,
    "raw.philly_runtimes": 83_154,
    "raw.philly_job_distribution": 33_192,
    "raw.zeus_power_sweep": 1_609,
    "raw.zeus_train_summary": 3_759,
    "raw.zeus_profile_windows": 164,
    "raw.mlenergy_v2_legacy": 260,
    "raw.mlenergy_v2_llm_runs": 356,
    "raw.mlenergy_v2_diffusion_runs": 118,
    "raw.mlenergy_v3_configurations": 838,
    "raw.acme_cluster_summary": 5,
    "raw.acme_utilization_cdfs": 17_000,
    "raw.gavel_isolated": 492 + 492 + 78,
    "raw.gavel_colocated": 10_338 + 10_338 + 2_028,
}


def test_sources_are_registered_with_groups():
    sources = all_sources()
    groups = {name: sources[name].group for name in MY_SOURCES}
    assert groups["openb_pods"] == groups["philly_job_distribution"] == "cluster"
    assert groups["zeus_power_sweep"] == groups["acmetrace"] == groups["telemetry"] == "energy"
    assert groups["gavel"] == "interference"


def test_ingest_all_real_sources_exact_counts_and_idempotent(tmp_warehouse, data_dir):
    results = ingest(MY_SOURCES, data_dir=data_dir, progress=False)
    summary = {row["table"]: row for row in summarize(results)}
    assert {t: summary[t]["rows"] for t in EXPECTED_ROWS} == EXPECTED_ROWS
    assert sum(row["rejected"] for row in summary.values()) == 0  # nothing real is quarantined
    assert "raw.gpu_telemetry" not in summary  # no DATA_DIR/telemetry in the shared data
    with reader() as con:
        counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in EXPECTED_ROWS}
        quarantined = con.execute(
            "SELECT count(*) FROM quarantine.rejected_rows WHERE source = ANY(?)", [MY_SOURCES]
        ).fetchone()[0]
        pods = dict(con.execute("SELECT variant, count(*) FROM raw.openb_pods GROUP BY 1").fetchall())
        batch = con.execute("SELECT DISTINCT _batch_id FROM raw.openb_pods WHERE variant = 'default'").fetchall()
    assert counts == EXPECTED_ROWS and quarantined == 0
    assert len(pods) == 24 and pods["default"] == 8_152 and pods["cpu0"] == 7_064 and pods["multigpu40"] == 8_746
    assert batch == [("openb_pods:openb/openb_pod_list_default.csv",)]
    # A second ingest changes nothing.
    again = ingest(MY_SOURCES, data_dir=data_dir, progress=False)
    assert all(r.skipped_unchanged for r in again)
    with reader() as con:
        assert {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in EXPECTED_ROWS} == EXPECTED_ROWS


def test_openb_pod_files_and_variants(data_dir):
    files = openb_pods.files(data_dir)
    assert len(files) == 24  # including openb_pod_list_cpu0.csv
    assert not any("fixtures" in str(p) for p in files)
    batches = {b.frame["variant"].iloc[0]: b for b in openb_pods.batches(data_dir)}
    assert sum(len(b.frame) for b in batches.values()) == 199_197
    default = batches["default"].frame
    assert list(default.columns) == [
        "variant",
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "qos",
        "pod_phase",
        "creation_time_s",
        "deletion_time_s",
        "scheduled_time_s",
    ]
    assert len(default) == 8_152 and default["name"].is_unique
    first = default.iloc[0]
    assert (first["name"], first["cpu_milli"], first["memory_mib"], first["gpu_milli"], first["qos"]) == (
        "openb-pod-0000",
        12000,
        16384,
        1000,
        "LS",
    )
    assert default["scheduled_time_s"].isna().sum() == 897  # pods never scheduled
    multi = batches["multigpu40"].frame
    assert multi[["gpu_spec", "qos", "pod_phase", "creation_time_s"]].isna().all().all()
    assert str(multi["creation_time_s"].dtype) == "Int64"  # NULL columns keep their type
    assert batches["gpuspec33"].frame["gpu_spec"].notna().sum() == 8_152 - 5_764


def test_openb_nodes(data_dir):
    batches = {b.frame["variant"].iloc[0]: b.frame for b in openb_nodes.batches(data_dir)}
    assert {k: len(v) for k, v in batches.items()} == {"gpu_node": 1_213, "all_node": 1_523}
    all_node = batches["all_node"]
    assert list(all_node.columns) == ["variant", "sn", "cpu_milli", "memory_mib", "num_gpu", "gpu_model"]
    assert all_node.loc[all_node["num_gpu"] == 0, "gpu_model"].isna().all()
    assert all_node["gpu_model"].isna().sum() == 310
    assert set(batches["gpu_node"]["sn"]) <= set(all_node["sn"])


def test_pai_and_philly(data_dir):
    sources = all_sources()
    pai = next(iter(sources["pai_machine_specs"].batches(data_dir))).frame
    assert pai.groupby("gpu_type").size().to_dict() == {
        "CPU": 83,
        "MISC": 280,
        "P100": 798,
        "T4": 497,
        "V100": 104,
        "V100M32": 135,
    }
    assert int(pai["cap_gpu"].sum()) == 6_742
    runtimes = next(iter(sources["philly_runtimes"].batches(data_dir))).frame
    assert list(runtimes.columns) == ["runtime_s"] and runtimes["runtime_s"].median() == 1_186
    dist = next(iter(sources["philly_job_distribution"].batches(data_dir))).frame
    assert dist["num_gpus"].value_counts().to_dict() == {1: 25_304, 8: 4_147, 4: 3_076, 2: 665}


def test_pod_rows_are_checked(tmp_path):
    openb = tmp_path / "openb"
    openb.mkdir()
    (openb / "openb_pod_list_test.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,1000,2048,1,500\n"
        "p1,1000,-5,1,500\n"  # negative memory
        "p2,1000,2048,1,1500\n"  # more than one GPU's share
        "p0,2000,2048,1,500\n"  # duplicate pod name
        "p3,1.5,2048,0,0\n"  # fractional milli-CPU
    )
    (batch,) = list(openb_pods.batches(tmp_path))
    assert batch.frame["name"].tolist() == ["p0"] and batch.frame["variant"].tolist() == ["test"]
    got = sorted((r.row_number, r.field, r.reason) for r in batch.rejections)
    assert got == [
        (3, "memory_mib", "below minimum 0"),
        (4, "gpu_milli", "above maximum 1000"),
        (5, "name", "duplicate key ['name']"),
        (6, "cpu_milli", "not an integer"),
    ]
    assert all(r.file.endswith("openb_pod_list_test.csv") for r in batch.rejections)


def test_reload_replaces_only_its_own_file(tmp_warehouse, tmp_path, data_dir):
    openb = tmp_path / "openb"
    openb.mkdir()
    for name in ("openb_pod_list_default.csv", "openb_pod_list_multigpu20.csv"):
        shutil.copy(data_dir / "openb" / name, openb / name)
    ingest(["openb_pods"], data_dir=tmp_path, progress=False)
    frame = pd.read_csv(openb / "openb_pod_list_default.csv").head(100)
    frame.to_csv(openb / "openb_pod_list_default.csv", index=False)
    ingest(["openb_pods"], data_dir=tmp_path, progress=False)
    with reader() as con:
        pods = dict(con.execute("SELECT variant, count(*) FROM raw.openb_pods GROUP BY 1").fetchall())
    assert pods == {"default": 100, "multigpu20": 8_324}


@pytest.mark.parametrize("name", ["openb_pods", "openb_nodes", "gavel", "zeus_profiles", "telemetry"])
def test_missing_data_dir_parts_yield_nothing(tmp_path, name):
    source = all_sources()[name]
    assert source.files(tmp_path) == [] and list(source.batches(tmp_path)) == []
