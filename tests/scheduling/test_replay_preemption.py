"""The replay executor's preemption: a run stopped at a checkpoint keeps the work done by the checkpoint signal,
hand-computed through a power change; the job's next run (here on another replay executor: a migration) restores
the checkpoint and does exactly the rest; the events say `preempted` and `resumed`; the same deciding plan preempts
once; a run that is not live is not preempted; a preempted run is not running and cannot be cancelled."""

from __future__ import annotations

import pandas as pd
import pytest

from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.replay import ReplayExecutor
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

H = pd.Timedelta(hours=1)
T0 = PLAN_TIME
SAVE_H = 0.25


def _near(a, b) -> bool:
    return abs(pd.Timestamp(a) - pd.Timestamp(b)) <= pd.Timedelta(microseconds=1)


def test_preempt_keeps_the_work_at_the_signal_and_the_resumed_run_does_the_rest(tmp_path):
    db = tmp_path / "wh.duckdb"
    first = ReplayExecutor(db_path=db, name="east", sigma=0.0, failure_rate=0.0)
    other = ReplayExecutor(db_path=db, name="west", sigma=0.0, failure_rate=0.0)
    items = sample_items(1)
    items.loc[0, ["end_time", "est_duration_h"]] = [T0 + 10 * H, 10.0]  # sigma 0: the true run time is 10 h
    job = items.loc[0, "job_id"]
    dispatch(plan_id_at(), items, first, db_path=db)
    # capped to 1.25 (slower) at +2 h; preempted at +4 h: signal at +3.75 h -> 2 + 1.75 / 1.25 = 3.4 h of work
    assert first.set_power_limit(job, 150.0, T0 + 2 * H, plan_id=plan_id_at(T0 + 2 * H), time_factor=1.25)
    ref = first.preempt(job, T0 + 4 * H, plan_id=plan_id_at(T0 + 4 * H), save_h=SAVE_H)
    assert ref is not None
    assert first.preempt(job, T0 + 4 * H, plan_id=plan_id_at(T0 + 4 * H), save_h=SAVE_H) == ref  # once per plan
    run = first.runs().iloc[0]
    assert run["kept_share"] == pytest.approx(3.4 / 10.0) and run["preempted_at"] == T0 + 4 * H
    assert first.running(T0 + 4 * H).empty and not first.cancel(job, T0 + 5 * H)
    assert first.preempt(job, T0 + 5 * H, plan_id=plan_id_at(T0 + 5 * H), save_h=SAVE_H) is None  # nothing live

    # resumed at +6 h on the other executor: restore 0.25 h, then the 6.6 h left at its dispatch limit (the plan
    # estimated a run of 5.25 h: the restore and 5 h of work at a 50 % share done, so a 10 h job)
    again = sample_items(1, plan_time=T0 + 6 * H)
    again.loc[0, ["end_time", "est_duration_h", "attempt", "work_done"]] = [T0 + 11.25 * H, 5.25, 2, 0.5]
    dispatch(plan_id_at(T0 + 6 * H), again, other, db_path=db)
    resumed = other.runs().iloc[0]
    assert resumed["work_done"] == pytest.approx(0.34) and resumed["restore_h"] == pytest.approx(SAVE_H)
    assert _near(resumed["true_end"], T0 + 6 * H + (SAVE_H + 6.6) * H)

    events = pd.concat([first.sync(T0 + 24 * H), other.sync(T0 + 24 * H)])
    seen = [(e.executor, e.event, e.event_time) for e in events.itertuples()]
    assert ("east", "started", T0) in seen and ("east", "power_changed", T0 + 2 * H) in seen
    assert ("east", "preempted", T0 + 4 * H) in seen and not any(e == "finished" for x, e, _ in seen if x == "east")
    assert ("west", "resumed", T0 + 6 * H) in seen and not any(e == "started" for x, e, _ in seen if x == "west")
    finished = [t for x, e, t in seen if x == "west" and e == "finished"]
    assert len(finished) == 1 and _near(finished[0], resumed["true_end"])


def test_a_power_change_during_the_restore_applies_when_the_work_begins(tmp_path):
    db = tmp_path / "wh.duckdb"
    ex = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    items = sample_items(1)
    items.loc[0, ["end_time", "est_duration_h"]] = [T0 + 4 * H, 4.0]
    job = items.loc[0, "job_id"]
    dispatch(plan_id_at(), items, ex, db_path=db)
    ex.preempt(job, T0 + 2 * H, plan_id=plan_id_at(T0 + 2 * H), save_h=0.5)  # kept 1.5 h of 4
    again = sample_items(1, plan_time=T0 + 3 * H)
    again.loc[0, ["end_time", "est_duration_h", "attempt", "work_done"]] = [T0 + 6 * H, 3.0, 2, 1.5 / 4]
    dispatch(plan_id_at(T0 + 3 * H), again, ex, db_path=db)
    # restore 0.5 h from +3 h; a change to 2.0 at +3.25 h holds from +3.5 h: 2.5 h of work take 5 h
    ex.set_power_limit(job, 120.0, T0 + 3.25 * H, plan_id=plan_id_at(T0 + 3.25 * H), time_factor=2.0)
    resumed = ex.runs().sort_values("start_time").iloc[-1]
    assert _near(resumed["true_end"], T0 + 8.5 * H)
