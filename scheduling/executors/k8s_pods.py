"""The Pod the `kubernetes` executor creates for one dispatch item, and what it reads back from a Pod.

The Pod is the schedule file's (`scheduling.output.schedules.k8s_manifest`: scheduling gate, init container that
waits for the start, image and command from queue.jobs, power limit in the env) with the cluster's side filled in:

* times on the cluster's clock (`clock.PlanClock`): the gate annotation, the init container's wait and the deadline;
* the planned node as a required node affinity on ``kubernetes.io/hostname`` (a gated Pod may not set nodeName);
* the GPU request of the cluster's sharing mechanism (`k8s_sharing`);
* ``restartPolicy: Never``: a failed attempt ends as phase Failed, and the planner decides on a retry;
* identity: the name and the label ``carbonplanner.io/dispatch-key`` derive from (plan_id, job_id), so a second
  create of one dispatch is refused by the API server (409) and `lookup` finds it by label;
* ``carbonplanner.io/latest-start`` (wall clock): the fail-open time at which the gate-release CronJob
  (deploy/kubernetes/) releases a still gated Pod without the planner; ``carbonplanner.io/item``: the dispatch
  item's fields in plan time (JSON), from which events and running jobs are reported;
* the finalizer ``carbonplanner.io/events``: a Pod deleted (the Pod garbage collector, a node drain, ``kubectl
  delete``) stays readable until the executor has reported its last event, so no run ends unreported;
* power limits: ``carbonplanner.io/power-limit-w`` is the GPU power limit in force (the dispatch limit, then each
  change's), ``carbonplanner.io/power-limits`` the append-only list of changes (JSON objects: ``at`` plan time,
  ``wall`` the cluster's clock, ``watts``, ``plan_id`` of the deciding plan), from which events are reported; the
  node agent of deploy/kubernetes/ applies the limit in force to the Pod's GPUs and records it in
  ``carbonplanner.io/power-limit-applied-w``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.executors.clock import PlanClock
from scheduling.executors.k8s_sharing import WHOLE_GPU, GpuSharing
from scheduling.output.plan_store import parse_plan_id
from scheduling.output.schedules import DOMAIN, GATE_NAME, dns_label, k8s_manifest

MANAGED_BY = "carbon-planner"
KEY_LABEL = f"{DOMAIN}/dispatch-key"
EXECUTOR_LABEL = f"{DOMAIN}/executor"
ITEM_ANNOTATION = f"{DOMAIN}/item"
LATEST_START = f"{DOMAIN}/latest-start"
CANCELLED_AT = f"{DOMAIN}/cancelled-at"
PREEMPTED = f"{DOMAIN}/preempted"  # JSON {at (plan time), plan_id}: the Pod was stopped at a checkpoint
FINALIZER = f"{DOMAIN}/events"
POWER_LIMIT = f"{DOMAIN}/power-limit-w"
POWER_LIMITS = f"{DOMAIN}/power-limits"
POWER_APPLIED = f"{DOMAIN}/power-limit-applied-w"
MAIN = "main"
ITEM_FIELDS = (
    "job_id",
    "tenant",
    "queue_job_id",
    "plan_id",
    "attempt",
    "cluster",
    "node",
    "gpu_devices",
    "gpu_count",
    "gpu_milli",
    "power_limit_w",
    "start_time",
    "end_time",
    "work_done",
)


def dispatch_key(plan_id: str, job_id: str) -> str:
    """The label value that names one dispatch (plan_id, job_id): 40 hex characters."""
    return hashlib.sha256(f"{plan_id}\x1f{job_id}".encode()).hexdigest()[:40]


def pod_name(plan_id: str, job_id: str) -> str:
    return f"{dns_label(job_id)[:50].rstrip('-')}-{dispatch_key(plan_id, job_id)[:12]}"


def selector(executor: str, **labels: str) -> str:
    """The label selector of this executor's Pods (and `labels`)."""
    pairs = {"app.kubernetes.io/managed-by": MANAGED_BY, EXECUTOR_LABEL: dns_label(executor), **labels}
    return ",".join(f"{k}={v}" for k, v in pairs.items())


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        return iso_z(value)
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def latest_start(row: dict, clock: PlanClock, fail_open_after: pd.Timedelta) -> pd.Timestamp:
    """The wall-clock time by which a gated Pod is released without the planner: the latest start that still
    meets the deadline (deadline - planned duration), else the planned start + `fail_open_after`; never before the
    planned start."""
    start, end = utc(row["start_time"]), utc(row["end_time"])
    deadline = _plain(row.get("deadline"))
    latest = utc(deadline) - (end - start) if deadline is not None else start + fail_open_after
    return clock.to_wall(max(start, latest))


def pod_manifest(
    row: dict,
    plan_id: str,
    *,
    executor: str,
    namespace: str,
    clock: PlanClock,
    sharing: GpuSharing,
    fail_open_after: pd.Timedelta,
) -> dict:
    """The Pod for dispatch item `row` (a `check_items` record) under `plan_id` (see the module doc)."""
    policy, plan_time, _ = parse_plan_id(plan_id)
    wall = dict(row)
    for key in ("start_time", "end_time", "deadline"):
        if _plain(row.get(key)) is not None:
            wall[key] = clock.to_wall(row[key])
    meta = {
        "plan_id": plan_id,
        "plan_time": iso_z(plan_time),
        "policy": policy,
        "forecast_version": _plain(row.get("forecast_version")),
    }
    pod = k8s_manifest(wall, meta)
    key = dispatch_key(plan_id, str(row["job_id"]))
    metadata, spec = pod["metadata"], pod["spec"]
    metadata["name"] = pod_name(plan_id, str(row["job_id"]))
    metadata["namespace"] = namespace
    metadata["labels"].update({KEY_LABEL: key, EXECUTOR_LABEL: dns_label(executor)})
    metadata["finalizers"] = [FINALIZER]
    item = {k: _plain(row.get(k)) for k in ITEM_FIELDS}
    item["plan_id"] = plan_id
    metadata["annotations"].update(
        {
            ITEM_ANNOTATION: json.dumps(item, sort_keys=True, separators=(",", ":")),
            LATEST_START: iso_z(latest_start(row, clock, fail_open_after)),
        }
    )
    if item["power_limit_w"] is not None:  # the plan's limit as the node agent applies it, not rounded to watts
        metadata["annotations"][POWER_LIMIT] = watts_text(item["power_limit_w"])
    if (item.get("work_done") or 0) > 0:  # it resumes from the job's checkpoint (docs/operating.md, Kubernetes)
        spec["containers"][0].setdefault("env", []).append(
            {"name": "CHECKPOINT_WORK_DONE", "value": str(round(float(item["work_done"]), 6))}
        )
    spec["restartPolicy"] = "Never"
    host = spec.pop("nodeSelector", {}).get("kubernetes.io/hostname")
    if host:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    limits = spec["containers"][0]["resources"]["limits"]
    limits.pop(WHOLE_GPU, None)
    count = int(_plain(row.get("gpu_count")) or 0)
    milli = int(_plain(row.get("gpu_milli")) or (1000 if count else 0))
    limits.update(sharing.limits(milli, count))
    return pod


def pod_item(pod: dict) -> dict | None:
    """The dispatch item fields a Pod carries (plan times as Timestamps); None for a Pod without them."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ITEM_ANNOTATION)
    if not raw:
        return None
    item = json.loads(raw)
    for key in ("start_time", "end_time"):
        item[key] = utc(item[key])
    return item


def is_gated(pod: dict) -> bool:
    return any(g.get("name") == GATE_NAME for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def deletion_time(pod: dict) -> str | None:
    """When the Pod was deleted (wall clock, ISO), None while it is not being deleted."""
    return (pod.get("metadata") or {}).get("deletionTimestamp")


def finalizer_removal(pod: dict) -> list[dict] | None:
    """The JSON patch that removes the executor's finalizer from `pod` (tested first, so that a concurrent change
    refuses it), None when the Pod does not carry it."""
    held = (pod.get("metadata") or {}).get("finalizers") or []
    if FINALIZER not in held:
        return None
    path = f"/metadata/finalizers/{held.index(FINALIZER)}"
    return [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]


def main_state(pod: dict) -> dict:
    """The main container's state (``running`` / ``terminated`` / ``waiting``), {} before it has one."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == MAIN:
            return status.get("state") or {}
    return {}


def watts_text(watts: float) -> str:
    """A power limit as the annotation holds it: watts, at most two decimals, no trailing zeros."""
    return f"{round(float(watts), 2):.2f}".rstrip("0").rstrip(".")


def power_changes(pod: dict) -> list[dict]:
    """The Pod's power-limit changes (``at`` as a plan-time Timestamp, ``watts``, ``plan_id``) in order; ValueError
    naming the Pod when the annotation is not such a list."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(POWER_LIMITS)
    if not raw:
        return []
    name = (pod.get("metadata") or {}).get("name")
    try:
        changes = [
            {"at": utc(c["at"]), "wall": c.get("wall"), "watts": float(c["watts"]), "plan_id": str(c["plan_id"])}
            for c in json.loads(raw)
        ]
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"Pod {name}: annotation {POWER_LIMITS} is not a list of changes: {exc}") from None
    return changes


def power_change_patch(pod: dict, change: dict) -> list[dict]:
    """The JSON patch that appends `change` ({at, wall, watts, plan_id}; times ISO) to the Pod's changes and makes
    its watts the limit in force. It tests the list as read first, so a concurrent change refuses it (422)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(POWER_LIMITS)
    history = json.loads(raw) if raw else []
    base = "/metadata/annotations/"
    ops = [{"op": "test", "path": base + json_pointer(POWER_LIMITS), "value": raw}] if raw else []
    value = json.dumps([*history, change], sort_keys=True, separators=(",", ":"))
    return [
        *ops,
        {"op": "add", "path": base + json_pointer(POWER_LIMITS), "value": value},
        {"op": "add", "path": base + json_pointer(POWER_LIMIT), "value": watts_text(change["watts"])},
    ]


def json_pointer(key: str) -> str:
    """`key` as a JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
