"""`kubernetes`: runs dispatched jobs as gated Pods on Kubernetes clusters through the official client.

Dispatch creates one Pod per job (`k8s_pods.pod_manifest`: scheduling gate ``carbonplanner.io/start-time``, the
planned node as node affinity, the job's image and command, the power limit in the env, the GPU request of the
cluster's `sharing`). Its name and dispatch-key label derive from (plan_id, job_id): `lookup` lists by the label,
and a second create of one dispatch is refused. A job that already has a gated Pod of an earlier plan (in any of
the executor's clusters) is moved: that Pod is deleted and the new one created in the new cluster's context.

Gates: `release(now)` removes the gate of every Pod whose planned start has come (a JSON patch that tests the
gate's name before removing it); dispatch and `sync` call it, so each loop hour releases what starts then.
Fail-open: each Pod carries ``carbonplanner.io/latest-start`` (the latest start that still meets its deadline,
else start + `fail_open_after_min`), and the gate-release CronJob of deploy/kubernetes/ releases a gated Pod
whose latest start has passed with no planner running; the init container still waits for the planned start.

Clock: `now` and the events are plan time; the cluster's wall clock is `clock.to_wall(plan time)` (`clock.PlanClock`).
Nothing here reads the wall clock. `sync(now, since)` lists the Pods and reports ``dispatched`` at the plan time,
``started`` at the main container's start, ``finished`` (exit 0) / ``failed`` at its end (a Pod whose phase
says more than its container statuses: ``started`` at the Pod's start when Running or Succeeded, the end at its last
condition change), ``cancelled`` at the cancel time: the Pods' state, read at any time after the window, gives the
same events. Run the loop's hour T once the cluster's clock has passed `to_wall(T)`.

Deleted Pods: every Pod carries the finalizer ``carbonplanner.io/events``, so a Pod deleted outside the planner (the
Pod garbage collector, a node drain, ``kubectl delete``) stays readable. One that never started ends ``failed`` at
its deletion (the queue retries it while retries are left; cancel a job in the queue to stop it for good); a running
one ends as its container does. `sync(now, since)` removes the finalizer of a deleted Pod once its last event lies
before `since`, i.e. in a window the caller has loaded (the loop's windows), and Kubernetes then removes the Pod.

`running(now)`: the Pods not ended nor cancelled whose planned start is <= now, ``confirmed`` when the main
container runs, until the planned end (or the next hour after `now` once that passed). `cancel(job_id, now)`
annotates the job's live Pods with ``carbonplanner.io/cancelled-at`` (a gated Pod stays gated and holds nothing;
the release steps skip it) and stops a started one through ``activeDeadlineSeconds``.

Power limits: `set_power_limit(job_id, watts, at, plan_id=)` patches the job's running Pod: the limit in force
(``carbonplanner.io/power-limit-w``, set at dispatch to the plan's limit) and the change appended to
``carbonplanner.io/power-limits`` (plan time, the cluster's time, watts, the deciding plan: its idempotency key,
which `power_change_ref` reads back). The node agent of deploy/kubernetes/ (`power_agent.py`, a DaemonSet) applies
the limit in force to the Pod's GPUs. `sync` reports a ``power_changed`` event at each change before the run's
end, and the run's later events carry the limit then in force; `running` reports it.

Preemption: `preempt(job_id, at, plan_id=, save_h=)` annotates the job's running Pod ``carbonplanner.io/preempted``
(plan time and the deciding plan: its idempotency key, which `preemption_ref` reads back), then deletes it with a
grace period of `save_h` on the cluster's clock: the kubelet sends the container SIGTERM, the job writes its
checkpoint and exits (the finalizer keeps the Pod readable). `sync` reports its end as ``preempted``. The job's next
dispatch creates a new gated Pod, on another node or in another cluster's context, with ``CHECKPOINT_WORK_DONE`` (the
plan's share of the job done) in its env; `sync` reports its start as ``resumed``.

Settings (the fleet's ``executor:`` block): ``namespace`` (default gpu-jobs), a connection (``context`` /
``kubeconfig_path``, or ``host`` + ``token_env`` + ``ca_cert_path``, else in-cluster), ``sharing``
(`k8s_sharing`), ``clock`` (`clock.PlanClock`), ``fail_open_after_min`` (default 60), ``name``, and ``clusters``:
cluster -> connection keys and ``sharing`` overriding the above, for one executor over several clusters (then
every cluster it serves is listed there; moves between them need this), ``serving_image`` (the inference
services' server image, `k8s_services`).

Inference services: `scale_service` creates or scales one Deployment per service and cluster
(`scheduling.executors.k8s_services`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.executors.base import (
    EVENT_COLUMNS,
    RECORD_COLUMNS,
    RUNNING_COLUMNS,
    DuplicateDispatchError,
    Executor,
    check_window,
    in_window,
    plan_time_of,
    sort_events,
    typed_frame,
)
from scheduling.executors.clock import PlanClock
from scheduling.executors.items import check_items
from scheduling.executors.k8s_api import CONNECTION_KEYS, ApiError, DeploymentApi, PodApi
from scheduling.executors.k8s_pods import (
    CANCELLED_AT,
    ITEM_FIELDS,
    KEY_LABEL,
    PREEMPTED,
    deletion_time,
    dispatch_key,
    finalizer_removal,
    is_gated,
    json_pointer,
    main_state,
    pod_item,
    pod_manifest,
    power_change_patch,
    power_changes,
    selector,
)
from scheduling.executors.k8s_services import (
    DEFAULT_SERVING_IMAGE,
    deployment_manifest,
    deployment_name,
    scaling_patch,
    scaling_record,
    scalings,
)
from scheduling.executors.k8s_sharing import GpuSharing
from scheduling.output.schedules import GATE_NAME, NAMESPACE

DEFAULT = "default"
ENDED = ("Succeeded", "Failed")


def _without_other_way_in(base: dict, override: dict) -> dict:
    """`base` less its connection keys of the other kind when `override` names a kubeconfig or a host."""
    if {"context", "kubeconfig_path"} & set(override):
        return {k: v for k, v in base.items() if k not in ("host", "token_env", "ca_cert_path")}
    if "host" in override:
        return {k: v for k, v in base.items() if k not in ("context", "kubeconfig_path")}
    return base


def _annotation(pod: dict, key: str) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(key)


class KubernetesExecutor(Executor):
    """Gated Pods on Kubernetes (see the module doc)."""

    kind = "kubernetes"
    job_files = ("k8s",)
    changes_power_limits = True
    preempts = True
    serves = True
    SETTINGS = ("name", *CONNECTION_KEYS, "sharing", "clock", "fail_open_after_min", "clusters", "serving_image")

    def __init__(
        self,
        *,
        db_path=None,
        name: str | None = None,
        namespace: str = NAMESPACE,
        sharing: Mapping | str | None = None,
        clock: Mapping | None = None,
        fail_open_after_min: float = 60.0,
        clusters: Mapping[str, Mapping] | None = None,
        serving_image: str = DEFAULT_SERVING_IMAGE,
        **connection: Any,
    ):
        super().__init__(name)
        self.serving_image = str(serving_image)
        self.db_path = db_path  # unused: the Pods are the executor's whole state
        where = f"executor {self.name!r}"
        self.clock = PlanClock.from_setting(clock, f"{where}: clock")
        self.fail_open_after = pd.Timedelta(minutes=float(fail_open_after_min))
        if self.fail_open_after < pd.Timedelta(0):
            raise ValueError(f"{where}: setting 'fail_open_after_min' must be >= 0, got {fail_open_after_min!r}")
        base = {k: v for k, v in connection.items() if v is not None}
        base["namespace"] = str(namespace)
        self._connections: dict[str, dict] = {}
        self._sharing: dict[str, GpuSharing] = {}
        if clusters:
            for cluster, override in dict(clusters).items():
                override = dict(override or {})
                unknown = sorted(set(override) - {*CONNECTION_KEYS, "sharing"})
                if unknown:
                    raise ValueError(f"{where}: clusters.{cluster}: unknown setting(s) {unknown}")
                own = override.pop("sharing", sharing)
                self._connections[str(cluster)] = {**_without_other_way_in(base, override), **override}
                self._sharing[str(cluster)] = GpuSharing.from_setting(own, f"{where}: clusters.{cluster}.sharing")
        else:
            self._connections[DEFAULT] = base
            self._sharing[DEFAULT] = GpuSharing.from_setting(sharing, f"{where}: sharing")
        self._apis: dict[str, PodApi] = {}
        self._deployments: dict[str, DeploymentApi] = {}

    # ------------------------------------------------------------------------------------------- connections

    def _connection_of(self, cluster: str) -> str | None:
        if DEFAULT in self._connections:
            return DEFAULT
        return str(cluster) if str(cluster) in self._connections else None

    def api(self, connection: str) -> PodApi:
        if connection not in self._apis:
            settings = self._connections[connection]
            self._apis[connection] = PodApi(settings, settings["namespace"])
        return self._apis[connection]

    def _ref(self, connection: str, pod: dict) -> str:
        return f"{connection}/{self._connections[connection]['namespace']}/{pod['metadata']['name']}"

    def pods(self, **labels: str) -> list[tuple[str, dict]]:
        """(connection, Pod) of every Pod of this executor (with `labels`), connection by connection."""
        out = []
        for connection in self._connections:
            out += [(connection, pod) for pod in self.api(connection).list(selector(self.name, **labels))]
        return out

    # ------------------------------------------------------------------------------------------- dispatch

    def dispatch(self, plan_id: str, items: pd.DataFrame) -> pd.DataFrame:
        """Create a gated Pod per item, move the jobs' gated Pods of earlier plans, release what starts now;
        DuplicateDispatchError (before creating anything) when a Pod of one of these dispatches exists."""
        plan_time = plan_time_of(plan_id)
        items = check_items(items)
        existing = self.pods()
        keys = {(pod["metadata"].get("labels") or {}).get(KEY_LABEL) for _, pod in existing}
        dup = sorted(j for j in items["job_id"] if dispatch_key(plan_id, j) in keys)
        if dup:
            raise DuplicateDispatchError(f"executor {self.name!r}, plan {plan_id}: job(s) {dup[:5]} have Pods already")
        records = []
        for row in items.to_dict(orient="records"):
            job = row["job_id"]
            connection = self._connection_of(row["cluster"])
            if row["start_time"] < plan_time:
                error = f"start_time {row['start_time']} is before the plan's time {plan_time}"
            elif connection is None:
                error = f"cluster {row['cluster']!r} is not in the executor's setting 'clusters'"
            else:
                error = None
            if error is not None:
                records.append({"job_id": job, "executor_ref": None, "error": error})
                continue
            pod = pod_manifest(
                row,
                plan_id,
                executor=self.name,
                namespace=self._connections[connection]["namespace"],
                clock=self.clock,
                sharing=self._sharing[connection],
                fail_open_after=self.fail_open_after,
            )
            try:
                self.api(connection).create(pod)
            except ApiError as exc:
                records.append({"job_id": job, "executor_ref": None, "error": str(exc)})
                continue
            records.append({"job_id": job, "executor_ref": self._ref(connection, pod), "error": None})
            self._move(job, plan_id, existing)
        self.release(plan_time)
        return pd.DataFrame(records, columns=list(RECORD_COLUMNS))

    def _move(self, job_id: str, plan_id: str, existing: list[tuple[str, dict]]) -> None:
        """Delete the job's gated, not cancelled Pods of other plans: it now runs where `plan_id` put it."""
        for connection, pod in existing:
            item = pod_item(pod)
            if item is None or item["job_id"] != job_id or item["plan_id"] == plan_id:
                continue
            if is_gated(pod) and _annotation(pod, CANCELLED_AT) is None:
                self._drop(connection, pod)

    def _drop(self, connection: str, pod: dict) -> None:
        """Delete a Pod of this executor's own accord, without its finalizer: it never ran and leaves no events."""
        api, name = self.api(connection), pod["metadata"]["name"]
        try:
            removal = finalizer_removal(pod)
            if removal is not None:
                api.patch(name, removal)
            api.delete(name)
        except ApiError as exc:
            if exc.status not in (404, 422):  # gone, or changed meanwhile: the next move or sync sees it again
                raise

    def release(self, now) -> list[str]:
        """Remove the gate of every gated, not cancelled Pod whose planned start (wall clock) is <= `now` (plan
        time) mapped onto the cluster's clock. Returns the executor_refs released."""
        wall = self.clock.to_wall(now)
        released = []
        for connection, pod in self.pods():
            if not is_gated(pod) or _annotation(pod, CANCELLED_AT) is not None or deletion_time(pod) is not None:
                continue
            start = _annotation(pod, GATE_NAME)
            if start is None or utc(start) > wall:
                continue
            gates = pod["spec"]["schedulingGates"]
            i = next(k for k, g in enumerate(gates) if g.get("name") == GATE_NAME)
            path = f"/spec/schedulingGates/{i}"
            try:
                self.api(connection).patch(
                    pod["metadata"]["name"],
                    [{"op": "test", "path": f"{path}/name", "value": GATE_NAME}, {"op": "remove", "path": path}],
                )
            except ApiError as exc:
                if exc.status not in (404, 409, 422):  # gone, or released by someone else meanwhile
                    raise
                continue
            released.append(self._ref(connection, pod))
        return released

    def lookup(self, plan_id: str, job_id: str) -> str | None:
        found = self.pods(**{KEY_LABEL: dispatch_key(plan_id, str(job_id))})
        return self._ref(*found[0]) if found else None

    # ------------------------------------------------------------------------------------------- reading

    def _fields(self, connection: str, pod: dict, item: dict) -> dict:
        fields = {k: item.get(k) for k in ITEM_FIELDS if k in EVENT_COLUMNS}
        return {
            **fields,
            "planner_job_id": item["job_id"],
            "job_id": item.get("queue_job_id") or item["job_id"],
            "executor": self.name,
            "executor_ref": self._ref(connection, pod),
            "energy_kwh": None,
        }

    def _plan(self, wall: str | None) -> pd.Timestamp | None:
        return None if wall is None else self.clock.to_plan(wall)

    def pod_events(self, connection: str, pod: dict) -> list[dict]:
        """Every event of one Pod so far, in plan time (see the module doc)."""
        item = pod_item(pod)
        if item is None:
            return []
        base = self._fields(connection, pod, item)
        cancelled = _annotation(pod, CANCELLED_AT)
        cancelled = None if cancelled is None else utc(cancelled)
        state, status = main_state(pod), pod.get("status") or {}
        phase = status.get("phase")
        started = self._plan((state.get("running") or state.get("terminated") or {}).get("startedAt"))
        if started is None and phase in ("Running", "Succeeded"):  # no container status reported: the Pod's start
            started = self._plan(status.get("startTime"))
        ended, outcome = None, None
        if state.get("terminated"):
            ended = self._plan(state["terminated"].get("finishedAt"))
            outcome = "finished" if int(state["terminated"].get("exitCode", 1)) == 0 else "failed"
        elif phase in ENDED:
            times = [c.get("lastTransitionTime") for c in status.get("conditions") or []]
            ended = self._plan(max((t for t in times if t), default=None))
            outcome = "finished" if phase == "Succeeded" else "failed"
        deleted = self._plan(deletion_time(pod))
        if deleted is not None and started is None and ended is None:  # deleted before it ran: it never will
            ended, outcome = deleted, "failed"
        limit = item.get("power_limit_w")
        stream = [("dispatched", plan_time_of(item["plan_id"]), limit)]
        if started is not None and (cancelled is None or started < cancelled):
            stream.append(("started", started, limit))
        if cancelled is not None and (ended is None or cancelled < ended):
            ended, outcome = cancelled, "cancelled"
        for change in power_changes(pod):  # made while it ran: each in force from its time on
            if ended is None or change["at"] < ended:
                limit = change["watts"]
                stream.append(("power_changed", change["at"], limit))
        if (item.get("work_done") or 0) > 0 and len(stream) > 1 and stream[1][0] == "started":
            stream[1] = ("resumed", *stream[1][1:])  # goes on from the job's checkpoint
        if ended is not None and outcome != "cancelled" and _annotation(pod, PREEMPTED) is not None and started:
            outcome = "preempted"
        if ended is not None:
            stream.append((outcome, ended, limit))
        return [{**base, "event": event, "event_time": at, "power_limit_w": watts} for event, at, watts in stream]

    def sync(self, now, since=None) -> pd.DataFrame:
        since, now = check_window(since, now)
        self.release(now)
        events = []
        for connection, pod in self.pods():
            own = self.pod_events(connection, pod)
            events += own
            if since is not None and deletion_time(pod) is not None:
                self._let_go(connection, pod, own, since)
        frame = typed_frame(events, EVENT_COLUMNS)
        return sort_events(frame[in_window(frame["event_time"], since, now)])

    def _let_go(self, connection: str, pod: dict, events: list[dict], since: pd.Timestamp) -> None:
        """Remove the finalizer of a deleted Pod whose run has ended and whose every event lies before `since`
        (already loaded), so that Kubernetes removes it."""
        removal = finalizer_removal(pod)
        ended = any(e["event"] in ("finished", "failed", "cancelled") for e in events)
        if removal is None or not ended or max(e["event_time"] for e in events) >= since:
            return
        try:
            self.api(connection).patch(pod["metadata"]["name"], removal)
        except ApiError as exc:
            if exc.status not in (404, 422):  # gone, or changed meanwhile: the next sync tries again
                raise

    def running(self, now) -> pd.DataFrame:
        now = utc(now)
        next_hour = now.floor("h") + pd.Timedelta(hours=1)
        rows = []
        for connection, pod in self.pods():
            item = pod_item(pod)
            cancelled = _annotation(pod, CANCELLED_AT)
            if item is None or (pod.get("status") or {}).get("phase") in ENDED or item["start_time"] > now:
                continue
            if cancelled is not None and utc(cancelled) <= now:
                continue
            if deletion_time(pod) is not None and "running" not in main_state(pod):  # deleted before it ran
                continue
            rows.append(
                {
                    **{k: item.get(k) for k in RUNNING_COLUMNS if k in item},
                    "queue_job_id": item.get("queue_job_id"),
                    "executor": self.name,
                    "executor_ref": self._ref(connection, pod),
                    "power_limit_w": self._limit_at(pod, item, now),
                    "end_time": item["end_time"] if item["end_time"] > now else next_hour,
                    "confirmed": "running" in main_state(pod),
                }
            )
        return typed_frame(rows, RUNNING_COLUMNS).sort_values("job_id", kind="mergesort").reset_index(drop=True)

    # ------------------------------------------------------------------------------------------- power limits

    @staticmethod
    def _limit_at(pod: dict, item: dict, at: pd.Timestamp) -> float | None:
        """The power limit in force on the Pod at `at` (plan time): its last change by then, else the dispatch's."""
        made = [c["watts"] for c in power_changes(pod) if c["at"] <= at]
        return made[-1] if made else item.get("power_limit_w")

    def _change_ref(self, connection: str, pod: dict, plan_id: str) -> str:
        return f"{self._ref(connection, pod)}/power-limit/{plan_id}"

    def _live_at(self, pod: dict, at: pd.Timestamp) -> bool:
        """Whether the Pod's main container runs and had started by `at` (plan time), not cancelled nor deleted."""
        cancelled = _annotation(pod, CANCELLED_AT)
        if (pod.get("status") or {}).get("phase") in ENDED or deletion_time(pod) is not None:
            return False
        if cancelled is not None and utc(cancelled) <= at:
            return False
        running = main_state(pod).get("running")
        started = self._plan((running or {}).get("startedAt"))
        return started is not None and started <= at

    def set_power_limit(self, job_id: str, watts: float, at, *, plan_id: str, time_factor: float = 1.0) -> str | None:
        """Annotate the job's running Pod with the new limit in force and append the change to its list (see
        `k8s_pods`); the node agent applies it to the Pod's GPUs. The same (plan_id, job_id) again returns the
        first change's ref and patches nothing; None when no Pod of the job runs at `at`. `time_factor` is unused:
        the GPUs decide the speed."""
        at = utc(at)
        if not (math.isfinite(float(watts)) and float(watts) > 0):
            raise ValueError(f"job {job_id}: power limit must be a positive number of watts, got {watts!r}")
        live = None
        for connection, pod in self.pods():
            item = pod_item(pod)
            if item is None or item["job_id"] != str(job_id):
                continue
            if any(c["plan_id"] == plan_id for c in power_changes(pod)):
                return self._change_ref(connection, pod, plan_id)
            if self._live_at(pod, at):
                live = (connection, pod)
        if live is None:
            return None
        connection, pod = live
        earlier = power_changes(pod)
        if earlier and earlier[-1]["at"] > at:
            raise ValueError(f"job {job_id}: a power change at {at} comes before the last one ({earlier[-1]['at']})")
        change = {"at": iso_z(at), "wall": iso_z(self.clock.to_wall(at)), "watts": float(watts), "plan_id": plan_id}
        self.api(connection).patch(pod["metadata"]["name"], power_change_patch(pod, change))
        return self._change_ref(connection, pod, plan_id)

    def power_change_ref(self, plan_id: str, job_id: str) -> str | None:
        for connection, pod in self.pods():
            item = pod_item(pod)
            if item is not None and item["job_id"] == str(job_id):
                if any(c["plan_id"] == plan_id for c in power_changes(pod)):
                    return self._change_ref(connection, pod, plan_id)
        return None

    # ------------------------------------------------------------------------------------------- preemption

    def preempt(self, job_id: str, at, *, plan_id: str, save_h: float) -> str | None:
        """Mark the job's running Pod preempted by `plan_id` and delete it with a grace period of `save_h` (see the
        module doc). The same (plan_id, job_id) again returns the first preemption's ref (and deletes the Pod if it
        is not being deleted yet); None when no Pod of the job runs at `at`."""
        at = utc(at)
        live = None
        for connection, pod in self.pods():
            item = pod_item(pod)
            if item is None or item["job_id"] != str(job_id):
                continue
            mark = _annotation(pod, PREEMPTED)
            if mark is not None and json.loads(mark)["plan_id"] == plan_id:
                if deletion_time(pod) is None:
                    self._stop(connection, pod, save_h)
                return self._preempt_ref(connection, pod, plan_id)
            if self._live_at(pod, at):
                live = (connection, pod)
        if live is None:
            return None
        connection, pod = live
        mark = json.dumps({"at": iso_z(at), "plan_id": plan_id}, sort_keys=True)
        self.api(connection).patch(
            pod["metadata"]["name"],
            [{"op": "add", "path": f"/metadata/annotations/{json_pointer(PREEMPTED)}", "value": mark}],
        )
        self._stop(connection, pod, save_h)
        return self._preempt_ref(connection, pod, plan_id)

    def _stop(self, connection: str, pod: dict, save_h: float) -> None:
        """Delete the Pod, its container given `save_h` (plan hours, on the cluster's clock) to checkpoint."""
        grace = max(1, math.ceil(self.clock.wall_seconds(pd.Timedelta(hours=float(save_h)))))
        self.api(connection).delete(pod["metadata"]["name"], grace_period_s=grace)

    def _preempt_ref(self, connection: str, pod: dict, plan_id: str) -> str:
        return f"{self._ref(connection, pod)}/preempted/{plan_id}"

    def preemption_ref(self, plan_id: str, job_id: str) -> str | None:
        for connection, pod in self.pods():
            item, mark = pod_item(pod), _annotation(pod, PREEMPTED)
            if item is not None and item["job_id"] == str(job_id) and mark is not None:
                if json.loads(mark)["plan_id"] == plan_id:
                    return self._preempt_ref(connection, pod, plan_id)
        return None

    # ------------------------------------------------------------------------------------------- services

    def deployments(self, connection: str) -> DeploymentApi:
        if connection not in self._deployments:
            settings = self._connections[connection]
            self._deployments[connection] = DeploymentApi(settings, settings["namespace"])
        return self._deployments[connection]

    def _service_at(self, key: str) -> tuple[str, str, str]:
        """(service, cluster, connection) of a scaling key `tenant/service@cluster`."""
        service, _, cluster = str(key).rpartition("@")
        connection = self._connection_of(cluster)
        if not service or connection is None:
            raise ValueError(f"service scaling {key!r}: no connection of executor {self.name!r} serves {cluster!r}")
        return service, cluster, connection

    def scale_service(self, key: str, at, *, plan_id: str, provision: dict) -> str | None:
        """Create or scale the service's Deployment in the cluster's connection (`k8s_services`); the same
        (plan_id, key) again changes nothing and returns the same ref."""
        service, _, connection = self._service_at(key)
        at = utc(at)
        api = self.deployments(connection)
        name = deployment_name(service)
        ref = f"{connection}/{self._connections[connection]['namespace']}/{name}@{plan_id}"
        existing = api.get(name)
        if existing is not None and any(r["plan_id"] == plan_id for r in scalings(existing)):
            return ref
        record = scaling_record(plan_id, at, self.clock.to_wall(at), provision)
        if existing is None:
            if int(provision["replicas"]) == 0:
                return ref  # nothing runs there: nothing to stop
            api.create(deployment_manifest(service, provision, record, executor=self.name,
                                           namespace=self._connections[connection]["namespace"],
                                           image=self.serving_image))  # fmt: skip
        else:
            api.patch(name, scaling_patch(existing, provision, record))
        return ref

    def service_scaling_ref(self, plan_id: str, key: str) -> str | None:
        service, _, connection = self._service_at(key)
        name = deployment_name(service)
        existing = self.deployments(connection).get(name)
        if existing is not None and any(r["plan_id"] == plan_id for r in scalings(existing)):
            return f"{connection}/{self._connections[connection]['namespace']}/{name}@{plan_id}"
        return None

    # ------------------------------------------------------------------------------------------- cancel

    def cancel(self, job_id: str, now) -> bool:
        """Mark the job's live Pods cancelled at `now`; stop a started one (see the module doc)."""
        now = utc(now)
        done = False
        for connection, pod in self.pods():
            item = pod_item(pod)
            if item is None or item["job_id"] != str(job_id) or _annotation(pod, CANCELLED_AT) is not None:
                continue
            if (pod.get("status") or {}).get("phase") in ENDED:
                continue
            ops = [{"op": "add", "path": f"/metadata/annotations/{json_pointer(CANCELLED_AT)}", "value": iso_z(now)}]
            began = (pod.get("status") or {}).get("startTime")
            if began is not None:
                seconds = (self.clock.to_wall(now) - utc(began)).total_seconds()
                ops.append({"op": "add", "path": "/spec/activeDeadlineSeconds", "value": max(1, math.ceil(seconds))})
            self.api(connection).patch(pod["metadata"]["name"], ops)
            done = True
        return done
