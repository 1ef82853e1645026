"""Preemption for carbon (opt-in) through the real loop (replay executor, shared grid data): a 16-hour checkpointing job
allowed only in us-west, with three days to its deadline, runs through the solar hours, is stopped at a checkpoint
before the evening and resumes from it in the next day's solar hours. The checkpoint keeps the work done by the
signal (recomputed here from the replay's truth), the resumed run restores it and does exactly the rest, the queue
goes running -> preempted -> queued, the events say preempted and resumed, the deadline is met, and running the
preempting hour again, or the dispatch after a crash between the executor's preemption and its mark, preempts
nothing twice."""

from __future__ import annotations

import logging

import duckdb
import pandas as pd
import pytest

from scheduling import loop
from scheduling.executors.preempt_log import apply_preemptions, read_preemptions
from scheduling.executors.replay import ReplayExecutor
from scheduling.planning.pausing import Pausing
from scheduling.queue.intake import submit_file
from scheduling.service import plan_fleet

DAY = pd.Timestamp("2021-07-15T00:00Z")
H = pd.Timedelta(hours=1)
JOB = "t/long"
SPEC = """jobs:
  - tenant: t
    job_id: long
    submitted_at: 2021-07-15T00:00:00Z
    gpus: 1
    cpu_milli: 8000
    memory_mib: 32768
    job_type: ResNet-50 (batch size 64)
    est_duration_h: 16
    deadline: 2021-07-18T00:00:00Z
    checkpoint_interval_min: 30
    home_region: us-west
    allowed_regions: [us-west]
    input_gb: 1
"""


@pytest.fixture(scope="module")
def operated(tmp_path_factory, data_dir):
    from transforms.runner import build
    from warehouse.ingest import ingest

    tmp = tmp_path_factory.mktemp("preempt_loop")
    db = tmp / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)  # the ledger values the grid marts
    assert build(select="+grid_hourly", warehouse_path=db, target_path=tmp / "target").ok
    (tmp / "jobs.yaml").write_text(SPEC)
    assert not submit_file(tmp / "jobs.yaml", db_path=db, data_dir=data_dir).rejected
    fleet = plan_fleet(None, data_dir).sampled()
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp / "s", fleet=fleet,
                    executors=dict.fromkeys(fleet.names, executor), pausing=Pausing(for_carbon=True))  # fmt: skip
    results = loop.run_hours(DAY, 60, **settings)
    return db, executor, results, settings


def test_a_paused_job_resumes_from_its_checkpoint_and_keeps_its_deadline(operated):
    db, executor, results, _ = operated
    logged = read_preemptions(db_path=db)
    assert len(logged) == 1, logged
    pause = logged.iloc[0]
    assert (pause["job_id"], pause["reason"], pause["status"]) == (JOB, "carbon", "sent")
    assert pause["kgco2e"] <= 0.9 * pause["kgco2e_kept"]  # the rule's 10 % (forecast)
    runs = executor.runs().sort_values("start_time").reset_index(drop=True)
    assert len(runs) == 2
    first, second = runs.iloc[0], runs.iloc[1]
    at = pd.Timestamp(pause["preempt_at"])
    assert first["preempted_at"] == at and executor.changes().empty  # no power change: one limit throughout
    # the replay's truth: the work by the signal (save_h before the stop), of the job's true run time
    ran_h = (at - first["start_time"]) / H - pause["save_h"]
    assert first["kept_share"] == pytest.approx(ran_h / first["true_duration_h"])
    # the planner's estimate of that share is the truth here (sigma 0: runs take their estimate)
    assert pause["work_done"] == pytest.approx(first["kept_share"], rel=1e-6)
    # the resumed run: the restore, then exactly the rest of its true run time
    assert second["work_done"] == pytest.approx(first["kept_share"]) and second["restore_h"] == pause["save_h"]
    rest_h = second["restore_h"] + (1 - second["work_done"]) * second["true_duration_h"]
    assert abs(second["true_end"] - second["start_time"] - rest_h * H) <= pd.Timedelta(microseconds=1)
    assert second["start_time"] >= at + H and second["true_end"] <= pd.Timestamp("2021-07-18T00:00Z")

    with duckdb.connect(str(db), read_only=True) as con:
        events = con.execute(
            "SELECT event, event_time, attempt FROM raw.job_events WHERE planner_job_id = ? ORDER BY event_time, event",
            [JOB],
        ).fetchall()
        history = con.execute(
            "SELECT from_state, to_state FROM queue.job_history WHERE tenant = 't' ORDER BY seq"
        ).fetchall()
        state, checkpoint = con.execute(
            "SELECT j.state, c.work_done FROM queue.jobs AS j JOIN queue.checkpoints AS c USING (tenant, job_id)"
        ).fetchone()
    kinds = [(e, a) for e, _, a in events]
    assert kinds == [("dispatched", 1), ("started", 1), ("preempted", 1), ("dispatched", 2), ("resumed", 2),
                     ("finished", 2)]  # fmt: skip
    assert ("running", "preempted") in history and ("preempted", "queued") in history
    assert state == "finished" and checkpoint == pytest.approx(pause["work_done"])


def test_the_preempting_hour_run_again_preempts_nothing_twice(operated):
    db, executor, _, settings = operated
    at = pd.Timestamp(read_preemptions(db_path=db).iloc[0]["preempt_at"])
    before = executor.runs()
    again = loop.run_hour(at, **settings).as_dict()
    assert again["dispatch"]["preempted"]["sent"] == 0
    assert len(read_preemptions(db_path=db)) == 1
    pd.testing.assert_frame_equal(executor.runs(), before)


def test_a_crash_between_the_preemption_and_its_mark_is_reconciled(operated):
    db, executor, _, _ = operated
    row = read_preemptions(db_path=db).iloc[0]
    # the log forgets the mark (as if the loop died right after the executor took the preemption)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE plan.preemptions SET status = 'intent', executor_ref = NULL")
    done = apply_preemptions(row["plan_id"], executor, db)
    assert done["reconciled"] == [JOB] and not done["sent"]
    assert read_preemptions(db_path=db).iloc[0]["executor_ref"] == row["executor_ref"]


def test_the_ledger_has_a_partial_run_per_attempt_and_the_job_page_a_card(operated, tmp_path):
    """Each attempt valued over its own hours (the preempted one's carbon recomputed here from marts.grid_hourly),
    the job's ledger row summing both, its deadline met by the last; the Carbon job page lists the preemption with
    its card against keeping the job running."""
    from scheduling.output.ledger import LEDGER_SELECT
    from transforms.runner import build
    from ui import data, pages

    db, executor, _, _ = operated
    assert build(select=list(LEDGER_SELECT), warehouse_path=db, target_path=tmp_path / "target").ok
    first = executor.runs().sort_values("start_time").iloc[0]
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute(
            "SELECT attempt, outcome, started_at, ended_at, realized_kgco2e, zone FROM marts.job_runs "
            "WHERE planner_job_id = ? ORDER BY attempt",
            [JOB],
        ).df()
        ledger = con.execute(
            "SELECT attempts, outcome, deadline_met, realized_kgco2e FROM marts.carbon_ledger "
            "WHERE tenant = 't' AND job_id = 'long'"
        ).fetchone()
        draw = con.execute(
            "SELECT draw_kw FROM plan.assignments WHERE plan_id = ? AND job_id = ?", [first["plan_id"], JOB]
        ).fetchone()[0]
        grid = dict(
            con.execute(
                "SELECT hour_utc, carbon_intensity_direct_gco2_per_kwh FROM marts.grid_hourly WHERE region = ?",
                [runs.iloc[0]["zone"]],
            ).fetchall()
        )
    assert list(zip(runs["attempt"], runs["outcome"])) == [(1, "preempted"), (2, "finished")]
    start, end = pd.Timestamp(runs.iloc[0]["started_at"]), pd.Timestamp(runs.iloc[0]["ended_at"])
    assert (start, end) == (first["start_time"], first["preempted_at"])
    hour, kg = start.floor("h"), 0.0
    while hour < end:
        share = (min(end, hour + H) - max(start, hour)) / H  # of the hour the run covers
        kg += draw * share * grid[hour.to_pydatetime()] / 1000.0
        hour += H
    assert runs.iloc[0]["realized_kgco2e"] == pytest.approx(kg, rel=1e-9)
    assert ledger[:3] == (2, "finished", True)
    assert ledger[3] == pytest.approx(runs["realized_kgco2e"].sum(), rel=1e-12)

    with duckdb.connect(str(db), read_only=True) as con:
        doc = data.job_page(con, "t", "long")
    assert len(doc["preemptions"]) == 1 and "Kept running" in doc["preemptions"][0]["text"]
    html = pages.job_page(doc, "")
    assert "Preemptions (1)" in html and html.count('class="card preemption"') == 1


def test_a_drained_nodes_checkpointing_job_moves_to_another_node(tmp_path, data_dir, caplog):
    """The job's node is drained while it runs: the next hour stops it at a checkpoint (reason drained), says so in
    its warning, and it resumes from the checkpoint on another node, its work kept."""
    db = tmp_path / "warehouse.duckdb"
    (tmp_path / "jobs.yaml").write_text(SPEC)
    assert not submit_file(tmp_path / "jobs.yaml", db_path=db, data_dir=data_dir).rejected
    fleet = plan_fleet(None, data_dir).sampled()
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp_path / "s",
                    executors=dict.fromkeys(fleet.names, executor))  # fmt: skip
    hour = DAY
    while executor.running(hour).empty:  # until the job runs
        loop.run_hour(hour, fleet=fleet, **settings)
        hour += H
        assert hour < DAY + 24 * H, "the job never started"
    run = executor.running(hour).iloc[0]
    drained = fleet.with_drained({run["cluster"]: {run["node"]: "maintenance"}})
    caplog.set_level(logging.WARNING)
    result = loop.run_hour(hour, fleet=drained, **settings)
    (pause,) = read_preemptions(db_path=db).itertuples()
    (entry,) = result.plan["running_off_fleet"]
    assert entry["moving"] == [JOB] and entry["node_state"] == "drained"
    assert any(f"job(s) {JOB} are preempted at a checkpoint and move" in r.getMessage() for r in caplog.records)
    assert (pause.reason, pause.status, pd.Timestamp(pause.preempt_at)) == ("drained", "sent", hour)
    for _ in range(48):
        hour += H
        loop.run_hour(hour, fleet=drained, **settings)
        if len(executor.runs()) == 2 and executor.running(hour).empty:
            break
    first, second = executor.runs().sort_values("start_time").itertuples()
    assert second.node != first.node and first.kept_share > 0 and second.work_done == pytest.approx(first.kept_share)
    assert second.start_time >= first.preempted_at + H and second.true_end <= pd.Timestamp("2021-07-18T00:00Z")


DUE = """jobs:
  - tenant: t
    job_id: due
    submitted_at: {at}
    gpus: 8
    cpu_milli: 8000
    memory_mib: 32768
    job_type: ResNet-50 (batch size 64)
    est_duration_h: 4
    deadline: {deadline}
    home_region: us-west
    allowed_regions: [us-west]
    input_gb: 1
"""


def test_a_due_job_preempts_a_checkpointing_run_with_slack_and_both_keep_their_deadlines(tmp_path, data_dir):
    """us-west keeps one schedulable 8-GPU node, held by the long checkpointing job; a 4-hour job due now arrives
    there: the hour's plan preempts the long job (reason deadline), starts the due job at once on that node, and the
    long job resumes from its checkpoint later; both deadlines are met."""
    db = tmp_path / "warehouse.duckdb"
    spec = SPEC.replace("gpus: 1", "gpus: 8")
    (tmp_path / "jobs.yaml").write_text(spec)
    assert not submit_file(tmp_path / "jobs.yaml", db_path=db, data_dir=data_dir).rejected
    full = plan_fleet(None, data_dir).sampled()
    west = next(c for c in full.clusters if c.name == "usw-v100m16")
    kept = west.nodes["sn"].iloc[0]
    fleet = full.with_drained({west.name: dict.fromkeys(west.nodes["sn"].iloc[1:], "maintenance")})
    executor = ReplayExecutor(db_path=db, sigma=0.0, failure_rate=0.0)
    settings = dict(db_path=db, data_dir=data_dir, schedule_root=tmp_path / "s", fleet=fleet, deadline_reserve=0.0,
                    executors=dict.fromkeys(fleet.names, executor), pausing=Pausing(for_deadline=True))  # fmt: skip
    hour = DAY
    while executor.running(hour).empty:  # until the long job runs, then one hour more
        loop.run_hour(hour, **settings)
        hour += H
        assert hour < DAY + 24 * H, "the long job never started"
    loop.run_hour(hour, **settings)
    hour += H
    assert executor.running(hour)["node"].tolist() == [kept]
    due_by = hour + pd.Timedelta(hours=4.5)  # only a start now keeps it
    (tmp_path / "due.yaml").write_text(DUE.format(at=hour.isoformat(), deadline=due_by.isoformat()))
    assert not submit_file(tmp_path / "due.yaml", db_path=db, data_dir=data_dir).rejected

    result = loop.run_hour(hour, **settings).as_dict()
    (pause,) = read_preemptions(db_path=db).itertuples()
    assert (pause.job_id, pause.reason, pause.status, pd.Timestamp(pause.preempt_at)) == (JOB, "deadline", "sent", hour)
    assert result["plan"]["preempted"]["by_reason"] == {"deadline": 1} and result["dispatch"]["preempted"]["sent"] == 1
    started = executor.runs().set_index("job_id")
    assert started.loc["t/due", "start_time"] == hour and started.loc["t/due", "node"] == kept
    for _ in range(60):
        hour += H
        loop.run_hour(hour, **settings)
        if len(executor.runs()) == 3 and executor.running(hour).empty:
            break
    runs = executor.runs().sort_values("start_time")
    long_runs = runs[runs["job_id"] == JOB]
    assert len(long_runs) == 2 and long_runs.iloc[1]["work_done"] == pytest.approx(long_runs.iloc[0]["kept_share"])
    assert long_runs.iloc[1]["true_end"] <= pd.Timestamp("2021-07-18T00:00Z")
    due_run = runs[runs["job_id"] == "t/due"].iloc[0]
    assert due_run["true_end"] <= due_by
    assert long_runs.iloc[1]["start_time"] >= due_run["true_end"].floor("h")  # one node: after the due job
