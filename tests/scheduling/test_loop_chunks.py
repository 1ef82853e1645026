"""A checkpointing job longer than the plan horizon, through the real loop (replay executor, shared grid data): with a
24-hour horizon a 40-hour job allowed only in us-west (one cluster) is planned as 12-hour chunks, each run stops at
its checkpoint the first hour after its chunk (reason `chunk`), the rest is queued with its work kept and planned
again (12 hours of 28 left, then the last 16 whole), and the job finishes by its deadline having done exactly its
work. Checked against the replay's truth and the chunk rule computed here."""

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


def test_a_long_job_runs_in_chunks_between_checkpoints(operated):
    db, executor = operated
    runs = executor.runs().sort_values("start_time").reset_index(drop=True)
    stops = read_preemptions(db_path=db).sort_values("preempt_at").reset_index(drop=True)
    with duckdb.connect(str(db), read_only=True) as con:
        plans = con.execute(
            "SELECT plan_id, start_time, end_time, chunk_end FROM plan.assignments WHERE job_id = ?", [JOB]
        ).df()
    planned = runs.merge(plans, on=["plan_id", "start_time"], how="left", suffixes=("", "_plan"))
    assert len(runs) == 3 and list(stops["reason"]) == ["chunk", "chunk"] and (stops["status"] == "sent").all()
    save_h = stops["save_h"].iloc[0]
    done = 0.0  # sigma 0: each run's true duration is the estimate at its limit (true_duration_h, the whole job)
    for i, run in planned.iterrows():
        left_h = (1.0 - done) * WORK_H  # the work left at the job's fastest (its only cluster, default limit)
        if left_h > HORIZON_H:  # a chunk: half the horizon of work, the restore first, the checkpoint written after
            restore = save_h if done > 0 else 0.0
            chunk_h = restore + (HORIZON_H / 2) * run["true_duration_h"] / WORK_H + save_h
            assert (run["chunk_end"] - run["start_time"]) / H == pytest.approx(chunk_h, abs=1e-6)
            stop = stops.iloc[i]
            # the loop stops it at the first planning hour at or after its chunk's end
            assert pd.Timestamp(stop["preempt_at"]) == run["chunk_end"].ceil("h") == run["preempted_at"]
            worked_h = (run["preempted_at"] - run["start_time"]) / H - restore - save_h
            assert run["kept_share"] == pytest.approx(done + worked_h / run["true_duration_h"], rel=1e-9)
            assert stop["work_done"] == pytest.approx(run["kept_share"], rel=1e-6)
            done = run["kept_share"]
        else:  # the rest, whole: no chunk end, restores the checkpoint and finishes the work exactly
            assert pd.isna(run["chunk_end"]) and run["outcome"] == "finished"
            assert run["work_done"] == pytest.approx(done) and run["restore_h"] == save_h
            rest_h = save_h + (1.0 - done) * run["true_duration_h"]
            assert abs(run["true_end"] - run["start_time"] - rest_h * H) <= pd.Timedelta(microseconds=1)
            assert run["true_end"] <= DEADLINE
    assert planned["chunk_end"].notna().sum() == 2


def test_the_queue_and_the_events_follow_each_chunk(operated):
    db, _ = operated
    with duckdb.connect(str(db), read_only=True) as con:
        events = con.execute(
            "SELECT event, attempt FROM raw.job_events WHERE planner_job_id = ? ORDER BY event_time, event", [JOB]
        ).fetchall()
        history = con.execute("SELECT to_state FROM queue.job_history WHERE tenant = 't' ORDER BY seq").fetchall()
        state = con.execute("SELECT state FROM queue.jobs").fetchone()[0]
    assert events == [("dispatched", 1), ("started", 1), ("preempted", 1), ("dispatched", 2), ("resumed", 2),
                      ("preempted", 2), ("dispatched", 3), ("resumed", 3), ("finished", 3)]  # fmt: skip
    assert [s for (s,) in history].count("preempted") == 2 and state == "finished"


def test_runs_dispatched_by_plans_without_chunk_ends_are_whole_runs(tmp_path, data_dir):
    """A warehouse whose plan.assignments predates chunks (no chunk_end column) still gives the loop its running
    jobs' details, each a whole run; once the column exists its value comes through."""
    from scheduling.executors.runs import ASSIGNMENTS

    db = tmp_path / "warehouse.duckdb"
    start = pd.Timestamp("2021-07-15T09:00Z")
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE SCHEMA plan")
        con.execute(
            f"CREATE TABLE {ASSIGNMENTS} (plan_id VARCHAR, job_id VARCHAR, start_time TIMESTAMPTZ, "
            "end_time TIMESTAMPTZ, power_limit_w DOUBLE, deadline TIMESTAMPTZ)"
        )
        con.execute(
            f"INSERT INTO {ASSIGNMENTS} VALUES ('p@1', 't/a', ?, ?, 250.0, ?)",
            [start.to_pydatetime(), (start + 40 * H).to_pydatetime(), DEADLINE.to_pydatetime()],
        )
    fleet = plan_fleet(None, data_dir).sampled()
    ctx = loop.context("2021-07-15T12:00Z", db_path=db, data_dir=data_dir, fleet=fleet,
                       executors=dict.fromkeys(fleet.names, ReplayExecutor(db_path=db)))  # fmt: skip
    running = pd.DataFrame(
        {"plan_id": ["p@1"], "job_id": ["t/a"], "cluster": ["usw-v100m16"], "power_limit_w": [250.0]}
    )
    out = loop._run_details(running, ctx)
    assert out["planned_start"].iloc[0] == start and pd.isna(out["chunk_end"].iloc[0])
    with duckdb.connect(str(db)) as con:
        con.execute(f"ALTER TABLE {ASSIGNMENTS} ADD COLUMN chunk_end TIMESTAMPTZ")
        con.execute(f"UPDATE {ASSIGNMENTS} SET chunk_end = ?", [(start + 12 * H).to_pydatetime()])
    assert loop._run_details(running, ctx)["chunk_end"].iloc[0] == start + 12 * H
