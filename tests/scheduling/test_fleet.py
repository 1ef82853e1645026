"""Fleet configuration and the job trace generator (real DATA_DIR files)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.fleet import DEFAULT_FLEET_PATH, load_fleet, node_pool, sample_nodes
from scheduling.domain.jobs import (
    GAVEL_JOB_TYPES,
    JOB_COLUMNS,
    WORKLOAD_CLASSES,
    SpeedModel,
    durations,
    generate_jobs,
    hostable,
    job_class,
    philly_bucket,
    validate_jobs,
)


@pytest.fixture(scope="module")
def fleet(data_dir):
    return load_fleet(data_dir=data_dir)


def test_default_fleet(fleet):
    zones = fleet.cluster_zones
    assert set(zones) == {"CISO", "ERCO", "PJM", "ISNE", "MISO", "DE", "ES", "NL", "PL", "SE", "GB"}
    assert zones[:6] == ["CISO", "ERCO", "PJM", "ISNE", "SE", "DE"]  # the DACF zones first
    for c in fleet.clusters:
        assert (c.nodes["model"] == c.config.gpu_model).all()  # one GPU model per cluster
        assert c.n_gpus >= c.config.gpus
        assert c.nodes["sn"].is_unique
        assert 1.0 <= c.config.pue <= 3.0
    assert (fleet.capacity_milli == np.array([c.n_gpus for c in fleet.clusters]) * 1000).all()
    assert fleet.resource_capacity.shape == (3, len(fleet))
    table = fleet.capacity_table()
    assert list(table["zone"]) == zones and (table["gpus"] > 0).all()
    for m in fleet.gpu_models.values():
        assert 0 < m.idle_w < m.peak_w


def test_select_and_scale(fleet):
    six = fleet.select(6)
    assert len(six) == 6 and six.zones == ["CISO", "ERCO", "PJM", "ISNE", "SE", "DE"]
    by_zone = fleet.select(["SE", "us-west"])
    assert sorted(by_zone.zones) == ["CISO", "SE"]
    with pytest.raises(ValueError):
        fleet.select(["XX"])
    with pytest.raises(ValueError):
        fleet.select(99)
    small = six.scaled(48)
    assert abs(small.total_gpus - 48) <= 6 * 2  # whole nodes, each cluster within half a node of its share
    for c in small.clusters:
        assert len(c.nodes) >= 1
        assert abs(c.n_gpus - 8) <= c.max_node_gpus / 2
    tiny = six.scaled(30)
    assert all(len(c.nodes) >= 1 for c in tiny.clusters) and tiny.total_gpus <= 40
    big = six.scaled(200)
    assert abs(big.total_gpus - 200) <= 12
    # deterministic
    again = six.scaled(48)
    assert [list(c.nodes["sn"]) for c in again.clusters] == [list(c.nodes["sn"]) for c in small.clusters]


def test_node_sources(data_dir):
    pai = node_pool("pai", "V100M32", data_dir)
    assert (pai["gpu"] == 8).all() and (pai["cpu_milli"] == 96000).all()
    openb = node_pool("openb", "T4", data_dir)
    assert set(openb["gpu"]) <= {2, 4}
    nodes = sample_nodes(openb, 10, "x", seed=1)
    assert nodes["gpu"].sum() >= 10
    with pytest.raises(ValueError):
        node_pool("nope", "T4", data_dir)


def test_bad_fleet_yaml(tmp_path, data_dir):
    text = DEFAULT_FLEET_PATH.read_text()
    bad = tmp_path / "fleet.yaml"
    bad.write_text(text.replace("gpu_model: T4,      gpus: 64, pue: 1.20", "gpu_model: T9, gpus: 64, pue: 1.20"))
    with pytest.raises(ValueError, match="T9"):
        load_fleet(bad, data_dir=data_dir)
    bad.write_text(text.replace("pue: 1.10", "pue: 0.5"))
    with pytest.raises(ValueError, match="pue"):
        load_fleet(bad, data_dir=data_dir)


def test_generate_jobs(fleet, data_dir):
    six = fleet.select(6)
    start = pd.Timestamp("2021-07-01T00:00Z")
    jobs = generate_jobs(300, start, 48, six, seed=5, data_dir=data_dir)
    validate_jobs(jobs)
    assert list(jobs.columns) == list(JOB_COLUMNS)
    assert len(jobs) + jobs.attrs["dropped"] == 300
    assert jobs["job_id"].is_unique
    # submissions on the hour inside the window
    assert (jobs["submit_time"] >= start).all() and (jobs["submit_time"] < start + pd.Timedelta(hours=48)).all()
    assert (jobs["submit_time"] == jobs["submit_time"].dt.floor("h")).all()
    # deadlines = submit + d_home (1 + flex), flexibility inside the class range
    d = (jobs["deadline"] - jobs["submit_time"]) / pd.Timedelta(hours=1)
    np.testing.assert_allclose(d, jobs["duration_h_home"] * (1 + jobs["flexibility"]), rtol=1e-9)
    for klass, (lo, hi) in WORKLOAD_CLASSES.items():
        f = jobs.loc[jobs["workload_class"] == klass, "flexibility"]
        assert ((f >= lo) & (f <= hi)).all()
    assert set(jobs["workload_class"]) <= set(WORKLOAD_CLASSES)
    assert all(job_class(t) == k for t, k in zip(jobs["job_type"], jobs["workload_class"]))
    assert jobs["duration_h_ref"].between(1.0, 48.0).all()
    assert (jobs["num_gpu"] >= 1).all() and jobs["gpu_milli"].between(1, 1000).all()
    # the home cluster can host the job
    host = hostable(jobs, six)
    idx = [six.names.index(h) for h in jobs["home_cluster"]]
    assert host[np.arange(len(jobs)), idx].all()
    # seeded
    again = generate_jobs(300, start, 48, six, seed=5, data_dir=data_dir)
    pd.testing.assert_frame_equal(jobs, again)
    other = generate_jobs(300, start, 48, six, seed=6, data_dir=data_dir)
    assert not jobs["duration_h_ref"].equals(other["duration_h_ref"])


def test_durations_and_speeds(fleet, data_dir):
    sm = SpeedModel(data_dir)
    assert sm.source == "gavel-isolated-throughputs"
    v100 = fleet.gpu_models["V100M32"]
    p100 = fleet.gpu_models["P100"]
    t4 = fleet.gpu_models["T4"]
    assert sm.speed("ResNet-50 (batch size 64)", v100) == 1.0
    assert sm.speed("ResNet-50 (batch size 64)", p100) == pytest.approx(2.619 / 4.395, rel=1e-2)
    assert sm.speed("ResNet-50 (batch size 64)", t4) == pytest.approx(0.45)
    jobs = pd.DataFrame({"job_type": ["ResNet-50 (batch size 64)"], "duration_h_ref": [2.0]})
    d = durations(jobs, fleet, sm)
    assert d[0, fleet.names.index("usw-v100m16")] == pytest.approx(2.0)
    assert d[0, fleet.names.index("uss-t4")] == pytest.approx(2.0 / 0.45)
    assert d[0, fleet.names.index("use-p100")] == pytest.approx(2.0 / (2.619 / 4.395), rel=1e-2)


def test_philly_bucket_and_types():
    np.testing.assert_array_equal(philly_bucket(np.array([1, 2, 3, 4, 5, 8, 16])), [1, 2, 4, 4, 8, 8, 8])
    assert len(GAVEL_JOB_TYPES) == 26
    classes = pd.Series([job_class(t) for t in GAVEL_JOB_TYPES]).value_counts().to_dict()
    assert classes == {"vision": 10, "language": 10, "recommendation": 5, "rl": 1}


def test_hostable_respects_gpu_spec_and_node_shape(fleet):
    six = fleet.select(6)
    jobs = pd.DataFrame(
        {
            "gpu_spec": ["T4", "", "G2|V100M32"],
            "num_gpu": [1, 8, 1],
            "cpu_milli": [1000, 8000, 1000],
            "memory_mib": [1024, 1024, 1024],
        }
    )
    h = hostable(jobs, six)
    names = six.names
    assert h[0].tolist() == [n == "uss-t4" for n in names]
    assert not h[1, names.index("uss-t4")]  # T4 nodes have at most 4 GPUs
    assert not h[1, names.index("use-p100")]  # P100 nodes have 2
    assert h[1, names.index("eun-v100m32")]
    assert h[2].tolist() == [n in ("usne-v100m32", "eun-v100m32") for n in names]


def test_read_pods_bad_value(tmp_path, data_dir):
    from scheduling.domain.jobs import read_pods

    src = (data_dir / "openb" / "openb_pod_list_default.csv").read_text().splitlines()
    head, row = src[0], src[1].split(",")
    row[1] = "lots"
    path = tmp_path / "pods.csv"
    path.write_text("\n".join([head, ",".join(row)] + src[2:10]) + "\n")
    with pytest.raises(ValueError, match="row 2.*cpu_milli"):
        read_pods(str(path))
