"""The operating loop on the shared data (temporary warehouse, schedule root and replay executor): only the
submitted jobs are planned; an hour run twice leaves every table, the dispatch log and the schedule files as they
were; the next hour sees what the executor reports (dispatched jobs are not pending, running ones hold their GPUs,
CPU and memory however long ago they were submitted); events move the queue (finished, failures retried or failed,
cancellations); forecasts issued after the planning time are never used; bad settings fail before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from scheduling import loop
from scheduling.domain.fleet import load_fleet
from scheduling.executors.dispatch_log import read_log
from scheduling.executors.events import load_events, window_start
from scheduling.executors.files import FilesExecutor
from scheduling.executors.replay import ReplayExecutor
from scheduling.output.plan_store import read_plan, table_digest
from scheduling.output.schedules import tree_digest, verify_schedule_dir
from scheduling.planning.candidates import Evaluator
from scheduling.planning.problem import JobTable, abs_hours, abs_hours_float
from scheduling.queue import store
from scheduling.queue.frame import pending_job_frame
from scheduling.queue.intake import submit_file
from scheduling.queue.trace import write_trace_file
from scheduling.service import plan_fleet, validate_inputs
from scheduling.tasks import resolve_plan_run as resolve_run

T = pd.Timestamp("2021-07-15T12:00:00Z")
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "jobs.yaml"


def _count(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchone()[0]


def _submit_day(db, tmp_path, data_dir, n=40, day="2021-07-15"):
    path = tmp_path / f"jobs-{day}.yaml"
    write_trace_file(path, day, n, plan_fleet(None, data_dir).sampled(), data_dir=data_dir)
    report = submit_file(path, db_path=db, data_dir=data_dir)
    assert not report.rejected, report.rejected[:3]
    return report


def _executor(db, **settings):
    return ReplayExecutor(db_path=db, **settings)


def _ctx(db, tmp_path, data_dir, as_of=T, executor=None, **kwargs):
    fleet = plan_fleet(None, data_dir).sampled()
    executor = executor or _executor(db)
    return loop.context(
        as_of,
        db_path=db,
        data_dir=data_dir,
        schedule_root=tmp_path / "schedules",
        fleet=fleet,
        executors=dict.fromkeys(fleet.names, executor),
        **kwargs,
    )


def _hour(db, tmp_path, data_dir, as_of=T, executor=None):
    ctx = _ctx(db, tmp_path, data_dir, as_of, executor)
    out = loop.HourResult(ctx.plan_time)
    out.sync = loop.sync(ctx)
    plan, out.plan, pending = loop.plan(ctx)
    out.dispatch = loop.dispatch_plan(ctx, plan, pending)
    return out


def _state(db):
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT tenant || '/' || job_id, state, attempts FROM queue.jobs").fetchall()
    return {j: (s, a) for j, s, a in rows}


def _digests(db, root):
    queue = store.table_digest(db_path=db)
    log = read_log(db_path=db).drop(columns=["intent_at", "sent_at"]).to_csv(index=False)
    runs = _count(db, "SELECT count(*) FROM executor.replay_runs")
    return table_digest(db), queue, log, runs, tree_digest(root) if root.exists() else {}


def test_only_the_submitted_jobs_are_planned(tmp_warehouse, tmp_path, data_dir):
    report = submit_file(EXAMPLES, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 10
    out = _hour(tmp_warehouse, tmp_path, data_dir)
    plan = read_plan(out.plan["plan_id"], db_path=tmp_warehouse)
    planned = set(plan.assignments["job_id"]) | set(plan.unplaced["job_id"])
    submitted = {o.job for o in report.outcomes}
    assert planned == submitted and out.plan["n_jobs"] == 10
    states = _state(tmp_warehouse)
    dispatched = set(plan.dispatched()["job_id"])
    assert dispatched and {j for j, (s, _) in states.items() if s == "dispatched"} == dispatched
    assert out.dispatch["sent"] == len(dispatched)


def test_same_hour_twice_is_identical(tmp_warehouse, tmp_path, data_dir):
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    first = _hour(tmp_warehouse, tmp_path, data_dir)
    assert first.plan["plan_id"] == "rolling-lp@2021-07-15T12:00:00Z" and first.plan["n_assigned"] >= 1
    verify_schedule_dir(first.plan["schedule_dir"])
    before = _digests(tmp_warehouse, tmp_path / "schedules")
    again = _hour(tmp_warehouse, tmp_path, data_dir)
    strip = {"seconds"}
    assert {k: v for k, v in again.plan.items() if k not in strip} == {
        k: v for k, v in first.plan.items() if k not in strip
    }
    assert again.dispatch["sent"] == 0 and again.dispatch["skipped"] == first.dispatch["sent"]
    assert _digests(tmp_warehouse, tmp_path / "schedules") == before


def test_a_past_hour_run_again_after_later_hours_changes_nothing(tmp_warehouse, tmp_path, data_dir):
    """Run 11:00 and 12:00, then 11:00 again: the jobs 11:00 dispatched have moved on (running, finished) and the
    queue, the dispatch log and the executor's runs stay as they were (nothing is dispatched twice)."""
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    executor = _executor(tmp_warehouse, failure_rate=0.0)
    first = _hour(tmp_warehouse, tmp_path, data_dir, T - pd.Timedelta(hours=1), executor)
    _hour(tmp_warehouse, tmp_path, data_dir, T, executor)
    started = read_plan(first.plan["plan_id"], db_path=tmp_warehouse).dispatched()["job_id"]
    states = _state(tmp_warehouse)
    assert len(started) and {states[j][0] for j in started} - {"dispatched"}  # some have moved on
    before = _digests(tmp_warehouse, tmp_path / "schedules")  # plans, queue, dispatch log, executor runs, files
    again = _hour(tmp_warehouse, tmp_path, data_dir, T - pd.Timedelta(hours=1), executor)
    assert again.dispatch["sent"] == 0
    assert _digests(tmp_warehouse, tmp_path / "schedules") == before


def test_dry_run_writes_explanations_only(tmp_warehouse, tmp_path, data_dir):
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    ctx = _ctx(tmp_warehouse, tmp_path, data_dir)
    _, out, _ = loop.plan(ctx, dry_run=True)
    assert out["dry_run"] and out["schedule_dir"] is None and out["files"] == 0
    assert _count(tmp_warehouse, "SELECT count(*) FROM plan.plans") == 0
    n = _count(tmp_warehouse, f"SELECT count(*) FROM plan.explanations WHERE plan_id = '{out['plan_id']}'")
    assert n == out["explanations"] >= 1
    assert {s for s, _ in _state(tmp_warehouse).values()} == {"queued"}


def test_next_hour_sees_what_the_executor_reports(tmp_warehouse, tmp_path, data_dir):
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    executor = _executor(tmp_warehouse, failure_rate=0.0)
    first = _hour(tmp_warehouse, tmp_path, data_dir, T - pd.Timedelta(hours=1), executor)
    second = _hour(tmp_warehouse, tmp_path, data_dir, T, executor)
    p1 = read_plan(first.plan["plan_id"], db_path=tmp_warehouse)
    p2 = read_plan(second.plan["plan_id"], db_path=tmp_warehouse)
    started = p1.dispatched()
    assert len(started) >= 1
    assert not set(started["job_id"]) & set(p2.assignments["job_id"])  # dispatched jobs are not planned again
    running = executor.running(T)
    running = running[~running["job_id"].isin(p2.dispatched()["job_id"])]  # what ran before T's own dispatches
    assert set(running["job_id"]) <= set(started["job_id"]) and second.plan["n_running"] == len(running)
    # the hour before's events are in: every job started at 11:00 is running or has ended
    states = _state(tmp_warehouse)
    assert {states[j][0] for j in started["job_id"]} <= {"running", "finished", "failed", "queued"}
    assert second.plan["n_arrived_dispatched"] >= len(started) - second.sync["entered"].get("queued", 0)
    tentative = set(p1.assignments["job_id"]) - set(started["job_id"])
    assert tentative <= set(p2.assignments["job_id"]) | set(p2.unplaced["job_id"])  # planned again


def test_a_job_running_for_more_than_a_day_still_holds_its_cpu_and_memory(tmp_warehouse, tmp_path, data_dir):
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    truth = tmp_path / "truth.csv"
    jobs = store.list_jobs(db_path=tmp_warehouse)
    pd.DataFrame({"job_id": jobs["tenant"] + "/" + jobs["job_id"], "true_duration_h": 48.0}).to_csv(truth, index=False)
    executor = _executor(tmp_warehouse, truth=truth, failure_rate=0.0)
    started = read_plan(_hour(tmp_warehouse, tmp_path, data_dir, T, executor).plan["plan_id"], db_path=tmp_warehouse)
    assert len(started.dispatched()) >= 1
    # a day and more after the jobs' submission: they are no recent arrivals, yet run on their nodes
    _, running, _ = loop.inputs(_ctx(tmp_warehouse, tmp_path, data_dir, T + pd.Timedelta(hours=30), executor))
    assert set(running["job_id"]) == set(started.dispatched()["job_id"])
    queued = jobs.assign(job_id=jobs["tenant"] + "/" + jobs["job_id"]).set_index("job_id")
    held = running.set_index("job_id")[["cpu_milli", "memory_mib"]]
    assert (held > 0).all().all()
    assert held.to_numpy().tolist() == queued.loc[held.index, ["cpu_milli", "memory_mib"]].to_numpy().tolist()


def test_an_unreachable_executor_fails_open_and_the_next_hour_dispatches(tmp_warehouse, tmp_path, data_dir):
    report = submit_file(EXAMPLES, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 10
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the executor's folder should be")
    first = _hour(tmp_warehouse, tmp_path, data_dir, executor=FilesExecutor(root=blocked, db_path=tmp_warehouse))
    plan = read_plan(first.plan["plan_id"], db_path=tmp_warehouse)
    starting = set(plan.dispatched()["job_id"])
    assert starting and first.dispatch["sent"] == 0 and set(first.dispatch["failed"]) == starting
    assert {s for s, _ in _state(tmp_warehouse).values()} <= {"queued", "planned"}  # nothing counted as handed on
    log = read_log(first.plan["plan_id"], db_path=tmp_warehouse)
    assert set(log["status"]) == {"failed"} and log["error"].str.contains("not-a-folder").all()
    # the hour after, with the executor reachable, the jobs go out
    later = T + pd.Timedelta(hours=1)
    second = _hour(
        tmp_warehouse, tmp_path, data_dir, later, FilesExecutor(root=tmp_path / "files", db_path=tmp_warehouse)
    )
    assert second.dispatch["sent"] >= len(starting) and not second.dispatch["failed"]
    assert starting <= {j for j, (s, _) in _state(tmp_warehouse).items() if s == "dispatched"}


def test_a_missed_sync_window_is_caught_up(tmp_warehouse):
    executor = _executor(tmp_warehouse)
    assert window_start(executor, T, db_path=tmp_warehouse) == T - pd.Timedelta(hours=1)  # nothing loaded yet
    load_events(
        executor.sync(T, since=T - pd.Timedelta(hours=1)), executor, T - pd.Timedelta(hours=1), T, tmp_warehouse
    )
    assert window_start(executor, T, db_path=tmp_warehouse) == T - pd.Timedelta(hours=1)  # a re-run: the same window
    assert window_start(executor, T + pd.Timedelta(hours=1), db_path=tmp_warehouse) == T
    # the sync at T+1 h missed (executor unreachable): T+2 h syncs [T, T+2 h)
    assert window_start(executor, T + pd.Timedelta(hours=2), db_path=tmp_warehouse) == T
    # at most a day back
    assert window_start(executor, T + pd.Timedelta(days=3), db_path=tmp_warehouse) == T + pd.Timedelta(days=2)


def test_the_deadline_reserve_leaves_a_share_of_the_run_time_before_the_deadline(tmp_warehouse, tmp_path, data_dir):
    """With the reserve r every job planned in time ends r x its fastest run time before its deadline, unless it
    has less spare than that (then it keeps all of it); without it jobs may end at the deadline itself."""
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    fleet = plan_fleet(None, data_dir).sampled()
    jobs = pending_job_frame(T, fleet, db_path=tmp_warehouse, data_dir=data_dir)
    plain = JobTable(jobs, fleet, data_dir=data_dir)
    reserved = JobTable(jobs, fleet, data_dir=data_dir, deadline_reserve=0.2)
    fastest = np.where(plain.allowed, plain.base_dur, np.inf).min(axis=1)
    cut = plain.deadline_h - reserved.deadline_h
    spare = plain.deadline_h - plain.submit_h - fastest
    assert np.allclose(cut, np.minimum(0.2 * fastest, np.maximum(spare, 0)))
    assert (cut > 0).any() and (reserved.deadline_h >= plain.submit_h + fastest - 1e-9).all()
    with pytest.raises(ValueError, match="deadline_reserve"):
        JobTable(jobs, fleet, data_dir=data_dir, deadline_reserve=1.0)
    ctx = _ctx(tmp_warehouse, tmp_path, data_dir, deadline_reserve=0.2)
    plan, info, _ = loop.plan(ctx, dry_run=True)
    assert info["n_jobs"] > 0 and plan.assignments is not None
    ends = {r.job_id: r.end_time for r in plan.assignments.itertuples() if not r.late}
    limit = dict(zip(jobs["job_id"], reserved.deadline_h))
    assert ends and all(abs_hours_float(pd.Series([e]))[0] <= limit[j] + 1e-6 for j, e in ends.items())


def test_events_finish_fail_retry_and_cancel_jobs(tmp_warehouse, tmp_path, data_dir):
    _submit_day(tmp_warehouse, tmp_path, data_dir, n=30, day="2021-07-15")
    with duckdb.connect(str(tmp_warehouse)) as con:  # half the jobs may be retried once
        con.execute("UPDATE queue.jobs SET max_retries = 1 WHERE hash(job_id) % 2 = 0")
    executor = _executor(tmp_warehouse, failure_rate=0.3, sigma=0.0)
    hours = pd.date_range("2021-07-15T00:00Z", periods=36, freq="h")
    cancelled = None
    for hour in hours:
        _hour(tmp_warehouse, tmp_path, data_dir, hour, executor)
        states = _state(tmp_warehouse)
        if cancelled is None:
            live = [j for j, (s, _) in states.items() if s in ("dispatched", "running")]
            if live:
                cancelled = live[0]
                tenant, job = cancelled.split("/")
                store.cancel_job(job, tenant, at=hour, db_path=tmp_warehouse)
    states = _state(tmp_warehouse)
    assert states[cancelled][0] == "cancelled"
    retried = [j for j, (_, attempts) in states.items() if attempts > 1]
    assert retried and all(states[j][1] == 2 for j in retried)
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        failed_for_good = con.execute(
            "SELECT count(*) FROM queue.jobs WHERE state = 'failed' AND attempts > max_retries"
        ).fetchone()[0]
        wrongly_failed = con.execute(
            "SELECT count(*) FROM queue.jobs WHERE state = 'failed' AND attempts <= max_retries"
        ).fetchone()[0]
        events = con.execute("SELECT event, count(*) FROM raw.job_events GROUP BY 1").fetchall()
    assert failed_for_good >= 1 and wrongly_failed == 0
    assert {"started", "finished", "failed", "cancelled"} <= {e for e, _ in events}
    finished = [j for j, (s, _) in states.items() if s == "finished"]
    assert len(finished) >= 10


def test_only_forecasts_issued_by_the_planning_time_are_used(tmp_warehouse, tmp_path, data_dir):
    from forecasting.store import write_forecasts

    _submit_day(tmp_warehouse, tmp_path, data_dir)

    def rows(issued, value):
        hours = pd.date_range(pd.Timestamp(issued), periods=72, freq="h")
        return pd.DataFrame(
            [
                {
                    "issued_at": issued,
                    "target_time": h,
                    "region": z,
                    "target": "carbon_intensity",
                    "p10": value - 10,
                    "p50": value,
                    "p90": value + 10,
                    "model": "lgbm",
                    "model_version": "v-test",
                }
                for z in ("CISO", "DE")
                for h in hours
            ]
        )

    write_forecasts(rows("2021-07-15T13:00Z", 999.0), db_path=tmp_warehouse)  # issued after T: never used
    ctx = _ctx(tmp_warehouse, tmp_path, data_dir)
    _, late, _ = loop.plan(ctx, dry_run=True)
    assert late["forecast_source"] == "warehouse" and "@none" in late["forecast_version"]
    write_forecasts(rows("2021-07-15T11:00Z", 50.0), db_path=tmp_warehouse)
    _, used, _ = loop.plan(ctx, dry_run=True)
    assert "forecast.forecasts:lgbm:v-test@2021-07-15T11:00:00" in used["forecast_version"]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"as_of": "not-a-time"}, "'not-a-time'"),
        ({"as_of": ""}, "as_of is required"),
        ({"policy": "fastest"}, "'fastest'"),
        ({"horizon_hours": 500}, "500"),
        ({"horizon_hours": "48"}, "'48'"),
        ({"regions": ["atlantis"]}, "atlantis"),
        ({"deadline_reserve": 1.5}, "deadline_reserve 1.5"),
        ({"deadline_reserve": "0.2"}, "deadline_reserve '0.2'"),
    ],
)
def test_bad_settings_fail_before_any_work(kwargs, needle):
    args = {"as_of": T, "policy": "priority", "regions": None, "horizon_hours": 168, **kwargs}
    with pytest.raises(ValueError) as err:
        validate_inputs(**args)
    assert needle in str(err.value)


def test_a_cluster_naming_an_unknown_executor_kind_is_refused_with_file_cluster_and_field(tmp_path, data_dir):
    text = (Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.yaml").read_text()
    path = tmp_path / "fleet.yaml"
    path.write_text(text.replace("executor: {kind: replay}", "executor: {kind: lsf, queue: gpu}", 1))
    with pytest.raises(ValueError, match=r"fleet.yaml: clusters\[0\] \(usw-a100\)\.executor\.kind: 'lsf' is not an"):
        load_fleet(path, data_dir=data_dir)


def test_resolve_run_takes_the_planning_time_from_the_run():
    params = {"as_of": "", "policy": "greedy-carbon", "regions": [], "horizon_hours": 48, "dry_run": True}
    out = resolve_run(params, data_interval_end=pd.Timestamp("2021-07-15T13:00Z"))
    assert out == {
        "as_of": "2021-07-15T13:00:00Z",
        "policy": "greedy-carbon",
        "regions": [],
        "horizon_hours": 48,
        "deadline_reserve": 0.2,
        "dry_run": True,
        "pause_for_carbon": False,
        "preempt_for_deadlines": False,
    }
    assert resolve_run({**params, "pause_for_carbon": True}, data_interval_end=T)["pause_for_carbon"] is True
    with pytest.raises(ValueError, match="pause_for_carbon"):
        resolve_run({**params, "pause_for_carbon": "yes"}, data_interval_end=T)
    on = resolve_run({**params, "preempt_for_deadlines": True}, data_interval_end=T)
    assert on["preempt_for_deadlines"] is True
    with pytest.raises(ValueError, match="preempt_for_deadlines"):
        resolve_run({**params, "preempt_for_deadlines": 1}, data_interval_end=T)
    assert resolve_run({**params, "deadline_reserve": 0}, data_interval_end=T)["deadline_reserve"] == 0.0
    assert resolve_run({**params, "as_of": "2021-07-15T09:30+00:00"})["as_of"] == "2021-07-15T09:00:00Z"
    with pytest.raises(ValueError, match="no planning time"):
        resolve_run(params)
    with pytest.raises(ValueError, match="dry_run"):
        resolve_run({**params, "dry_run": "yes"}, data_interval_end=pd.Timestamp(T))


def test_cli_rejects_a_bad_policy_with_exit_code_2():
    out = subprocess.run(
        [sys.executable, "-m", "scheduling", "plan-hourly", "--as-of", T.isoformat(), "--policy", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "'nope'" in out.stderr and out.stdout == ""


@pytest.mark.slow
def test_cli_submit_then_plan_hourly_json(tmp_warehouse, tmp_path, data_dir):
    def run(*args):
        out = subprocess.run([sys.executable, "-m", "scheduling", *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    run("jobs", "submit", str(EXAMPLES), "--json")
    doc = json.loads(run("plan-hourly", "--as-of", T.isoformat(), "--json", "--schedule-root", str(tmp_path / "s")))
    assert doc["plan"]["plan_id"] == "rolling-lp@2021-07-15T12:00:00Z" and doc["plan"]["n_jobs"] == 10
    assert np.isfinite(doc["plan"]["expected_kgco2e"])


def test_slower_limits_are_offered_only_where_a_long_run_still_fits(tmp_warehouse, tmp_path, data_dir):
    """With an option margin m a job keeps a limit below the default only where its run time there times m fits
    between its submission and its deadline; the default limit stays everywhere."""
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    fleet = plan_fleet(None, data_dir).sampled()
    jobs = pending_job_frame(T, fleet, db_path=tmp_warehouse, data_dir=data_dir)
    plain = JobTable(jobs, fleet, data_dir=data_dir)
    margin = JobTable(jobs, fleet, data_dir=data_dir, option_margin=1.4)
    spare = (abs_hours_float(jobs["deadline"]) - abs_hours_float(jobs["submit_time"]))[:, None, None]
    expected = np.where(plain.dur * 1.4 > spare, np.inf, plain.dur)
    expected[:, 0, :] = plain.dur[:, 0, :]
    np.testing.assert_array_equal(margin.dur, expected)
    dropped = np.isfinite(plain.dur[:, 1:]) & ~np.isfinite(margin.dur[:, 1:])
    assert dropped.any() and (np.isfinite(margin.dur[:, 1:]) & np.isfinite(plain.dur[:, 1:])).any()
    with pytest.raises(ValueError, match="option_margin"):
        JobTable(jobs, fleet, data_dir=data_dir, option_margin=0.5)


def test_a_slower_limit_or_cluster_starts_only_where_a_long_run_still_ends_by_the_deadline(
    tmp_warehouse, tmp_path, data_dir
):
    """The latest start at a limit below the default leaves its run time x the option margin before the job's own
    deadline (not only before the planning deadline, which keeps the reserve); at the default limit on a cluster
    slower than the job's fastest, its run time x the cluster margin; on the fastest, the run time before the
    planning deadline."""
    _submit_day(tmp_warehouse, tmp_path, data_dir)
    fleet = plan_fleet(None, data_dir).sampled()
    jobs = pending_job_frame(T, fleet, db_path=tmp_warehouse, data_dir=data_dir)
    table = JobTable(jobs, fleet, data_dir=data_dir, deadline_reserve=0.2, option_margin=1.4, cluster_margin=1.2)
    idx = np.arange(len(jobs))
    problem = table.problem(T, idx, np.full((48, len(fleet)), 10**9), np.full((48, len(fleet)), 100.0))
    latest = Evaluator(problem).latest_all
    dur = np.where(np.isfinite(table.dur), table.dur, 0.0)
    deadline = (abs_hours_float(jobs["deadline"]) - abs_hours(T))[:, None, None]  # the job's own
    planning = (table.deadline_h - abs_hours(T))[:, None, None]
    hosted = np.isfinite(table.dur) & table.allowed[:, None, :]
    fastest = np.array([table.dur[j, 0][hosted[j, 0]].min() for j in idx])[:, None]
    slower_cluster = hosted[:, 0] & (dur[:, 0] > fastest + 1e-9)
    expected_default = np.where(
        slower_cluster,
        np.minimum(planning[:, 0] - dur[:, 0], deadline[:, 0] - 1.2 * dur[:, 0]),
        planning[:, 0] - dur[:, 0],
    )
    np.testing.assert_array_equal(latest[:, 0][hosted[:, 0]], np.floor(expected_default + 1e-9)[hosted[:, 0]])
    slow = np.floor(np.minimum(planning - dur, deadline - 1.4 * dur)[:, 1:] + 1e-9)
    np.testing.assert_array_equal(latest[:, 1:], slow)
    finite = np.isfinite(table.dur[:, 1:])
    assert (latest[:, 1:][finite] < np.floor(planning - dur)[:, 1:][finite]).any()  # the option margin moved some
    moved = slower_cluster & (latest[:, 0] < np.floor(planning[:, 0] - dur[:, 0] + 1e-9))
    assert moved.any()  # and the cluster margin
