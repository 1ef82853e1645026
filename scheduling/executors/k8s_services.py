"""Inference services on Kubernetes: one Deployment per service and cluster, scaled by the plan's scalings.

The Deployment (`deployment_manifest`) runs the serving image (a vLLM OpenAI server by default; executor setting
``serving_image``) with the model, its tensor parallelism and the batch cap (``--max-num-seqs``, also
``MAX_NUM_SEQS`` in the env), ``nvidia.com/gpu`` = GPUs per replica, node affinity to the nodes the plan bound the
replicas to, and the annotations ``carbonplanner.io/batch-cap`` and ``carbonplanner.io/scalings``: every scaling
as JSON (plan time, the cluster's time, replicas, batch cap, the deciding plan: its idempotency key, which
`scaling_ref` reads back). A later scaling is one JSON patch: a `test` of the scalings annotation as read (a
concurrent writer fails the patch), the new replicas, batch cap and env; a changed batch cap rolls the Pods, as
vLLM reads it at start. Scaling to 0 keeps the Deployment (its history stays readable). The GPUs' power limit stays
the device default: the serving data has no other. What the replicas served is not read back yet (their vLLM
metrics); `service_usage` reports none.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

from common.timeutil import iso_z
from scheduling.executors.k8s_pods import EXECUTOR_LABEL, MANAGED_BY, json_pointer
from scheduling.output.schedules import DOMAIN, dns_label

DEFAULT_SERVING_IMAGE = "vllm/vllm-openai:v0.8.5"
SERVICE_LABEL = f"{DOMAIN}/service"
BATCH_CAP = f"{DOMAIN}/batch-cap"
SCALINGS = f"{DOMAIN}/scalings"
KEEP_SCALINGS = 48  # the history kept on the Deployment (the action log asks only for the latest plan's)


def deployment_name(service: str) -> str:
    """A DNS-1123 name for the service `tenant/service_id` (a hash suffix keeps distinct services apart)."""
    digest = hashlib.sha256(service.encode()).hexdigest()[:8]
    return f"svc-{dns_label(service.replace('/', '-'))[:48].rstrip('-')}-{digest}"


def service_label(service: str) -> str:
    return hashlib.sha256(service.encode()).hexdigest()[:40]


def scalings(deployment: dict) -> list[dict]:
    raw = ((deployment.get("metadata") or {}).get("annotations") or {}).get(SCALINGS)
    return json.loads(raw) if raw else []


def _container(provision: dict) -> dict:
    cap = str(int(provision["batch_cap"]))
    return {
        "name": "server",
        "args": [
            "--model",
            str(provision["model"]),
            "--tensor-parallel-size",
            str(int(provision["tensor_parallel"])),
            "--max-num-seqs",
            cap,
        ],  # fmt: skip
        "env": [{"name": "MAX_NUM_SEQS", "value": cap}, {"name": "SERVED_MODEL", "value": str(provision["model"])}],
        "resources": {"limits": {"nvidia.com/gpu": str(int(provision["num_gpus"]))}},
        "ports": [{"containerPort": 8000, "name": "http"}],
    }


def _affinity(nodes) -> dict:
    names = [n for n in str(nodes or "").split(",") if n]
    if not names:
        return {}
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(set(names))}]}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    }


def scaling_record(plan_id: str, at: pd.Timestamp, wall: pd.Timestamp, provision: dict) -> dict:
    return {
        "plan_id": plan_id,
        "at": iso_z(at),
        "wall": iso_z(wall),
        "replicas": int(provision["replicas"]),
        "batch_cap": int(provision["batch_cap"]),
    }


def deployment_manifest(
    service: str, provision: dict, record: dict, *, executor: str, namespace: str, image: str
) -> dict:
    """A new Deployment of the service in one cluster (see the module doc)."""
    labels = {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        EXECUTOR_LABEL: dns_label(executor),
        SERVICE_LABEL: service_label(service),
    }
    container = {"image": image, **_container(provision)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(service),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                f"{DOMAIN}/service-id": service,
                BATCH_CAP: str(int(provision["batch_cap"])),
                SCALINGS: json.dumps([record], sort_keys=True, separators=(",", ":")),
            },
        },
        "spec": {
            "replicas": int(provision["replicas"]),
            "selector": {"matchLabels": {SERVICE_LABEL: service_label(service)}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], **_affinity(provision.get("nodes"))},
            },
        },
    }


def scaling_patch(deployment: dict, provision: dict, record: dict) -> list[dict]:
    """The JSON patch that scales an existing Deployment (see the module doc)."""
    raw = ((deployment.get("metadata") or {}).get("annotations") or {}).get(SCALINGS)
    history = ([*scalings(deployment), record])[-KEEP_SCALINGS:]
    base = "/metadata/annotations/"
    ops = [{"op": "test", "path": base + json_pointer(SCALINGS), "value": raw}] if raw is not None else []
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    fresh = _container(provision)
    ops += [
        {"op": "add", "path": base + json_pointer(SCALINGS), "value": json.dumps(history, sort_keys=True,
                                                                                  separators=(",", ":"))},
        {"op": "add", "path": base + json_pointer(BATCH_CAP), "value": str(int(provision["batch_cap"]))},
        {"op": "replace", "path": "/spec/replicas", "value": int(provision["replicas"])},
    ]  # fmt: skip
    if container.get("args") != fresh["args"] or container.get("env") != fresh["env"]:
        ops += [
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": fresh["args"]},
            {"op": "replace", "path": "/spec/template/spec/containers/0/env", "value": fresh["env"]},
            {"op": "replace", "path": "/spec/template/spec/containers/0/resources", "value": fresh["resources"]},
        ]
    affinity = _affinity(provision.get("nodes"))
    if affinity:
        ops.append({"op": "add", "path": "/spec/template/spec/affinity", "value": affinity["affinity"]})
    return ops
