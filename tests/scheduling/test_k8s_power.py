"""Power limits of running Pods through the kubernetes executor, against the local recording API server: a limit
changed mid-run patches the running Pod's annotations (the limit in force and the list of changes), once per
deciding plan; it comes back as a `power_changed` event in the window of its time and as the limit `running`
reports; a Pod that does not run gets none; the action log changes a Pod's limit once across a crash."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scheduling.executors.k8s_pods import POWER_LIMIT, POWER_LIMITS
from scheduling.executors.power_log import apply_power_changes, read_changes, record_decisions
from scheduling.executors.registry import make_executor
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.k8s_api_server import KubeApiServer

H = pd.Timedelta(hours=1)
NS = "gpu-jobs"
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}  # plan 12:00 = wall 12:00 Nov 26


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as server:
        yield server


def _dispatched(api, n=3):
    """An executor with `n` sample jobs dispatched at 12:00: job 0 runs from 12:01 (wall), job 1 was never
    started by the kubelet, job 2 ran 12:02-12:30. Returns (executor, job -> Pod name)."""
    executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
    records = executor.dispatch(plan_id_at(PLAN_TIME), sample_items(n)).set_index("job_id")
    names = {job: ref.split("/")[-1] for job, ref in records["executor_ref"].items()}
    api.run_pod(NS, names["acme/job-0000"], "2026-11-26T12:01:00Z", node="gpu-node-1")
    if n > 2:
        api.run_pod(NS, names["acme/job-0002"], "2026-11-26T12:02:00Z", "2026-11-26T12:30:00Z", node="gpu-node-1")
    return executor, names


def _patches(api) -> int:
    return sum(r["method"] == "PATCH" for r in api.requests)


def test_a_limit_changed_mid_run_annotates_the_running_pod(api):
    executor, names = _dispatched(api)
    job, pod = "acme/job-0000", (NS, names["acme/job-0000"])
    assert executor.changes_power_limits
    assert api.pods[pod]["metadata"]["annotations"][POWER_LIMIT] == "200"  # the dispatch limit (200 + job index)
    first = plan_id_at(PLAN_TIME + H)
    before = _patches(api)
    ref = executor.set_power_limit(job, 250.0, PLAN_TIME + H, plan_id=first, time_factor=0.9)
    assert ref == f"default/{NS}/{pod[1]}/power-limit/{first}"
    assert _patches(api) == before + 1
    annotations = api.pods[pod]["metadata"]["annotations"]
    assert annotations[POWER_LIMIT] == "250"
    assert json.loads(annotations[POWER_LIMITS]) == [
        {"at": "2021-07-15T13:00:00Z", "wall": "2026-11-26T13:00:00Z", "watts": 250.0, "plan_id": first}
    ]
    # the same plan again: the same ref, nothing patched
    assert executor.set_power_limit(job, 180.0, PLAN_TIME + H, plan_id=first) == ref
    assert _patches(api) == before + 1 and annotations[POWER_LIMIT] == "250"
    assert executor.power_change_ref(first, job) == ref
    assert executor.power_change_ref(plan_id_at(PLAN_TIME + 2 * H), job) is None
    # no running Pod: gated/pending, ended, unknown job
    assert executor.set_power_limit("globex/job-0001", 250.0, PLAN_TIME + H, plan_id=first) is None
    assert executor.set_power_limit("acme/job-0002", 250.0, PLAN_TIME + H, plan_id=first) is None
    assert executor.set_power_limit("acme/nope", 250.0, PLAN_TIME + H, plan_id=first) is None
    # a Pod whose container started after the change's time did not run then
    assert executor.set_power_limit(job, 250.0, PLAN_TIME, plan_id=plan_id_at(PLAN_TIME)) is None
    assert _patches(api) == before + 1
    # a second change, with fractional watts; one before the last is refused
    second = plan_id_at(PLAN_TIME + 3 * H)
    executor.set_power_limit(job, 212.5, PLAN_TIME + 3 * H, plan_id=second)
    assert api.pods[pod]["metadata"]["annotations"][POWER_LIMIT] == "212.5"
    with pytest.raises(ValueError, match="before the last one"):
        executor.set_power_limit(job, 300.0, PLAN_TIME + 2 * H, plan_id=plan_id_at(PLAN_TIME + 2 * H))
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive number of watts"):
            executor.set_power_limit(job, bad, PLAN_TIME + 4 * H, plan_id=plan_id_at(PLAN_TIME + 4 * H))
    assert [c["watts"] for c in json.loads(api.pods[pod]["metadata"]["annotations"][POWER_LIMITS])] == [250, 212.5]


def test_changes_come_back_as_events_and_as_the_limit_in_force(api):
    executor, names = _dispatched(api)
    job = "acme/job-0000"
    executor.set_power_limit(job, 250.0, PLAN_TIME + H, plan_id=plan_id_at(PLAN_TIME + H))
    executor.set_power_limit(job, 180.0, PLAN_TIME + 2 * H, plan_id=plan_id_at(PLAN_TIME + 2 * H))
    own = lambda events: events[events["planner_job_id"] == job]  # noqa: E731
    assert "power_changed" not in set(executor.sync(PLAN_TIME + H, since=PLAN_TIME)["event"])
    hour = own(executor.sync(PLAN_TIME + 2 * H, since=PLAN_TIME + H))
    assert hour[["event", "event_time", "power_limit_w"]].values.tolist() == [["power_changed", PLAN_TIME + H, 250.0]]
    started = own(executor.sync(PLAN_TIME + H, since=PLAN_TIME)).set_index("event").loc["started"]
    change = hour.iloc[0]
    assert (change.plan_id, change.attempt, change.executor_ref, change.node) == (
        started.plan_id, started.attempt, started.executor_ref, started.node,
    )  # fmt: skip
    assert started.power_limit_w == 200.0
    # the limit in force, as `running` reports it, hour by hour
    limits = [executor.running(PLAN_TIME + t * H).set_index("job_id").loc[job, "power_limit_w"] for t in (0.5, 1, 2.5)]
    assert limits == [200.0, 250.0, 180.0]
    # the run ends at 14:30 (wall = plan): its end carries the limit then in force; windows partition the events
    api.run_pod(NS, names[job], "2026-11-26T12:01:00Z", "2026-11-26T14:30:00Z", node="gpu-node-1")
    whole = own(executor.sync(PLAN_TIME + 4 * H, since=PLAN_TIME))
    assert whole[["event", "power_limit_w"]].values.tolist() == [
        ["dispatched", 200.0], ["started", 200.0], ["power_changed", 250.0], ["power_changed", 180.0],
        ["finished", 180.0],
    ]  # fmt: skip
    parts = pd.concat([own(executor.sync(PLAN_TIME + (h + 1) * H, since=PLAN_TIME + h * H)) for h in range(4)])
    assert parts.reset_index(drop=True).equals(whole.reset_index(drop=True))
    assert job not in set(executor.running(PLAN_TIME + 3 * H)["job_id"])


def test_a_change_after_the_cancel_is_not_made(api):
    executor, _ = _dispatched(api, n=1)
    executor.cancel("acme/job-0000", PLAN_TIME + H)
    assert executor.set_power_limit("acme/job-0000", 250.0, PLAN_TIME + H, plan_id=plan_id_at(PLAN_TIME + H)) is None


def test_the_action_log_changes_a_pod_once_across_a_crash(api, tmp_warehouse):
    executor, names = _dispatched(api)
    job, plan = "acme/job-0000", plan_id_at(PLAN_TIME + 2 * H)
    change = pd.DataFrame(
        [{"job_id": job, "plan_id": plan_id_at(PLAN_TIME), "attempt": 1, "cluster": "usw-t4", "from_limit_w": 200.0,
          "to_limit_w": 240.0, "time_factor": 0.95, "reason": "at_risk", "changed": True}]
    )  # fmt: skip
    assert record_decisions(plan, change, {"usw-t4": executor}, tmp_warehouse) == 1

    def crash(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after the Pod was patched, before the mark")

    with pytest.raises(KeyboardInterrupt):
        apply_power_changes(plan, executor, tmp_warehouse, _fault=crash)
    assert read_changes(plan, tmp_warehouse)["status"].tolist() == ["intent"]
    patched = _patches(api)
    again = apply_power_changes(plan, executor, tmp_warehouse)
    assert again["reconciled"] == [job] and not again["sent"] and _patches(api) == patched
    assert apply_power_changes(plan, executor, tmp_warehouse)["skipped"] == [job]
    row = read_changes(plan, tmp_warehouse).iloc[0]
    assert (row["status"], row["executor_ref"]) == ("sent", f"default/{NS}/{names[job]}/power-limit/{plan}")
    changes = json.loads(api.pods[(NS, names[job])]["metadata"]["annotations"][POWER_LIMITS])
    assert [(c["at"], c["watts"], c["plan_id"]) for c in changes] == [("2021-07-15T14:00:00Z", 240.0, plan)]
