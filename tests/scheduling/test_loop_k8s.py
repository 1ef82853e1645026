"""Two hours of the operating loop with the kubernetes executor against the local recording API server: the jobs
that start at 11:00 become gated Pods (released at once: their start has come), a kubelet's work is simulated on
the server (one Pod is deleted before it runs), and the 12:00 sync loads their events (mapped back to plan time)
into raw.job_events and moves the queue."""

from __future__ import annotations

import duckdb
import pandas as pd

from scheduling import loop
from scheduling.executors.registry import make_executor
from scheduling.queue.intake import submit_file
from scheduling.queue.trace import write_trace_file
from scheduling.service import plan_fleet
from tests.scheduling.k8s_api_server import KubeApiServer

T = pd.Timestamp("2021-07-15T12:00:00Z")
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}


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
