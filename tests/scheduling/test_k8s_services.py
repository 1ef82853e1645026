"""Inference services through the kubernetes executor, against the local recording API server: the loop's scalings
(`plan.service_scalings`) create the service's Deployment in the cluster's connection (replicas, GPUs per replica,
the batch cap as argument, env and annotation, node affinity to the planned nodes), scale it in a later hour with one
tested JSON patch, and scale it to 0 when the service leaves the cluster; each scaling reaches the API once, also
across a crash between the call and its mark."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scheduling.executors.k8s_services import BATCH_CAP, SCALINGS, deployment_name
from scheduling.executors.registry import make_executor
from scheduling.executors.service_log import apply_scalings, read_scalings, record_scalings
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at
from tests.scheduling.k8s_api_server import KubeApiServer

H = pd.Timedelta(hours=1)
NS = "gpu-jobs"
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}
SERVICE = "ml/chat"
CURVE = "mlenergy-v3|lm-arena-chat|meta-llama/Llama-3.1-70B-Instruct|H100|4|4|1"


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as server:
        yield server


def _scaling(cluster: str, replicas: int, batch_cap: int, nodes: str = "", before: int = 0) -> dict:
    return {
        "job_id": f"{SERVICE}@{cluster}", "service": SERVICE, "tenant": "ml", "service_id": "chat",
        "cluster": cluster, "from_replicas": before, "replicas": replicas, "num_gpus": 4, "tensor_parallel": 4,
        "batch_cap": batch_cap, "model": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "H100", "task": "lm-arena-chat",
        "curve": CURVE, "latency_slo_ms": 100.0, "rate_source": "servegen:language/m-large", "rate_scale": 0.25,
        "nodes": nodes,
    }  # fmt: skip


def _deployments(api) -> dict:
    return {name: d for (ns, name), d in api.deployments.items() if ns == NS}


def test_scalings_create_scale_and_stop_the_deployment_once(api, tmp_warehouse):
    executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
    assert executor.serves
    executor_of = {"usw-h100": executor}
    first = plan_id_at(PLAN_TIME)
    record_scalings(first, pd.DataFrame([_scaling("usw-h100", 2, 256, "dgx-1,dgx-2")]), executor_of, tmp_warehouse)
    done = apply_scalings(first, executor, tmp_warehouse)
    assert done["sent"] == [f"{SERVICE}@usw-h100"]
    name = deployment_name(SERVICE)
    d = _deployments(api)[name]
    container = d["spec"]["template"]["spec"]["containers"][0]
    assert d["spec"]["replicas"] == 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["args"][container["args"].index("--max-num-seqs") + 1] == "256"
    assert {"name": "MAX_NUM_SEQS", "value": "256"} in container["env"]
    assert d["metadata"]["annotations"][BATCH_CAP] == "256"
    terms = d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["dgx-1", "dgx-2"]
    assert json.loads(d["metadata"]["annotations"][SCALINGS]) == [
        {"at": "2021-07-15T12:00:00Z", "wall": "2026-11-26T12:00:00Z", "replicas": 2, "batch_cap": 256,
         "plan_id": first}
    ]  # fmt: skip

    # the next hour: 3 replicas at a smaller cap, one JSON patch that tests the history it read
    second = plan_id_at(PLAN_TIME + H)
    record_scalings(second, pd.DataFrame([_scaling("usw-h100", 3, 128, "dgx-1,dgx-2,dgx-3", 2)]), executor_of,
                    tmp_warehouse)  # fmt: skip
    patches = [r for r in api.requests if r["method"] == "PATCH"]
    assert apply_scalings(second, executor, tmp_warehouse)["sent"] == [f"{SERVICE}@usw-h100"]
    patch = [r for r in api.requests if r["method"] == "PATCH"][len(patches) :]
    assert len(patch) == 1 and patch[0]["body"][0]["op"] == "test"
    d = _deployments(api)[name]
    assert d["spec"]["replicas"] == 3 and d["metadata"]["annotations"][BATCH_CAP] == "128"
    assert {"name": "MAX_NUM_SEQS", "value": "128"} in d["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [s["plan_id"] for s in json.loads(d["metadata"]["annotations"][SCALINGS])] == [first, second]

    # carrying out the hours again sends nothing
    before = len(api.requests)
    for plan_id in (first, second):
        again = apply_scalings(plan_id, executor, tmp_warehouse)
        assert again["skipped"] and not again["sent"]
    assert all(r["method"] == "GET" for r in api.requests[before:])

    # a crash after the API took the scaling, before its mark: the re-run finds it (reconciled), no second patch
    third = plan_id_at(PLAN_TIME + 2 * H)
    record_scalings(third, pd.DataFrame([_scaling("usw-h100", 0, 128, "", 3)]), executor_of, tmp_warehouse)

    def crash(stage):
        raise RuntimeError(stage)

    with pytest.raises(RuntimeError):
        apply_scalings(third, executor, tmp_warehouse, _fault=crash)
    assert read_scalings(third, tmp_warehouse)["status"].tolist() == ["intent"]
    patches = sum(r["method"] == "PATCH" for r in api.requests)
    assert apply_scalings(third, executor, tmp_warehouse)["reconciled"] == [f"{SERVICE}@usw-h100"]
    assert sum(r["method"] == "PATCH" for r in api.requests) == patches
    assert _deployments(api)[name]["spec"]["replicas"] == 0  # stopped there, its history kept


def test_a_scaling_to_zero_where_nothing_runs_creates_nothing(api, tmp_warehouse):
    executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
    plan = plan_id_at(PLAN_TIME)
    record_scalings(plan, pd.DataFrame([_scaling("use-h100", 0, 256)]), {"use-h100": executor}, tmp_warehouse)
    assert apply_scalings(plan, executor, tmp_warehouse)["sent"] == [f"{SERVICE}@use-h100"]
    assert not api.deployments
