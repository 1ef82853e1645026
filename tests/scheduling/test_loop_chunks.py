"""A checkpointing job longer than the plan horizon, through the real loop (replay executor, shared grid data): with a
24-hour horizon a 40-hour job allowed only in us-west (one cluster) is planned on its first chunk (12 hours of work
at its fastest, plus the checkpoint), and its run is decided again at the end of each chunk by the pause rule, with
pausing for carbon off: it runs on at some chunk ends and stops at its checkpoint at one (reason `chunk`) where
resuming later emits at least 10 % less; the rest, no longer than the horizon, is planned whole and finishes the
work exactly by the deadline. Checked against the replay's truth and the chunk rule computed here."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from scheduling import loop
from scheduling.executors.preempt_log import read_preemptions
from scheduling.executors.replay import ReplayExecutor
from scheduling.queue.intake import submit_file
from scheduling.service import plan_fleet

DAY = pd.Timestamp("2021-07-15T00:00Z")
H = pd.Timedelta(hours=1)
JOB = "t/long"
WORK_H = 40.0
HORIZON_H = 24
DEADLINE = pd.Timestamp("2021-07-19T00:00Z")
SPEC = f"""jobs:
  - tenant: t
    job_id: long
    submitted_at: 2021-07-15T00:00:00Z
    gpus: 1
    cpu_milli: 8000
    memory_mib: 32768
    job_type: ResNet-50 (batch size 64)
    est_duration_h: {WORK_H}
    deadline: {DEADLINE.strftime("%Y-%m-%dT%H:%M:%SZ")}
    checkpoint_interval_min: 30
    home_region: us-west
    allowed_regions: [us-west]
"""


@pytest.fixture(scope="module")
def operated(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("chunk_loop")
    db = tmp / "warehouse.duckdb"
    (tmp / "jobs.yaml").write_text(SPEC)
    assert not submit_file(tmp / "jobs.yaml", db_path=db, data_dir=data_dir).rejected
    fleet = plan_fleet(None, data_dir).sampled()
    assert [c.name for c in fleet.clusters if c.config.region == "us-west"] == ["usw-v100m16"]
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp / "s", fleet=fleet, horizon_hours=HORIZON_H,
                    executors=dict.fromkeys(fleet.names, executor))  # fmt: skip
    hour = DAY
    while hour < DEADLINE + 12 * H and _state(db) != "finished":
        loop.run_hour(hour, **settings)
        hour += H
    return db, executor


def _state(db) -> str:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT state FROM queue.jobs").fetchone()[0]


def test_a_long_job_is_decided_at_the_end_of_each_chunk_and_stops_where_that_pays(operated):
    db, executor = operated
    runs = executor.runs().sort_values("start_time").reset_index(drop=True)
    (stop,) = read_preemptions(db_path=db).itertuples()
    with duckdb.connect(str(db), read_only=True) as con:
        plans = con.execute("SELECT plan_id, chunk_end FROM plan.assignments WHERE job_id = ?", [JOB]).df()
    runs = runs.merge(plans, on="plan_id", how="left")
    assert len(runs) == 2 and (stop.reason, stop.status) == ("chunk", "sent")
    first, rest = runs.iloc[0], runs.iloc[1]
    # the first chunk: 12 hours of work at the fastest (the job's only cluster, its estimate), on the dispatch
    # limit (its true duration: sigma 0), then the checkpoint written
    length_h = (HORIZON_H / 2) * first["true_duration_h"] / WORK_H + stop.save_h
    assert (first["chunk_end"] - first["start_time"]) / H == pytest.approx(length_h, abs=1e-6)
    # stopped in the hour after the end of a chunk, not the first: it ran on at the earlier ones
    ran_h = (pd.Timestamp(stop.preempt_at) - first["start_time"]) / H
    n = ran_h // length_h
    assert n >= 2 and ran_h - n * length_h < 1.0 and pd.Timestamp(stop.preempt_at) == first["preempted_at"]
    assert stop.kgco2e <= 0.9 * stop.kgco2e_kept  # the pause rule's 10 %, by the forecast
    worked_h = ran_h - stop.save_h
    assert first["kept_share"] == pytest.approx(worked_h / first["true_duration_h"], rel=1e-9)
    assert stop.work_done == pytest.approx(first["kept_share"], rel=1e-6)
    # the rest fits the horizon: planned whole, restores the checkpoint and finishes the work exactly
    assert pd.isna(rest["chunk_end"]) and rest["outcome"] == "finished"
    assert rest["work_done"] == pytest.approx(first["kept_share"]) and rest["restore_h"] == stop.save_h
    rest_h = stop.save_h + (1.0 - rest["work_done"]) * rest["true_duration_h"]
    assert abs(rest["true_end"] - rest["start_time"] - rest_h * H) <= pd.Timedelta(microseconds=1)
    assert rest["true_end"] <= DEADLINE


def test_the_queue_and_the_events_follow_the_stop(operated):
    db, _ = operated
    with duckdb.connect(str(db), read_only=True) as con:
        events = con.execute(
            "SELECT event, attempt FROM raw.job_events WHERE planner_job_id = ? ORDER BY event_time, event", [JOB]
        ).fetchall()
        history = con.execute("SELECT to_state FROM queue.job_history WHERE tenant = 't' ORDER BY seq").fetchall()
        state = con.execute("SELECT state FROM queue.jobs").fetchone()[0]
    assert events == [("dispatched", 1), ("started", 1), ("preempted", 1), ("dispatched", 2), ("resumed", 2),
                      ("finished", 2)]  # fmt: skip
    assert [s for (s,) in history].count("preempted") == 1 and state == "finished"
