"""The replay executor: true run times that are not the plan's estimates, deterministic; failures at the configured
rate; sync windows that partition the events; running() consistent with the events; cancel; fail-open."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scheduling.executors.base import EVENT_COLUMNS, RUNNING_COLUMNS
from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.replay import ReplayExecutor, failure_draw, noise_factor
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

H = pd.Timedelta(hours=1)


def test_true_run_time_is_the_estimate_times_seeded_lognormal_noise():
    executor = ReplayExecutor(sigma=0.15, failure_rate=0.0)
    runs, records = executor.plan_runs(plan_id_at(), sample_items(400))
    assert records["error"].isna().all()
    factor = runs["true_duration_h"] / runs["est_duration_h"]
    assert (runs["duration_source"] == "noise").all()
    assert (factor != 1.0).all()  # not the plan's estimate
    logs = np.log(factor)
    assert abs(logs.mean()) < 0.03 and abs(logs.std() - 0.15) < 0.02  # lognormal, median 1, sigma as configured
    again, _ = ReplayExecutor(sigma=0.15, failure_rate=0.0).plan_runs(plan_id_at(), sample_items(400))
    pd.testing.assert_frame_equal(runs, again)  # deterministic
    other_seed, _ = ReplayExecutor(sigma=0.15, failure_rate=0.0, seed=1).plan_runs(plan_id_at(), sample_items(400))
    assert not np.allclose(other_seed["true_duration_h"], runs["true_duration_h"])
    assert noise_factor("acme/job-0000", 0.15) == noise_factor("acme/job-0000", 0.15)
    still, _ = ReplayExecutor(sigma=0.0, failure_rate=0.0).plan_runs(plan_id_at(), sample_items(10))
    assert (still["true_duration_h"] == still["est_duration_h"]).all()
    end = runs["start_time"] + pd.to_timedelta(runs["true_duration_h"] * 3600, unit="s")
    assert ((runs["true_end"] - end).abs() < pd.Timedelta(milliseconds=1)).all()


def test_truth_file_gives_the_true_run_time(tmp_path):
    truth = tmp_path / "truth.csv"
    truth.write_text("job_id,true_duration_h\nacme/job-0000,7.5\njob-0001,0.25\n")  # planner id, then queue id
    runs, _ = ReplayExecutor(truth=truth, failure_rate=0.0).plan_runs(plan_id_at(), sample_items(3))
    runs = runs.set_index("job_id")
    assert runs.loc["acme/job-0000", ["true_duration_h", "duration_source"]].tolist() == [7.5, "truth"]
    assert runs.loc["globex/job-0001", ["true_duration_h", "duration_source"]].tolist() == [0.25, "truth"]
    assert runs.loc["acme/job-0002", "duration_source"] == "noise"  # not listed


@pytest.mark.parametrize(
    "text, message",
    [
        ("job,true_duration_h\nx,1\n", "missing column 'job_id'"),
        ("job_id,true_duration_h\nx,1\ny,soon\n", "row 3, field 'true_duration_h': not a number"),
        ("job_id,true_duration_h\nx,-1\n", "row 2, field 'true_duration_h': must be a positive number"),
        ("job_id,true_duration_h\nx,1\nx,2\n", "row 3, field 'job_id': 'x' listed twice"),
    ],
)
def test_bad_truth_file_names_row_and_field(tmp_path, text, message):
    truth = tmp_path / "truth.csv"
    truth.write_text(text)
    with pytest.raises(ValueError, match=message):
        ReplayExecutor(truth=truth)
    with pytest.raises(FileNotFoundError, match="setting 'truth'"):
        ReplayExecutor(truth=tmp_path / "missing.csv")


@pytest.mark.parametrize("rate", [0.02, 0.1])
def test_failure_rate_is_honoured_and_deterministic_per_attempt(rate):
    n = 4000
    items = sample_items(n, tenants=("t",))
    runs, _ = ReplayExecutor(failure_rate=rate).plan_runs(plan_id_at(), items)
    failed = runs["outcome"] == "failed"
    assert abs(failed.mean() - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    ran = (runs["true_end"] - runs["start_time"]).dt.total_seconds() / 3600
    assert (ran[failed] < runs.loc[failed, "true_duration_h"]).all()  # fails partway
    assert np.allclose(ran[~failed], runs.loc[~failed, "true_duration_h"])
    fractions = ran[failed] / runs.loc[failed, "true_duration_h"]
    assert 0.3 < fractions.mean() < 0.7  # uniform in (0, 1)
    # per (job, attempt): the same attempt always fails the same way, another attempt draws again
    draws = [failure_draw(f"t/job-{i}", 1, 0.5) for i in range(200)]
    assert draws == [failure_draw(f"t/job-{i}", 1, 0.5) for i in range(200)]
    assert draws != [failure_draw(f"t/job-{i}", 2, 0.5) for i in range(200)]
    retry = items.assign(attempt=2)
    runs2, _ = ReplayExecutor(failure_rate=rate).plan_runs(plan_id_at(), retry)
    assert (runs2["true_duration_h"] == runs["true_duration_h"]).all()  # the run time belongs to the job
    assert (runs2["outcome"] != runs["outcome"]).any()


def _three_plans(db):
    """Jobs dispatched at 12:00, 13:00 and 15:00 (one starting later than its plan), one cancelled."""
    executor = ReplayExecutor(db_path=db, failure_rate=0.2)
    for k, hour in enumerate((0, 1, 3)):
        t = PLAN_TIME + hour * H
        items = sample_items(8, plan_time=t, prefix=f"p{k}")
        if k == 2:
            items.loc[0, ["start_time", "end_time"]] = [t + 2 * H, t + 4 * H]
        dispatch(plan_id_at(t), items, executor, db_path=db)
    assert executor.cancel("acme/p0-0002", PLAN_TIME + 1.5 * H)
    return executor


def test_sync_windows_partition_the_events(tmp_warehouse):
    executor = _three_plans(tmp_warehouse)
    a, b, c = PLAN_TIME - H, PLAN_TIME + 2.5 * H, PLAN_TIME + 30 * H
    whole = executor.sync(c, since=a)
    assert list(whole.columns) == list(EVENT_COLUMNS)
    parts = pd.concat([executor.sync(b, since=a), executor.sync(c, since=b)], ignore_index=True)
    pd.testing.assert_frame_equal(whole, parts)
    hourly = pd.concat(
        [executor.sync(a + (k + 1) * H, since=a + k * H) for k in range(int((c - a) / H))], ignore_index=True
    )
    pd.testing.assert_frame_equal(whole, hourly)
    pd.testing.assert_frame_equal(whole, executor.sync(c, since=a))  # the same window again: the same events
    pd.testing.assert_frame_equal(whole, executor.sync(c))  # nothing before a
    counts = whole.groupby("planner_job_id")["event"].apply(list)
    assert len(counts) == 24
    for job, events in counts.items():
        assert events[0] == "dispatched"
        assert events.count("started") == 1 and len(events) == 3, (job, events)
        assert events[-1] in ("finished", "failed", "cancelled")
    assert counts["acme/p0-0002"] == ["dispatched", "started", "cancelled"]
    started = whole[whole["event"] == "started"].set_index("planner_job_id")["event_time"]
    assert started["acme/p2-0000"] == PLAN_TIME + 5 * H  # at its planned start, not its plan time
    assert set(whole["job_id"]) == {f"p{k}-{i:04d}" for k in range(3) for i in range(8)}
    assert whole["energy_kwh"].isna().all() and (whole["executor"] == "replay").all()


def test_running_is_consistent_with_the_events(tmp_warehouse):
    executor = _three_plans(tmp_warehouse)
    events = executor.sync(PLAN_TIME + 40 * H)
    for minutes in range(0, 40 * 60, 30):
        now = PLAN_TIME + pd.Timedelta(minutes=minutes)
        seen = events[events["event_time"] <= now]
        started = set(seen.loc[seen["event"] == "started", "planner_job_id"])
        ended = set(seen.loc[seen["event"].isin(["finished", "failed", "cancelled"]), "planner_job_id"])
        running = executor.running(now)
        assert list(running.columns) == list(RUNNING_COLUMNS)
        assert set(running["job_id"]) == started - ended, now
        assert (running["end_time"] > now).all() and running["confirmed"].all()
        assert running["node"].notna().all() and running["gpu_devices"].notna().all()


def test_running_reports_the_planned_end_not_the_truth(tmp_warehouse, tmp_path):
    truth = tmp_path / "truth.csv"
    truth.write_text("job_id,true_duration_h\nacme/job-0000,3\n")  # the run takes 3 h, the plan says 1 h
    executor = ReplayExecutor(db_path=tmp_warehouse, truth=truth, failure_rate=0.0)
    items = sample_items(1)
    dispatch(plan_id_at(), items, executor, db_path=tmp_warehouse)
    at_half = executor.running(PLAN_TIME + 0.5 * H)
    assert at_half["end_time"].tolist() == [PLAN_TIME + H]
    overrun = executor.running(PLAN_TIME + 1.25 * H)  # outlived its plan: bound to the next full hour
    assert overrun["end_time"].tolist() == [PLAN_TIME + 2 * H]
    assert executor.running(PLAN_TIME + 3 * H).empty


def test_cancel_before_and_during_a_run(tmp_warehouse):
    executor = ReplayExecutor(db_path=tmp_warehouse, failure_rate=0.0)
    items = sample_items(3)
    items.loc[2, ["start_time", "end_time"]] = [PLAN_TIME + 2 * H, PLAN_TIME + 3 * H]
    dispatch(plan_id_at(), items, executor, db_path=tmp_warehouse)
    assert not executor.cancel("acme/job-0000", PLAN_TIME - H)  # not dispatched yet on the replay clock
    assert executor.cancel("acme/job-0000", PLAN_TIME + 0.5 * H)  # running
    assert not executor.cancel("acme/job-0000", PLAN_TIME + 0.6 * H)  # already ended
    assert executor.cancel("acme/job-0002", PLAN_TIME + H)  # before its start
    assert not executor.cancel("nobody/none", PLAN_TIME)
    events = executor.sync(PLAN_TIME + 10 * H).groupby("planner_job_id")
    by_job = {job: list(zip(g["event"], g["event_time"])) for job, g in events}
    assert by_job["acme/job-0000"] == [
        ("dispatched", PLAN_TIME),
        ("started", PLAN_TIME),
        ("cancelled", PLAN_TIME + 0.5 * H),
    ]
    assert by_job["acme/job-0002"] == [("dispatched", PLAN_TIME), ("cancelled", PLAN_TIME + H)]
    assert [e for e, _ in by_job["globex/job-0001"]] == ["dispatched", "started", "finished"]
    assert "acme/job-0000" not in set(executor.running(PLAN_TIME + 0.75 * H)["job_id"])


def test_fail_open_dispatched_jobs_run_without_the_planner(tmp_warehouse):
    """Dispatch at 12:00, then no planner runs: a fresh executor over the same warehouse still reports every job
    started at its planned time and ended."""
    items = sample_items(6)
    items.loc[5, ["start_time", "end_time"]] = [PLAN_TIME + 4 * H, PLAN_TIME + 6 * H]
    dispatch(plan_id_at(), items, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    events = ReplayExecutor(db_path=tmp_warehouse).sync(PLAN_TIME + 48 * H)
    started = events[events["event"] == "started"].set_index("planner_job_id")["event_time"]
    planned = items.set_index("job_id")["start_time"]
    assert started.sort_index().to_dict() == planned.sort_index().to_dict()
    assert events["event"].isin(["finished", "failed"]).sum() == 6


def test_deterministic_across_warehouses(tmp_path):
    frames = []
    for k in range(2):
        db = tmp_path / f"wh{k}.duckdb"
        executor = _three_plans(db)
        frames.append(executor.sync(PLAN_TIME + 40 * H))
    pd.testing.assert_frame_equal(*frames)
