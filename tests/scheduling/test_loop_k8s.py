"""Two hours of the operating loop with the kubernetes executor against the local recording API server: the jobs
that start at 11:00 become gated Pods (released at once: their start has come), a kubelet's work is simulated on
the server (one Pod is deleted before it runs), and the 12:00 sync loads their events (mapped back to plan time)
into raw.job_events and moves the queue. Then an hour's power change of a running Pod, through a crash mid-change:
it reaches the Pod once and comes back as an event."""

from __future__ import annotations

import json

import duckdb
import pandas as pd
import pytest

from common.timeutil import iso_z
from scheduling import loop
from scheduling.executors.clock import PlanClock
from scheduling.executors.k8s_pods import ITEM_ANNOTATION, POWER_LIMIT, POWER_LIMITS, watts_text
from scheduling.executors.power_log import read_changes
from scheduling.executors.registry import make_executor
from scheduling.queue.intake import submit_file
from scheduling.queue.trace import write_trace_file
from scheduling.service import plan_fleet
from tests.scheduling.executor_samples import crash_mid_change_then_reconcile
from tests.scheduling.k8s_api_server import KubeApiServer

T = pd.Timestamp("2021-07-15T12:00:00Z")
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}


def wall_of(plan_time) -> str:
    """The clusters' wall time of a plan time, as the kubelet writes it."""
    return iso_z(PlanClock.from_setting(CLOCK).to_wall(plan_time))


def _hour(db, tmp_path, data_dir, fleet, executor, as_of):
    ctx = loop.context(
        as_of,
        db_path=db,
        data_dir=data_dir,
        schedule_root=tmp_path / "schedules",
        fleet=fleet,
        executors=dict.fromkeys(fleet.names, executor),
    )
    sync = loop.sync(ctx)
    plan, _, pending = loop.plan(ctx)
    return sync, loop.dispatch_plan(ctx, plan, pending)


def test_two_loop_hours_on_kubernetes(tmp_warehouse, tmp_path, data_dir, monkeypatch):
    fleet = plan_fleet(None, data_dir)
    jobs = tmp_path / "jobs.yaml"
    write_trace_file(jobs, "2021-07-15", 40, fleet, data_dir=data_dir)
    assert not submit_file(jobs, db_path=tmp_warehouse, data_dir=data_dir).rejected
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as api:
        executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
        _, sent = _hour(tmp_warehouse, tmp_path, data_dir, fleet, executor, T - pd.Timedelta(hours=1))
        assert sent["sent"] == len(api.pods) >= 1 and not sent["failed"]
        assert not any(p["spec"].get("schedulingGates") for p in api.pods.values())  # released at 11:00
        *names, deleted = sorted(name for _, name in api.pods)
        for i, name in enumerate(names):  # the kubelet: every Pod starts at 11:00 (wall), odd ones fail at 11:20
            api.run_pod("gpu-jobs", name, "2026-11-26T11:00:00Z", "2026-11-26T11:20:00Z", exit_code=i % 2)
        api.delete_pod("gpu-jobs", deleted, at="2026-11-26T11:10:00Z")  # a drain, before it ran
        sync, _ = _hour(tmp_warehouse, tmp_path, data_dir, fleet, executor, T)
        assert sync["events"] == 3 * len(names) + 2 and not sync["unreachable"]
        # the deleted one failed before it ran, never unreported (these jobs have no retries left)
        assert sync["entered"] == {
            "running": len(names),
            "finished": len(names) - len(names) // 2,
            "failed": len(names) // 2 + 1,
        }
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        events = con.execute(
            "SELECT event, min(event_time), max(event_time), count(*) FROM raw.job_events GROUP BY event ORDER BY event"
        ).fetchall()
        states = dict(con.execute("SELECT state, count(*) FROM queue.jobs GROUP BY state").fetchall())
    eleven, twenty = pd.Timestamp("2021-07-15T11:00Z"), pd.Timestamp("2021-07-15T11:20Z")
    by_event = {e: (pd.Timestamp(lo), pd.Timestamp(hi), n) for e, lo, hi, n in events}
    assert by_event["dispatched"] == (eleven, eleven, len(names) + 1)
    assert by_event["started"] == (eleven, eleven, len(names))
    assert by_event["finished"][:2] == (twenty, twenty)
    assert by_event["failed"] == (pd.Timestamp("2021-07-15T11:10Z"), twenty, len(names) // 2 + 1)
    assert states.get("finished", 0) == (len(names) + 1) // 2


def test_a_plans_power_change_reaches_the_running_pod_once(tmp_warehouse, tmp_path, data_dir, monkeypatch):
    """Hours from 11:00 with the kubelet starting each released Pod at its hour (none has ended yet), until an
    hour decides a power change of a running Pod. That hour is killed after the Pod was patched and before the
    action log's mark; run again, and once more, the Pod carries the change once, with the plan's limit, and the
    next hour's sync loads it as a `power_changed` event at the deciding plan's time."""
    fleet = plan_fleet(None, data_dir)
    jobs = tmp_path / "jobs.yaml"
    write_trace_file(jobs, "2021-07-15", 40, fleet, data_dir=data_dir)
    assert not submit_file(jobs, db_path=tmp_warehouse, data_dir=data_dir).rejected
    monkeypatch.setenv("K8S_TOKEN", "t")
    H = pd.Timedelta(hours=1)
    with KubeApiServer(token="t") as api:
        executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
        executors = dict.fromkeys(fleet.names, executor)
        settings = dict(db_path=tmp_warehouse, data_dir=data_dir, schedule_root=tmp_path / "s", fleet=fleet)
        for h in range(24):
            ctx = loop.context(T - H + h * H, executors=executors, **settings)
            loop.sync(ctx)
            plan, _, pending = loop.plan(ctx)
            if len(read_changes(ctx.plan_id, tmp_warehouse)):
                break
            loop.dispatch_plan(ctx, plan, pending)
            wall = wall_of(ctx.plan_time)
            for (ns, name), pod in list(api.pods.items()):
                if not pod["spec"].get("schedulingGates") and pod["status"]["phase"] == "Pending":
                    api.run_pod(ns, name, wall)
        else:
            pytest.fail("no hour decided a power change")
        decided = read_changes(ctx.plan_id, tmp_warehouse)

        crash_mid_change_then_reconcile(ctx, executor, tmp_warehouse, plan, pending, len(decided))
        logged = read_changes(ctx.plan_id, tmp_warehouse).set_index("job_id")
        changed = {}  # job -> (its Pod's changes, the limit in force)
        for pod in api.pods.values():
            annotations = pod["metadata"]["annotations"]
            if POWER_LIMITS in annotations:
                job = json.loads(annotations[ITEM_ANNOTATION])["job_id"]
                changed[job] = (json.loads(annotations[POWER_LIMITS]), annotations[POWER_LIMIT])
        assert sorted(changed) == sorted(logged.index)
        for job, (changes, limit) in changed.items():
            watts = float(logged.loc[job, "to_limit_w"])
            assert [(c["plan_id"], c["at"], c["watts"]) for c in changes] == [
                (ctx.plan_id, iso_z(ctx.plan_time), watts)
            ]
            assert limit == watts_text(watts)
        sync = loop.sync(loop.context(ctx.plan_time + H, executors=executors, **settings))
        assert not sync["unreachable"]
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        loaded = con.execute(
            "SELECT planner_job_id, event_time, power_limit_w FROM raw.job_events WHERE event = 'power_changed'"
        ).fetchall()
    assert sorted((j, pd.Timestamp(t), w) for j, t, w in loaded) == sorted(
        (j, ctx.plan_time, float(r["to_limit_w"])) for j, r in logged.iterrows()
    )
