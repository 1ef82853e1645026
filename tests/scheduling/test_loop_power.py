"""Power limits of running jobs through the real loop (replay executor, shared data): runs that fall behind their
plan are raised and end earlier than at the limit they had (recomputed from the replay's true work, independently
of the planner's projection); every change reaches the executor once and comes back as a `power_changed` event;
a loop killed between the executor's change and its mark changes nothing twice when the hour is run again."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from scheduling import loop
from scheduling.domain.execution import Segment, end_time
from scheduling.executors.power_log import apply_power_changes, read_changes
from scheduling.executors.replay import ReplayExecutor
from scheduling.executors.runs import finished_runs
from scheduling.planning.recap import Recapping
from scheduling.queue.intake import submit_file
from scheduling.queue.trace import write_trace_file
from scheduling.service import plan_fleet

DAY = pd.Timestamp("2021-07-15T00:00Z")
H = pd.Timedelta(hours=1)


def _operate(tmp_path, data_dir, hours, recapping=None, n=40):
    db = tmp_path / "warehouse.duckdb"
    fleet = plan_fleet(None, data_dir).sampled()
    path = tmp_path / "jobs.yaml"
    write_trace_file(path, "2021-07-15", n, fleet, data_dir=data_dir)
    assert not submit_file(path, db_path=db, data_dir=data_dir).rejected
    executor = ReplayExecutor(db_path=db, sigma=0.5, failure_rate=0.0)
    # plans to the estimate (no deadline reserve, so slower limits too): runs that overrun fall behind their plan
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp_path / "s", fleet=fleet, recapping=recapping,
                    deadline_reserve=0.0)  # fmt: skip
    results = loop.run_hours(DAY, hours, executors=dict.fromkeys(fleet.names, executor), **settings)
    return db, executor, results, settings


def _end_if_kept(run, changes) -> pd.Timestamp:
    """The replay run's end at its dispatch limit: its true work from its start at time factor 1."""
    return end_time([Segment(run["start_time"], 1.0)], float(run["work_h"]))


def test_runs_behind_their_plan_are_raised_and_end_sooner(tmp_path, data_dir):
    db, executor, results, _ = _operate(tmp_path, data_dir, hours=14)
    changes = executor.changes()
    with duckdb.connect(str(db), read_only=True) as con:
        logged = con.execute("SELECT * FROM plan.power_changes ORDER BY plan_id, job_id").df()
        events = con.execute("SELECT * FROM raw.job_events WHERE event = 'power_changed'").df()
    raised = logged[logged["reason"] == "at_risk"]
    assert len(raised) >= 2, "the σ 0.5 day has runs that fall behind"
    assert (raised["to_limit_w"] > raised["from_limit_w"]).all()
    assert set(logged["status"]) == {"sent"}
    # every change reached the executor once, at its plan's time, and came back as an event (those before the last
    # synced hour)
    assert len(changes) == len(logged)
    assert set(zip(changes["change_plan_id"], changes["job_id"])) == set(zip(logged["plan_id"], logged["job_id"]))
    synced = changes[changes["changed_at"] < DAY + 13 * H]
    assert sorted(zip(events["planner_job_id"], pd.to_datetime(events["event_time"], utc=True))) == sorted(
        zip(synced["job_id"], synced["changed_at"])
    )
    # a raised run ends before it would have at its dispatch limit (replay truth, recomputed here), and some that
    # would have missed their deadline at it end by it
    runs = executor.runs().set_index("job_id")
    with duckdb.connect(str(db), read_only=True) as con:
        deadline = dict(con.execute("SELECT tenant || '/' || job_id, deadline FROM queue.jobs").fetchall())
    saved = 0
    for job in raised["job_id"].unique():
        run = runs.loc[job]
        mine = changes[changes["job_id"] == job]
        segments = [
            Segment(run["start_time"], 1.0),
            *(Segment(t, f) for t, f in zip(mine["changed_at"], mine["time_factor"])),
        ]
        assert abs(end_time(segments, float(run["work_h"])) - run["true_end"]) <= pd.Timedelta(microseconds=2)
        if (mine["time_factor"] < 1).all():
            assert run["true_end"] < _end_if_kept(run, mine)
        due = pd.Timestamp(deadline[job])
        saved += int(run["true_end"] <= due < _end_if_kept(run, mine))
    assert saved >= 1, "a run behind its plan was raised and ended by the deadline it would have missed"
    # runtime feedback sees a changed run at its dispatch limit's speed: the replay's true work, not its wall hours
    done = finished_runs(DAY + 13 * H, db_path=db, per_key=10_000).set_index("job_id")
    changed = [j for j in done.index if j in set(changes["job_id"]) and runs.loc[j, "true_end"] < DAY + 13 * H]
    assert changed
    for job in changed:
        assert done.loc[job, "actual_h"] == pytest.approx(runs.loc[job, "work_h"], rel=1e-6)
    hour = results[-1].as_dict()
    assert {"running_followed", "raised_at_risk", "changed_for_carbon", "projected_late"} <= set(hour["plan"]["power"])


def test_without_recapping_no_limit_changes(tmp_path, data_dir):
    db, executor, _, _ = _operate(tmp_path, data_dir, hours=8, recapping=Recapping(enabled=False))
    assert executor.changes().empty
    assert read_changes(None, db).empty


def test_a_loop_killed_mid_change_changes_nothing_twice(tmp_path, data_dir):
    db, executor, results, settings = _operate(tmp_path, data_dir, hours=6)
    fleet = settings["fleet"]
    executors = dict.fromkeys(fleet.names, executor)
    # find the first later hour that decides a change, and kill its dispatch step after the executor's change
    for h in range(6, 14):
        ctx = loop.context(DAY + h * H, executors=executors, **settings)
        loop.sync(ctx)
        plan, _, pending = loop.plan(ctx)
        if len(read_changes(ctx.plan_id, db)):
            break
        loop.dispatch_plan(ctx, plan, pending)
    else:
        pytest.fail("no hour decided a power change")

    def crash(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after the first change reached the executor")

    with pytest.raises(KeyboardInterrupt):
        apply_power_changes(ctx.plan_id, executor, db, _fault=crash)
    before = executor.changes()
    assert (read_changes(ctx.plan_id, db)["status"] == "intent").all()
    again = loop.run_hour(ctx.plan_time, executors=executors, **settings)
    assert again.dispatch["power"]["reconciled"] == 1 and not again.dispatch["power"]["failed"]
    after = executor.changes()
    assert after.duplicated(["job_id", "changed_at"]).sum() == 0
    assert len(after) == len(before) + again.dispatch["power"]["sent"]
    assert set(read_changes(ctx.plan_id, db)["status"]) <= {"sent", "no_run"}
    twice = loop.run_hour(ctx.plan_time, executors=executors, **settings)  # a third run: nothing more
    assert twice.dispatch["power"]["sent"] == 0 and len(executor.changes()) == len(after)
