"""Fleet configuration (sampled and declared clusters, the file's checks, FLEET_PATH) and the job trace generator
(real DATA_DIR files)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.domain.fleet import (
    CLUSTER_KEYS,
    DEFAULT_FLEET_PATH,
    EXECUTOR_KINDS,
    NAME_PATTERN,
    NODE_COLUMNS,
    SECRET_WORDS,
    ExecutorConfig,
    fleet_from_spec,
    load_fleet,
    node_pool,
    sample_nodes,
)
from scheduling.domain.fleet_file import fleet_path, fleet_regions
from scheduling.domain.gpus import DEFAULT_CURVE, map_gpu_type
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
    assert [c.name for c in fleet.select(6).clusters if c.declared] == ["usw-h100", "use-h100", "eun-h100", "euc-h100"]
    six = fleet.select(6).sampled()  # the batch clusters: what re-sizes
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


@pytest.mark.parametrize("pod_list", ["cpu0", "cpu300"])
def test_cpu_pod_variants_give_the_default_job_trace(fleet, data_dir, pod_list):
    """The openb cpu* pod lists vary only the CPU-only pods, which the job trace leaves out: the same jobs as the
    default list (so the evaluation on them is the default's)."""
    six, start = fleet.select(6), pd.Timestamp("2021-07-01T00:00Z")
    default = generate_jobs(300, start, 48, six, seed=5, data_dir=data_dir)
    variant = generate_jobs(300, start, 48, six, seed=5, data_dir=data_dir, pod_list=pod_list)
    cols = [c for c in default.columns if c != "source_pod"]
    pd.testing.assert_frame_equal(variant[cols], default[cols])
    gpushare = generate_jobs(300, start, 48, six, seed=5, data_dir=data_dir, pod_list="gpushare100")
    assert not gpushare["gpu_milli"].equals(default["gpu_milli"])


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


# ------------------------------------------------------------------------------------------------ declared fleets
EXAMPLE_FLEET = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.yaml"


def _declared_spec() -> dict:
    """A valid two-cluster fleet with declared nodes only (no DATA_DIR needed to build it)."""
    return {
        "version": 1,
        "regions": {"us-west": {"zone": "CISO"}, "eu-north": {"zone": "SE"}},
        "gpu_models": {
            "A100": {"idle_w": 50, "peak_w": 400, "relative_speed": 1.7},
            "V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"},
        },
        "clusters": [
            {
                "name": "usw-a100",
                "region": "us-west",
                "gpu_model": "A100",
                "pue": 1.15,
                "nodes": [
                    {"name": f"dgx-{k}", "gpus": 8, "cpus": 96, "memory_gib": 1024, "gpu_model": "A100"}
                    for k in range(4)
                ],
            },
            {
                "name": "eun-v100",
                "region": "eu-north",
                "gpu_model": "V100",
                "nodes": [{"name": "big", "gpus": 8, "cpu_milli": 64500, "memory_mib": 500000}],
                "node_groups": [
                    {"count": 3, "name_prefix": "v4", "gpus": 4, "cpus": 47.5, "memory_gib": 384},
                    {"count": 2, "gpus": 2, "cpus": 16, "memory_gib": 128.5},
                    {"count": 1, "name_prefix": "v4", "gpus": 4, "cpus": 48, "memory_gib": 384},
                ],
                "executor": {"kind": "slurm", "partition": "gpu", "token_env": "SLURM_JWT", "conn_id": "slurm_eun"},
            },
        ],
    }


def test_declared_clusters_build_the_nodes_they_list(fleet):
    f = fleet_from_spec(_declared_spec(), "fleet.yaml")
    usw, eun = f.clusters
    assert usw.declared and eun.declared and usw.config.source == "declared"
    assert list(usw.nodes["sn"]) == ["dgx-0", "dgx-1", "dgx-2", "dgx-3"]
    assert (usw.nodes["cpu_milli"] == 96000).all() and (usw.nodes["memory_mib"] == 1024 * 1024).all()
    # node_groups: <cluster>-<prefix>-<i>, numbered on across groups sharing a prefix; <cluster>-<i> without one
    assert list(eun.nodes["sn"]) == [
        "big",
        "eun-v100-v4-1",
        "eun-v100-v4-2",
        "eun-v100-v4-3",
        "eun-v100-1",
        "eun-v100-2",
        "eun-v100-v4-4",
    ]
    assert list(eun.nodes["gpu"]) == [8, 4, 4, 4, 2, 2, 4] and eun.n_gpus == eun.config.gpus == 28
    assert list(eun.nodes["cpu_milli"]) == [64500, 47500, 47500, 47500, 16000, 16000, 48000]
    assert list(eun.nodes["memory_mib"]) == [500000] + [384 * 1024] * 3 + [int(128.5 * 1024)] * 2 + [384 * 1024]
    assert (eun.nodes["model"] == "V100").all()
    # the same frame as sampled clusters: columns and dtypes, so packing and planning take it unchanged
    sampled = fleet.clusters[0].nodes
    assert list(eun.nodes.columns) == list(sampled.columns) == NODE_COLUMNS
    assert eun.nodes.dtypes.to_dict() == sampled.dtypes.to_dict()
    packing = f.packing_cluster(1)
    assert packing.n_nodes == 7 and int(packing.gpu_count.sum()) == 28
    # executors: recorded, default replay
    assert usw.executor == ExecutorConfig("replay", {})
    assert eun.executor.kind == "slurm"
    assert eun.executor.settings == {"partition": "gpu", "token_env": "SLURM_JWT", "conn_id": "slurm_eun"}
    assert f.executors() == {"usw-a100": usw.executor, "eun-v100": eun.executor}
    table = f.capacity_table()
    assert list(table["source"]) == ["declared"] * 2 and list(table["executor"]) == ["replay", "slurm"]
    assert list(table["node_shapes"]) == ["4x8GPU", "2x2GPU, 4x4GPU, 1x8GPU"]


def test_scaled_refuses_declared_clusters(fleet, data_dir):
    declared = fleet_from_spec(_declared_spec(), "fleet.yaml")
    with pytest.raises(ValueError, match=r"usw-a100, eun-v100 declare their nodes"):
        declared.scaled(48)
    spec = _declared_spec()  # a mixed fleet: one sampled, one declared cluster
    spec["gpu_models"]["T4"] = {"idle_w": 10, "peak_w": 70, "relative_speed": 0.45}
    spec["clusters"][0] = {"name": "usw-t4", "region": "us-west", "gpu_model": "T4", "source": "openb", "gpus": 16}
    mixed = fleet_from_spec(spec, "fleet.yaml", data_dir=data_dir)
    assert [c.declared for c in mixed.clusters] == [False, True] and mixed.clusters[0].n_gpus >= 16
    with pytest.raises(ValueError, match=r"cluster\(s\) eun-v100 declare their nodes.*source: openb\|pai"):
        mixed.scaled(48)
    assert fleet.select(2).sampled().scaled(16).total_gpus > 0  # sampled fleets re-size as before
    # keep_declared: the sampled clusters share the target, the declared ones stay as they are
    kept = mixed.scaled(48, keep_declared=True)
    assert [c.name for c in kept.clusters] == ["usw-t4", "eun-v100"]
    assert kept.clusters[1].nodes.equals(mixed.clusters[1].nodes)
    assert abs(kept.clusters[0].n_gpus - 48) <= kept.clusters[0].max_node_gpus / 2
    with pytest.raises(ValueError, match="no sampled cluster"):
        declared.sampled()


def _broken(edit) -> dict:
    spec = _declared_spec()
    edit(spec)
    return spec


def _set(path: str, value):
    """An edit setting spec[path] (dotted keys, list indices as ints) to value."""

    def edit(spec):
        *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = spec
        for key in head:
            node = node[key]
        node[last] = value

    return edit


def _drop(path: str):
    def edit(spec):
        *head, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = spec
        for key in head:
            node = node[key]
        del node[last]

    return edit


A100 = r"fleet\.yaml: clusters\[0\] \(usw-a100\)"
V100 = r"fleet\.yaml: clusters\[1\] \(eun-v100\)"
BAD_FLEETS = {
    "zero gpus": (
        _set("clusters.0.nodes.3.gpus", 0),
        rf"^{A100}\.nodes\[3\]\.gpus: must be a positive integer, got 0$",
    ),
    "float gpus": (_set("clusters.0.nodes.1.gpus", 8.0), rf"{A100}\.nodes\[1\]\.gpus: must be a positive integer"),
    "huge gpus": (
        _set("clusters.0.nodes.1.gpus", 800),
        rf"{A100}\.nodes\[1\]\.gpus: must be a positive integer of at most 64, got 800",
    ),
    "zero count": (_set("clusters.1.node_groups.0.count", 0), rf"{V100}\.node_groups\[0\]\.count: must be a positive"),
    "negative cpus": (_set("clusters.0.nodes.0.cpus", -2), rf"{A100}\.nodes\[0\]\.cpus: must be a positive number"),
    "zero memory": (_set("clusters.1.nodes.0.memory_mib", 0), rf"{V100}\.nodes\[0\]\.memory_mib: must be a positive"),
    "unknown cluster key": (_set("clusters.1.colour", "red"), rf"{V100}\.colour: unknown key \(known: name, region"),
    "unknown node key": (_set("clusters.0.nodes.2.rack", 4), rf"{A100}\.nodes\[2\]\.rack: unknown key"),
    "unknown group key": (_set("clusters.1.node_groups.1.size", 4), rf"{V100}\.node_groups\[1\]\.size: unknown key"),
    "unknown top key": (_set("clusterz", []), r"^fleet\.yaml: clusterz: unknown section"),
    "missing region": (_drop("clusters.1.region"), rf"{V100}: missing key 'region'"),
    "missing name": (_drop("clusters.1.name"), r"fleet\.yaml: clusters\[1\]: missing key 'name'"),
    "missing node gpus": (_drop("clusters.0.nodes.2.gpus"), rf"{A100}\.nodes\[2\]: missing key 'gpus'"),
    "missing node cpus": (
        _drop("clusters.0.nodes.2.cpus"),
        rf"{A100}\.nodes\[2\]: missing key 'cpus' \(or 'cpu_milli'\)",
    ),
    "missing count": (_drop("clusters.1.node_groups.0.count"), rf"{V100}\.node_groups\[0\]: missing key 'count'"),
    "both cpus": (
        _set("clusters.0.nodes.0.cpu_milli", 96000),
        rf"{A100}\.nodes\[0\]: give cpus or cpu_milli, not both",
    ),
    "source and nodes": (_set("clusters.0.source", "openb"), rf"{A100}: gives both source and nodes"),
    "gpus and groups": (_set("clusters.1.gpus", 64), rf"{V100}: gives both gpus and nodes \+ node_groups"),
    "neither": (
        lambda s: s["clusters"][1].pop("nodes") and s["clusters"][1].pop("node_groups"),
        rf"{V100}: has no nodes",
    ),
    "sampled without gpus": (
        lambda s: s["clusters"][0].update(source="openb", nodes=None) or s["clusters"][0].pop("nodes"),
        rf"{A100}: missing key 'gpus'",
    ),
    "empty nodes": (_set("clusters.0.nodes", []), rf"{A100}\.nodes: must be a non-empty list, got \[\]"),
    "node not a mapping": (_set("clusters.0.nodes.1", "dgx-9"), rf"{A100}\.nodes\[1\]: must be a mapping, got 'dgx-9'"),
    "duplicate cluster": (
        _set("clusters.1.name", "usw-a100"),
        r"clusters\[1\] \(usw-a100\)\.name: duplicate cluster name \(also clusters\[0\]\)",
    ),
    "duplicate node": (
        _set("clusters.0.nodes.3.name", "dgx-1"),
        rf"{A100}\.nodes\[3\]\.name: duplicate node name 'dgx-1' \(also nodes\[1\]\)",
    ),
    "group name clash": (
        _set("clusters.1.nodes.0.name", "eun-v100-v4-2"),
        rf"{V100}\.node_groups\[0\]: duplicate node name 'eun-v100-v4-2' \(also nodes\[0\]\)",
    ),
    "bad node name": (
        _set("clusters.0.nodes.0.name", "dgx 0"),
        rf"{A100}\.nodes\[0\]\.name: must be a name of letters",
    ),
    "bad cluster name": (_set("clusters.0.name", "us/west"), r"clusters\[0\]\.name: must be a name of letters"),
    "unknown region": (
        _set("clusters.1.region", "mars"),
        rf"{V100}\.region: 'mars' is not a region of this file \(us-west, eu-north\)",
    ),
    "unknown gpu_model": (
        _set("clusters.1.gpu_model", "H200"),
        rf"{V100}\.gpu_model: 'H200' is not a model of this file's gpu_models",
    ),
    "other node model": (
        _set("clusters.0.nodes.2.gpu_model", "V100"),
        rf"{A100}\.nodes\[2\]\.gpu_model: 'V100' differs from the cluster's gpu_model 'A100'; "
        "a cluster holds one GPU model",
    ),
    "pue low": (_set("clusters.0.pue", 0.5), rf"{A100}\.pue: must be a number in \[1, 3\], got 0\.5"),
    "pue high": (_set("clusters.0.pue", 3.5), rf"{A100}\.pue: must be a number in \[1, 3\], got 3\.5"),
    "pue text": (_set("clusters.0.pue", "low"), rf"{A100}\.pue: must be a number in \[1, 3\], got 'low'"),
    "weight": (_set("clusters.0.weight", 0), rf"{A100}\.weight: must be a positive number"),
    "executor kind": (
        _set("clusters.1.executor.kind", "ssh"),
        rf"{V100}\.executor\.kind: 'ssh' is not an executor kind \(replay, files, slurm, kubernetes\)",
    ),
    "executor not a mapping": (
        _set("clusters.0.executor", "slurm"),
        rf"{A100}\.executor: must be a mapping, got 'slurm'",
    ),
    "password": (
        _set("clusters.1.executor.password", "hunter2"),
        rf"{V100}\.executor\.password: looks like a secret.*environment variable \(password_env: PASSWORD\)"
        ".*Airflow Connection id",
    ),
    "nested token": (
        _set("clusters.1.executor.auth", {"Bearer-Token": "x"}),
        rf"{V100}\.executor\.auth\.Bearer-Token: looks like a secret",
    ),
    "api key": (_set("clusters.1.executor.API_KEY", "k"), rf"{V100}\.executor\.API_KEY: looks like a secret"),
    "secret in a list": (
        _set("clusters.1.executor.hosts", [{"ssh_key": "..."}]),
        rf"{V100}\.executor\.hosts\[0\]\.ssh_key: looks like a secret",
    ),
    "env holding a value": (
        _set("clusters.1.executor.token_env", "eyJhbGciOi.J9"),
        rf"{V100}\.executor\.token_env: must name an environment variable",
    ),
    "power_profile": (_set("gpu_models.A100.power_profile", "a40"), r"gpu_models\.A100\.power_profile: .*GPU_MAP"),
    "model without speed": (
        _drop("gpu_models.A100.relative_speed"),
        r"gpu_models\.A100: needs gavel or relative_speed",
    ),
    "gavel type": (_set("gpu_models.V100.gavel", "a100"), r"gpu_models\.V100\.gavel: 'a100' is not a Gavel GPU type"),
    "region without zone": (_set("regions.eu-north", {}), r"regions\.eu-north: missing key 'zone'"),
    "version": (_set("version", 2), r"fleet\.yaml: version: must be 1, got 2"),
}


@pytest.mark.parametrize("case", list(BAD_FLEETS))
def test_bad_fleet_names_file_cluster_and_field(case):
    edit, message = BAD_FLEETS[case]
    with pytest.raises(ValueError, match=message):
        fleet_from_spec(_broken(edit), "fleet.yaml")


def test_executor_references_to_secrets_are_allowed():
    spec = _declared_spec()
    spec["clusters"][0]["executor"] = {
        "kind": "kubernetes",
        "namespace": "gpu-jobs",
        "token_file": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "kubeconfig_path": "~/.kube/config",
        "password_env": "K8S_PASSWORD",
        "api_conn_id": "k8s_default",
    }
    f = fleet_from_spec(spec, "fleet.yaml")
    assert f.clusters[0].executor.kind == "kubernetes" and f.clusters[0].executor.settings["namespace"] == "gpu-jobs"
    for kind in EXECUTOR_KINDS:
        spec["clusters"][0]["executor"] = {"kind": kind}
        assert fleet_from_spec(spec, "fleet.yaml").clusters[0].executor.kind == kind


def test_bad_fleet_file_is_named(tmp_path):
    path = tmp_path / "ops-fleet.yaml"
    spec = _declared_spec()
    spec["clusters"][1]["node_groups"][0]["gpus"] = 0
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=re.escape(f"{path}: clusters[1] (eun-v100).node_groups[0].gpus: must be")):
        load_fleet(path)
    path.write_text("clusters: [\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}: not valid YAML")):
        load_fleet(path)


# Values that are wrong wherever they go (no valid name, region, model, kind, count or number among them).
_JUNK = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(max_value=0),
        st.integers(min_value=10**13),
        st.floats(max_value=0.0),
        st.floats(min_value=1e13),
        st.just(float("nan")),
        st.text(max_size=6).filter(lambda s: not NAME_PATTERN.fullmatch(s)),
    ),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and value == value


_BAD_PUE = st.one_of(st.floats(max_value=0.999), st.floats(min_value=3.001), _JUNK)
_SECRET_KEY = st.tuples(st.sampled_from(["", "db_", "x-"]), st.sampled_from(SECRET_WORDS)).map("".join)
# (where in cluster 1, key, bad value): where is "cluster", "node" (nodes[0]), "group" (node_groups[0]), "executor"
_MUTATIONS = st.one_of(
    st.tuples(st.just("cluster"), st.sampled_from(["name", "region", "gpu_model"]), _JUNK),
    st.tuples(st.just("cluster"), st.just("weight"), _JUNK.filter(lambda v: not _positive(v))),
    st.tuples(st.just("cluster"), st.just("pue"), _BAD_PUE),
    st.tuples(st.just("cluster"), st.sampled_from(["nodes", "node_groups"]), _JUNK | st.just([])),
    st.tuples(st.just("cluster"), st.sampled_from(["source", "gpus"]), _JUNK | st.just("openb") | st.just(64)),
    st.tuples(st.just("cluster"), st.text(min_size=1, max_size=8).filter(lambda k: k not in CLUSTER_KEYS), _JUNK),
    st.tuples(st.just("cluster"), st.just("executor"), _JUNK.filter(lambda v: not isinstance(v, dict))),
    st.tuples(st.just("node"), st.sampled_from(["name", "gpus", "cpu_milli", "memory_mib", "gpu_model"]), _JUNK),
    st.tuples(st.just("node"), st.sampled_from(["cpus", "memory_gib", "rack"]), _JUNK),
    st.tuples(st.just("group"), st.sampled_from(["count", "name_prefix", "gpus", "cpus", "memory_gib"]), _JUNK),
    st.tuples(st.just("executor"), st.just("kind"), _JUNK),
    st.tuples(st.just("executor"), _SECRET_KEY, _JUNK),
    st.tuples(st.just("drop"), st.sampled_from(["name", "region", "gpu_model"]), st.none()),
    st.tuples(st.just("drop-node"), st.sampled_from(["name", "gpus", "cpu_milli", "memory_mib"]), st.none()),
    st.tuples(st.just("replace"), st.just("cluster"), _JUNK.filter(lambda v: not isinstance(v, dict))),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation=_MUTATIONS)
def test_malformed_clusters_fail_with_a_value_error_naming_the_cluster(mutation):
    spec = copy.deepcopy(_declared_spec())
    cluster = spec["clusters"][1]
    where, key, value = mutation
    if where == "cluster":
        cluster[key] = value
    elif where == "node":
        cluster["nodes"][0][key] = value
    elif where == "group":
        cluster["node_groups"][0][key] = value
    elif where == "executor":
        cluster["executor"][key] = value
    elif where == "drop":
        del cluster[key]
    elif where == "drop-node":
        del cluster["nodes"][0][key]
    else:
        spec["clusters"][1] = value
    with pytest.raises(ValueError) as err:  # any other exception type fails the test
        fleet_from_spec(spec, "fleet.yaml")
    assert str(err.value).startswith("fleet.yaml: clusters[1]"), str(err.value)


@settings(max_examples=200, deadline=None)
@given(entry=st.dictionaries(st.sampled_from(CLUSTER_KEYS) | st.text(max_size=6), _JUNK, max_size=8) | _JUNK)
def test_random_cluster_entries_fail_with_a_value_error(entry):
    spec = _declared_spec()
    spec["clusters"].insert(1, entry)
    with pytest.raises(ValueError, match=r"^fleet\.yaml: clusters\[1\]"):
        fleet_from_spec(spec, "fleet.yaml")


def test_example_operator_fleet_plans_end_to_end(data_dir):
    from scheduling.planning.session import plan_hour

    fleet = load_fleet(EXAMPLE_FLEET, data_dir=data_dir)
    assert fleet.names == ["usw-a100", "eun-v100", "euc-t4"] and fleet.zones == ["CISO", "SE", "DE"]
    assert all(c.declared and c.executor.kind == "replay" for c in fleet.clusters)
    shapes = {
        c.name: (len(c.nodes), c.max_node_gpus, c.max_node_cpu_milli, c.max_node_memory_mib) for c in fleet.clusters
    }
    assert shapes == {
        "usw-a100": (4, 8, 96000, 1024 * 1024),
        "eun-v100": (16, 4, 48000, 384 * 1024),
        "euc-t4": (8, 8, 64000, 512 * 1024),
    }
    for name in fleet.gpu_models:
        assert map_gpu_type(name).curve != DEFAULT_CURVE, name  # every model borrows a profiled power curve
    t = pd.Timestamp("2021-07-15T12:00Z")
    jobs = generate_jobs(12, t, 1, fleet, seed=1, data_dir=data_dir, arrival="all-at-start")
    plan = plan_hour(t, jobs, fleet=fleet, forecasts="naive", data_dir=data_dir)
    a = plan.assignments
    assert plan.summary()["n_assigned"] == len(jobs) and len(plan.unplaced) == 0
    assert set(a["cluster"]) <= set(fleet.names) and a["expected_kgco2e"].notna().all()
    started = a[a["node"].notna()]
    assert len(started) > 0
    for cluster, node in zip(started["cluster"], started["node"]):
        assert node in set(fleet.clusters[fleet.index(cluster)].nodes["sn"])  # placed on a declared node


def test_fleet_path_selects_the_hourly_plans_fleet(monkeypatch, tmp_warehouse, data_dir):
    from scheduling import loop
    from scheduling.queue.intake import submit_mappings
    from scheduling.queue.trace import trace_jobs
    from scheduling.service import plan_fleet, validate_inputs

    monkeypatch.delenv("FLEET_PATH", raising=False)
    assert fleet_path() == DEFAULT_FLEET_PATH
    assert fleet_regions()[:2] == ["us-west", "us-south"]
    monkeypatch.setenv("FLEET_PATH", "docs/examples/fleet.yaml")  # relative: from the checkout root
    assert fleet_path() == EXAMPLE_FLEET
    assert fleet_regions() == ["us-west", "eu-north", "eu-central"]
    assert validate_inputs("2021-07-15T12:00Z", "rolling-lp", ["eu-north"])["regions"] == ["eu-north"]
    with pytest.raises(ValueError, match=r"region\(s\) \['us-south'\] not in the fleet .*docs/examples/fleet\.yaml"):
        validate_inputs("2021-07-15T12:00Z", "rolling-lp", ["us-south"])
    jobs = trace_jobs("2021-07-15", 96, plan_fleet(None, data_dir), data_dir=data_dir)
    assert submit_mappings(jobs, source="test", as_of="2021-07-16T00:00Z", data_dir=data_dir).counts["accepted"] > 0
    ctx = loop.context("2021-07-15T12:00Z", data_dir=data_dir)
    assert set(ctx.executors) == {"usw-a100", "eun-v100", "euc-t4"}
    plan, info, _ = loop.plan(ctx, dry_run=True)
    assert info["n_jobs"] > 0 and len(plan.assignments) > 0
    assert set(plan.assignments["cluster"]) <= {"usw-a100", "eun-v100", "euc-t4"}
    monkeypatch.setenv("FLEET_PATH", str(EXAMPLE_FLEET.with_name("missing.yaml")))
    with pytest.raises(ValueError, match="missing.yaml"):
        fleet_regions()
