"""Every manifest the planner hands to Kubernetes is valid against the client's OpenAPI models: deserialized as
V1Pod / V1CronJob / RBAC objects (required fields present) and serialized back unchanged (no unknown field, no
value of the wrong type). Also the GPU-sharing requests per mechanism and the plan-to-cluster clock."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from kubernetes.client import ApiClient

from scheduling.domain.plan import Plan
from scheduling.executors.clock import PlanClock
from scheduling.executors.items import check_items
from scheduling.executors.k8s_pods import LATEST_START, pod_manifest
from scheduling.executors.k8s_sharing import GpuSharing
from scheduling.output.schedules import GATE_NAME, write_schedules
from tests.conftest import REPO_ROOT
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

SHARINGS = {
    "none": None,
    "time-slicing": {"mechanism": "time-slicing", "replicas": 10},
    "mig": {"mechanism": "mig", "profiles": ["1g.10gb", "3g.40gb", "7g.80gb"]},
    "gpushare": {"mechanism": "gpushare", "gpu_memory_gib": 32},
}
KINDS = {"Pod": "V1Pod", "CronJob": "V1CronJob", "DaemonSet": "V1DaemonSet", "ServiceAccount": "V1ServiceAccount",
         "Role": "V1Role", "RoleBinding": "V1RoleBinding"}  # fmt: skip


class _Response:
    def __init__(self, doc: dict):
        self.data = json.dumps(doc)


def check_model(doc: dict) -> None:
    """`doc` deserializes as its kind's model and serializes back to itself."""
    client = ApiClient()
    model = client.deserialize(_Response(doc), KINDS[doc["kind"]])  # raises on a missing required field
    assert client.sanitize_for_serialization(model) == json.loads(json.dumps(doc))


def _pods(sharing) -> list[dict]:
    items = check_items(sample_items(6)).to_dict(orient="records")
    clock = PlanClock.from_setting({"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"})
    return [
        pod_manifest(
            row,
            plan_id_at(),
            executor="kubernetes",
            namespace="gpu-jobs",
            clock=clock,
            sharing=GpuSharing.from_setting(sharing),
            fail_open_after=pd.Timedelta(hours=1),
        )
        for row in items
    ]


@pytest.mark.parametrize("mechanism", sorted(SHARINGS))
def test_executor_pods_are_valid_v1_pods(mechanism):
    for pod in _pods(SHARINGS[mechanism]):
        check_model(pod)
        spec = pod["spec"]
        assert spec["schedulingGates"] == [{"name": GATE_NAME}] and "nodeName" not in spec
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert pod["metadata"]["annotations"][LATEST_START] == "2026-11-26T13:00:00Z"  # start + 1 h, wall clock


def test_shared_jobs_request_what_the_cluster_shares():
    limits = {m: [p["spec"]["containers"][0]["resources"]["limits"] for p in _pods(s)] for m, s in SHARINGS.items()}
    # sample job 0 is shared (500 milli on 1 GPU), job 1 whole (2 GPUs)
    assert limits["none"][0]["nvidia.com/gpu"] == "1"
    assert limits["time-slicing"][0]["nvidia.com/gpu"] == "5"
    assert limits["mig"][0]["nvidia.com/mig-7g.80gb"] == "1"
    assert limits["gpushare"][0]["aliyun.com/gpu-mem"] == "16"
    assert all(v[1]["nvidia.com/gpu"] == "2" for v in limits.values())


@pytest.mark.parametrize(
    ("setting", "milli", "count", "expected"),
    [
        ({"mechanism": "mig", "profiles": ["3g.40gb", "1g.10gb"]}, 100, 1, {"nvidia.com/mig-1g.10gb": "1"}),
        ({"mechanism": "mig", "profiles": ["3g.40gb", "1g.10gb"]}, 400, 2, {"nvidia.com/mig-3g.40gb": "2"}),
        ({"mechanism": "mig", "profiles": ["1g.10gb"]}, 500, 1, {"nvidia.com/gpu": "1"}),
        ({"mechanism": "time-slicing", "replicas": 4, "resource": "nvidia.com/gpu.shared"}, 100, 1,
         {"nvidia.com/gpu.shared": "1"}),
        ({"mechanism": "gpushare", "gpu_memory_gib": 15}, 250, 1, {"aliyun.com/gpu-mem": "4"}),
        ("none", 0, 0, {}),
    ],
)  # fmt: skip
def test_sharing_limits(setting, milli, count, expected):
    assert GpuSharing.from_setting(setting).limits(milli, count) == expected


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"mechanism": "time-slicing"}, "replicas"),
        ({"mechanism": "mig", "profiles": ["half"]}, "profiles"),
        ({"mechanism": "gpushare"}, "gpu_memory_gib"),
        ({"mechanism": "mig", "replicas": 2, "profiles": ["1g.10gb"]}, "unknown key"),
    ],
)
def test_bad_sharing_settings(setting, message):
    with pytest.raises(ValueError, match=message):
        GpuSharing.from_setting(setting)


def test_schedule_file_pods_are_valid_v1_pods(tmp_path):
    plan = Plan(plan_time=PLAN_TIME, policy="priority", assignments=check_items(sample_items(6)))
    result = write_schedules(plan, tmp_path, plan_id=plan_id_at())
    pods = sorted((result.path / "k8s").rglob("*.yaml"))
    assert len(pods) == 6
    for path in pods:
        check_model(yaml.safe_load(path.read_text()))


def test_gate_release_manifests_are_valid():
    docs = list(yaml.safe_load_all((Path(REPO_ROOT) / "deploy/kubernetes/gate-release.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "CronJob"]
    for doc in docs:
        check_model(doc)


def test_power_agent_manifests_are_valid_and_in_the_kustomization():
    root = Path(REPO_ROOT) / "deploy/kubernetes"
    docs = list(yaml.safe_load_all((root / "power-agent.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "DaemonSet"]
    for doc in docs:
        check_model(doc)
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert "power-agent.yaml" in kustomization["resources"]
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated["power-agent"] == ["power_agent.py", "k8s_rest.py"]  # the script and the API client it imports
    assert docs[-1]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == "power-agent"
    for files in generated.values():
        assert all((root / f).is_file() for f in files)


def test_clock_maps_both_ways():
    clock = PlanClock.from_setting(
        {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z", "seconds_per_hour": 360}
    )
    assert clock.to_wall("2021-07-15T10:00Z") == pd.Timestamp("2026-11-26T01:00Z")
    assert clock.to_plan("2026-11-26T01:00Z") == pd.Timestamp("2021-07-15T10:00Z")
    assert PlanClock.from_setting(None).to_wall("2021-07-15T10:00Z") == pd.Timestamp("2021-07-15T10:00Z")
    with pytest.raises(ValueError, match="together"):
        PlanClock.from_setting({"plan_origin": "2021-07-15T00:00Z"})


@pytest.mark.parametrize(
    "breakage",
    [
        lambda pod: pod["spec"].pop("containers"),  # required
        lambda pod: pod["spec"].update(schedulingGate=[{"name": GATE_NAME}]),  # unknown field
        lambda pod: pod["spec"].update(activeDeadlineSeconds="3600"),  # wrong type
    ],
)
def test_the_check_catches_invalid_pods(breakage):
    pod = _pods(None)[0]
    breakage(pod)
    with pytest.raises((ValueError, AssertionError)):
        check_model(pod)
