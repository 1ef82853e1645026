"""The kubernetes executor against a local API server that records the calls (tests/scheduling/k8s_api_server.py):
gated Pods created once per dispatch, gates released at the planned start, moves between clusters, events and
running jobs read back from Pod states in plan time, cancellation, and the exactly-once dispatch log."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from scheduling.domain.fleet import ExecutorConfig
from scheduling.executors.base import EVENT_COLUMNS, RUNNING_COLUMNS, DuplicateDispatchError
from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.k8s import KubernetesExecutor
from scheduling.executors.k8s_pods import FINALIZER
from scheduling.executors.registry import make_executor
from scheduling.loop import fleet_executors
from scheduling.output.schedules import GATE_NAME
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.k8s_api_server import KubeApiServer

H = pd.Timedelta(hours=1)
PLAN_ID = plan_id_at()
NS = "gpu-jobs"
# plan time 2021-07-15T00:00Z is wall time 2026-11-26T00:00Z on the clusters
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}
WALL_NOON = "2026-11-26T12:00:00Z"


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("K8S_TOKEN", "s3cret")
    with KubeApiServer(token="s3cret") as server:
        yield server


def _executor(api, **settings) -> KubernetesExecutor:
    return make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK, **settings})


def _later(items: pd.DataFrame, hours: float) -> pd.DataFrame:
    out = items.copy()
    out["start_time"] += pd.Timedelta(hours=hours)
    out["end_time"] += pd.Timedelta(hours=hours)
    return out


def _gated(api) -> set[str]:
    return {name for (_, name), pod in api.pods.items() if pod["spec"].get("schedulingGates")}


def test_dispatch_creates_gated_pods_and_releases_them_at_the_planned_start(api):
    executor = _executor(api)
    items = pd.concat([sample_items(2), _later(sample_items(2, prefix="late"), 2)], ignore_index=True)
    records = executor.dispatch(PLAN_ID, items).set_index("job_id")
    assert records["error"].isna().all() and len(api.pods) == 4
    posts = [r for r in api.requests if r["method"] == "POST"]
    assert len(posts) == 4 and all(r["path"] == f"/api/v1/namespaces/{NS}/pods" for r in posts)
    assert all(r["authorization"] == "Bearer s3cret" for r in api.requests)
    # the two that start now were released by the dispatch; the later two stay gated until 14:00
    assert _gated(api) == {
        ref.split("/")[-1] for ref in records.loc[["acme/late-0000", "globex/late-0001"]].executor_ref
    }
    patches = [r for r in api.requests if r["method"] == "PATCH"]
    assert all(r["content_type"] == "application/json-patch+json" for r in patches)
    assert patches[0]["body"] == [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE_NAME},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    pod = api.pods[(NS, records.loc["acme/late-0000", "executor_ref"].split("/")[-1])]
    assert pod["metadata"]["annotations"][GATE_NAME] == "2026-11-26T14:00:00Z"  # the wall clock
    assert pod["spec"]["initContainers"][0]["command"][-1].endswith(
        f"-lt {int(pd.Timestamp('2026-11-26T14:00Z').timestamp())} ]; do sleep 30; done"
    )
    main = pod["spec"]["containers"][0]
    assert main["image"] == "registry.example/train:1.0" and main["command"][-1] == "python train.py --job 0"
    assert {"name": "GPU_POWER_LIMIT_W", "value": "200"} in main["env"]
    assert executor.sync(PLAN_TIME + 1.5 * H, since=PLAN_TIME).query("event == 'started'").empty
    executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME + 1.5 * H)  # the loop hour at 14:00 releases them
    assert _gated(api) == set()


def test_lookup_and_duplicates(api):
    executor = _executor(api)
    assert executor.lookup(PLAN_ID, "acme/job-0000") is None
    records = executor.dispatch(PLAN_ID, sample_items(3)).set_index("job_id")
    assert executor.lookup(PLAN_ID, "acme/job-0000") == records.loc["acme/job-0000", "executor_ref"]
    assert records.loc["acme/job-0000", "executor_ref"].startswith("default/gpu-jobs/acme-job-0000-")
    assert executor.lookup(plan_id_at(PLAN_TIME + H), "acme/job-0000") is None
    before = len(api.requests)
    with pytest.raises(DuplicateDispatchError, match="acme/job-0000"):
        executor.dispatch(PLAN_ID, sample_items(1))
    assert [r["method"] for r in api.requests[before:]] == ["GET"]  # refused before creating anything


def test_exactly_once_through_the_dispatch_log(api, tmp_warehouse):
    executor = _executor(api)
    first = dispatch(PLAN_ID, sample_items(5), executor, db_path=tmp_warehouse, batch_size=2)
    again = dispatch(PLAN_ID, sample_items(5), executor, db_path=tmp_warehouse)
    assert len(first.sent) == 5 and len(again.skipped) == 5 and len(api.pods) == 5


def test_events_and_running_in_plan_time(api):
    executor = _executor(api)
    records = executor.dispatch(PLAN_ID, sample_items(4)).set_index("job_id")
    name = {job: ref.split("/")[-1] for job, ref in records["executor_ref"].items()}
    api.run_pod(NS, name["acme/job-0000"], "2026-11-26T12:01:00Z", "2026-11-26T13:31:00Z", exit_code=0)
    api.run_pod(NS, name["globex/job-0001"], "2026-11-26T12:02:00Z", "2026-11-26T12:32:00Z", exit_code=3)
    api.run_pod(NS, name["acme/job-0002"], "2026-11-26T12:03:00Z")
    api.pods[(NS, name["globex/job-0003"])]["status"] = {  # the phase, no container statuses: an evicted Pod
        "phase": "Failed",
        "startTime": "2026-11-26T12:02:00Z",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-26T12:32:00Z"}],
    }
    events = executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME)
    assert list(events.columns) == list(EVENT_COLUMNS)
    got = {(e.planner_job_id, e.event): e.event_time for e in events.itertuples()}
    assert got == {
        ("acme/job-0000", "dispatched"): PLAN_TIME,
        ("acme/job-0000", "started"): PLAN_TIME + pd.Timedelta(minutes=1),
        ("acme/job-0000", "finished"): PLAN_TIME + pd.Timedelta(minutes=91),
        ("globex/job-0001", "dispatched"): PLAN_TIME,
        ("globex/job-0001", "started"): PLAN_TIME + pd.Timedelta(minutes=2),
        ("globex/job-0001", "failed"): PLAN_TIME + pd.Timedelta(minutes=32),
        ("acme/job-0002", "dispatched"): PLAN_TIME,
        ("acme/job-0002", "started"): PLAN_TIME + pd.Timedelta(minutes=3),
        ("globex/job-0003", "dispatched"): PLAN_TIME,
        ("globex/job-0003", "failed"): PLAN_TIME + pd.Timedelta(minutes=32),  # started unknown: not reported
    }
    row = events.iloc[0]
    assert (row.tenant, row.job_id, row.cluster, row.attempt) == ("acme", "job-0000", "usw-t4", 1)
    # windows partition the events
    halves = pd.concat(
        [executor.sync(PLAN_TIME + H, since=PLAN_TIME), executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME + H)]
    )
    assert len(halves) == len(events)
    running = executor.running(PLAN_TIME + H)
    assert list(running.columns) == list(RUNNING_COLUMNS)
    assert list(running["job_id"]) == ["acme/job-0002"] and running["confirmed"].all()
    assert running["end_time"].iloc[0] == PLAN_TIME + 3 * H  # the plan's end (job 2: a 3 h estimate)


def test_cancel_marks_and_stops(api):
    executor = _executor(api)
    items = pd.concat([sample_items(1), _later(sample_items(1, prefix="late"), 3)], ignore_index=True)
    records = executor.dispatch(PLAN_ID, items).set_index("job_id")
    running_pod = records.loc["acme/job-0000", "executor_ref"].split("/")[-1]
    api.run_pod(NS, running_pod, "2026-11-26T12:00:00Z")
    assert executor.cancel("acme/job-0000", PLAN_TIME + H) and executor.cancel("acme/late-0000", PLAN_TIME + H)
    assert not executor.cancel("acme/job-0000", PLAN_TIME + H)  # already cancelled
    pod = api.pods[(NS, running_pod)]
    assert pod["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["metadata"]["annotations"]["carbonplanner.io/cancelled-at"] == "2021-07-15T13:00:00Z"
    events = executor.sync(PLAN_TIME + 4 * H, since=PLAN_TIME)
    assert set(zip(events["planner_job_id"], events["event"])) == {
        ("acme/job-0000", "dispatched"),
        ("acme/job-0000", "started"),
        ("acme/job-0000", "cancelled"),
        ("acme/late-0000", "dispatched"),
        ("acme/late-0000", "cancelled"),
    }
    assert len(_gated(api)) == 1  # the cancelled gated Pod is never released
    assert executor.running(PLAN_TIME + 2 * H).empty


def test_a_deleted_pod_keeps_its_events_until_a_loaded_window_holds_them(api):
    executor = _executor(api)
    records = executor.dispatch(PLAN_ID, sample_items(3)).set_index("job_id")
    name = {job: ref.split("/")[-1] for job, ref in records["executor_ref"].items()}
    assert all(pod["metadata"]["finalizers"] == [FINALIZER] for pod in api.pods.values())
    done, dropped, kept = name["acme/job-0000"], name["globex/job-0001"], name["acme/job-0002"]
    api.run_pod(NS, done, "2026-11-26T12:01:00Z", "2026-11-26T12:31:00Z")
    api.delete_pod(NS, done, at="2026-11-26T12:40:00Z")  # the Pod garbage collector, before any sync
    api.delete_pod(NS, dropped, at="2026-11-26T12:20:00Z")  # kubectl delete / a drain, before it ran
    api.run_pod(NS, kept, "2026-11-26T12:05:00Z", "2026-11-26T12:35:00Z")  # ended, never deleted
    assert set(api.pods) == {(NS, done), (NS, dropped), (NS, kept)}  # held by the finalizer
    events = executor.sync(PLAN_TIME + H, since=PLAN_TIME)
    got = {(e.planner_job_id, e.event): e.event_time for e in events.itertuples()}
    assert got == {
        ("acme/job-0000", "dispatched"): PLAN_TIME,
        ("acme/job-0000", "started"): PLAN_TIME + pd.Timedelta(minutes=1),
        ("acme/job-0000", "finished"): PLAN_TIME + pd.Timedelta(minutes=31),
        ("globex/job-0001", "dispatched"): PLAN_TIME,
        ("globex/job-0001", "failed"): PLAN_TIME + pd.Timedelta(minutes=20),  # never started: a retry is due
        ("acme/job-0002", "dispatched"): PLAN_TIME,
        ("acme/job-0002", "started"): PLAN_TIME + pd.Timedelta(minutes=5),
        ("acme/job-0002", "finished"): PLAN_TIME + pd.Timedelta(minutes=35),
    }
    assert executor.running(PLAN_TIME + 0.25 * H)["job_id"].tolist() == []  # the deleted one never runs
    assert len(api.pods) == 3  # this window is not loaded yet: nothing is let go
    assert executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME + H).empty
    assert set(api.pods) == {(NS, kept)}  # the deleted Pods' events lie before the loaded window: let go
    assert api.pods[(NS, kept)]["metadata"]["finalizers"] == [FINALIZER]
    api.delete_pod(NS, kept, at="2026-11-26T14:10:00Z")
    assert executor.sync(PLAN_TIME + 3 * H, since=PLAN_TIME + 2 * H).empty and api.pods == {}


def test_a_running_pod_deleted_ends_as_its_container_does(api):
    executor = _executor(api)
    (ref,) = executor.dispatch(PLAN_ID, sample_items(1))["executor_ref"]
    pod = ref.split("/")[-1]
    api.run_pod(NS, pod, "2026-11-26T12:01:00Z")
    api.delete_pod(NS, pod, at="2026-11-26T12:30:00Z")
    assert executor.running(PLAN_TIME + 0.5 * H)["job_id"].tolist() == ["acme/job-0000"]  # still terminating
    api.run_pod(NS, pod, "2026-11-26T12:01:00Z", "2026-11-26T12:30:30Z", exit_code=143)  # SIGTERM
    assert executor.running(PLAN_TIME + 0.75 * H).empty
    events = executor.sync(PLAN_TIME + H, since=PLAN_TIME)
    assert events["event"].tolist() == ["dispatched", "started", "failed"] and len(api.pods) == 1
    assert executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME + H).empty and api.pods == {}


def test_a_move_deletes_and_recreates_in_the_other_clusters_context(monkeypatch):
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as west, KubeApiServer(token="t") as north:
        clusters = {"usw-t4": {"host": west.url}, "eun-v100m32": {"host": north.url, "namespace": "batch"}}
        executor = make_executor("kubernetes", {"token_env": "K8S_TOKEN", "clock": CLOCK, "clusters": clusters})
        job = _later(sample_items(1), 5)  # acme/job-0000 on usw-t4, gated until 17:00
        executor.dispatch(PLAN_ID, job)
        assert len(west.pods) == 1 and _gated(west)
        moved = job.assign(
            cluster="eun-v100m32", node="eun-v100m32/node-01", start_time=PLAN_TIME + H, end_time=PLAN_TIME + 2 * H
        )
        records = executor.dispatch(plan_id_at(PLAN_TIME + H), moved)
        assert records["executor_ref"].iloc[0].startswith("eun-v100m32/batch/")
        assert west.pods == {} and "DELETE" in [r["method"] for r in west.requests]  # gone, finalizer and all
        assert len(north.pods) == 1 and not _gated(north)  # starts now: released at once


def test_settings_are_checked(api):
    with pytest.raises(ValueError, match="unknown setting"):
        make_executor("kubernetes", {"host": api.url, "nodes": 3})
    with pytest.raises(ValueError, match="sharing.mechanism"):
        make_executor("kubernetes", {"host": api.url, "sharing": {"mechanism": "vgpu"}})
    with pytest.raises(ValueError, match="clusters.a: unknown"):
        make_executor("kubernetes", {"clusters": {"a": {"replicas": 2}}})
    executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clusters": {"usw-t4": {}}})
    records = executor.dispatch(PLAN_ID, sample_items(2))
    assert "not in the executor's setting 'clusters'" in records["error"].iloc[1]
    assert KubernetesExecutor.job_files == ("k8s",)


def test_a_fleet_file_builds_one_executor_over_its_clusters(api):
    block = {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK,
             "sharing": {"mechanism": "mig", "profiles": ["1g.10gb", "4g.40gb"]},
             "clusters": {"usw-t4": {}, "eun-v100m32": {"namespace": "batch", "sharing": "none"}}}  # fmt: skip

    class Fleet:  # what `fleet_executors` reads of a fleet
        def executors(self):
            return {c: ExecutorConfig(kind="kubernetes", settings=copy.deepcopy(block)) for c in block["clusters"]}

    executors = fleet_executors(Fleet())
    assert len({id(e) for e in executors.values()}) == 1
    executors["usw-t4"].dispatch(PLAN_ID, sample_items(4))
    gpus = {
        (ns, pod["metadata"]["annotations"]["carbonplanner.io/job-id"]): {
            k: v for k, v in pod["spec"]["containers"][0]["resources"]["limits"].items() if k not in ("cpu", "memory")
        }
        for (ns, _), pod in api.pods.items()
    }
    assert gpus == {
        ("gpu-jobs", "acme/job-0000"): {"nvidia.com/mig-4g.40gb": "1"},  # 500 milli: 4 of 7 slices
        ("batch", "globex/job-0001"): {"nvidia.com/gpu": "2"},
        ("gpu-jobs", "acme/job-0002"): {"nvidia.com/gpu": "2"},
        ("batch", "globex/job-0003"): {"nvidia.com/gpu": "1"},  # no sharing there: a whole GPU
    }


def test_a_cluster_connection_replaces_the_base_one(api):
    executor = _executor(api, clusters={"usw-t4": {}, "eun-v100m32": {"context": "north", "namespace": "batch"}})
    assert executor._connections["usw-t4"]["host"] == api.url
    assert executor._connections["eun-v100m32"] == {"context": "north", "namespace": "batch"}
    executor = make_executor("kubernetes", {"context": "west", "token_env": "T", "clusters": {"a": {"host": "h"}}})
    assert executor._connections["a"] == {"host": "h", "token_env": "T", "namespace": "gpu-jobs"}


def test_a_pod_preempted_at_its_checkpoint_resumes_in_the_other_cluster(monkeypatch):
    """Preemption: the running Pod is marked (the deciding plan: its idempotency key), deleted with the checkpoint
    time as its grace period (SIGTERM, then the container exits), and its end comes back `preempted`; the job's next
    dispatch is a new Pod in the other cluster's context with the share done in its env, reported `resumed`."""
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as west, KubeApiServer(token="t") as north:
        clusters = {"usw-t4": {"host": west.url}, "eun-v100m32": {"host": north.url, "namespace": "batch"}}
        executor = make_executor("kubernetes", {"token_env": "K8S_TOKEN", "clock": CLOCK, "clusters": clusters})
        job = sample_items(1)  # acme/job-0000 on usw-t4 at 12:00
        executor.dispatch(PLAN_ID, job)
        ((_, name),) = west.pods
        west.run_pod(NS, name, "2026-11-26T12:00:30Z")
        decided = plan_id_at(PLAN_TIME + 2 * H)
        ref = executor.preempt("acme/job-0000", PLAN_TIME + 2 * H, plan_id=decided, save_h=5 / 60)
        deletes = [r for r in west.requests if r["method"] == "DELETE"]
        assert ref and len(deletes) == 1 and int(deletes[0]["query"]["gracePeriodSeconds"]) == 300  # 5 min
        assert executor.preempt("acme/job-0000", PLAN_TIME + 2 * H, plan_id=decided, save_h=5 / 60) == ref
        assert len([r for r in west.requests if r["method"] == "DELETE"]) == 1  # being deleted: not again
        assert executor.preemption_ref(decided, "acme/job-0000") == ref
        assert executor.preempt("acme/job-0001", PLAN_TIME + 2 * H, plan_id=decided, save_h=0.1) is None
        west.run_pod(NS, name, "2026-11-26T12:00:30Z", "2026-11-26T14:00:40Z", exit_code=0)  # checkpointed
        events = executor.sync(PLAN_TIME + 3 * H, since=PLAN_TIME)
        assert events["event"].tolist() == ["dispatched", "started", "preempted"]
        assert events["event_time"].iloc[-1] == PLAN_TIME + 2 * H + pd.Timedelta(seconds=40)
        assert executor.running(PLAN_TIME + 3 * H).empty

        later = PLAN_TIME + 4 * H
        resumed = job.assign(
            cluster="eun-v100m32", node="eun-v100m32/node-01", start_time=later, end_time=later + H, attempt=2,
            work_done=0.4,
        )  # fmt: skip
        executor.dispatch(plan_id_at(later), resumed)
        ((_, second),) = north.pods
        env = {e["name"]: e["value"] for e in north.pods[("batch", second)]["spec"]["containers"][0]["env"]}
        assert env["CHECKPOINT_WORK_DONE"] == "0.4"
        north.run_pod("batch", second, "2026-11-26T16:00:10Z", "2026-11-26T17:00:00Z")
        events = executor.sync(PLAN_TIME + 6 * H, since=PLAN_TIME + 3 * H)
        mine = events[events["attempt"] == 2]
        assert mine["event"].tolist() == ["dispatched", "resumed", "finished"]
