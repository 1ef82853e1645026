"""Exactly-once dispatch through plan.dispatch_log: re-runs submit nothing twice, a dispatcher killed with SIGKILL at
any step loses nothing, failures are logged and retried, the executor registry names its errors."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from common.registry import UnknownNameError
from scheduling.executors.base import DuplicateDispatchError
from scheduling.executors.dispatch_log import DispatchError, dispatch, read_log
from scheduling.executors.files import FilesExecutor
from scheduling.executors.items import dispatch_items
from scheduling.executors.registry import EXECUTORS, make_executor
from scheduling.executors.replay import ReplayExecutor
from tests.scheduling.executor_samples import plan_id_at, sample_items
from tests.scheduling.test_plan_store import sample_plan

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAN_ID = plan_id_at()


def _rows(db: Path, sql: str) -> pd.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).df()
    finally:
        con.close()


def _digest(frame: pd.DataFrame) -> str:
    frame = frame.astype(str).sort_values(list(frame.columns), kind="mergesort").reset_index(drop=True)
    return hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()


def test_dispatch_twice_submits_once_and_leaves_the_log_identical(tmp_warehouse):
    executor = ReplayExecutor(db_path=tmp_warehouse)
    items = sample_items(12)
    first = dispatch(PLAN_ID, items, executor, db_path=tmp_warehouse, batch_size=5)
    assert sorted(first.sent) == sorted(items["job_id"]) and not first.skipped
    log_before = _digest(read_log(PLAN_ID, tmp_warehouse))
    runs_before = _digest(_rows(tmp_warehouse, "SELECT * FROM executor.replay_runs"))
    second = dispatch(PLAN_ID, items, executor, db_path=tmp_warehouse, batch_size=5)
    assert second.sent == [] and second.reconciled == [] and sorted(second.skipped) == sorted(items["job_id"])
    assert _digest(read_log(PLAN_ID, tmp_warehouse)) == log_before
    assert _digest(_rows(tmp_warehouse, "SELECT * FROM executor.replay_runs")) == runs_before
    log = read_log(PLAN_ID, tmp_warehouse)
    assert (log["status"] == "sent").all() and log["sent_at"].notna().all()
    runs = _rows(tmp_warehouse, "SELECT job_id, run_ref FROM executor.replay_runs")
    assert len(runs) == 12 and runs["job_id"].is_unique
    assert dict(zip(log["job_id"], log["executor_ref"])) == dict(zip(runs["job_id"], runs["run_ref"]))


def test_two_executors_dispatch_one_plan_each_their_own_jobs(tmp_warehouse, tmp_path):
    """A plan whose clusters have different executors: each settles only its own log rows, and a job logged for
    one is refused to the other."""
    replay = ReplayExecutor(db_path=tmp_warehouse)
    files = FilesExecutor(root=tmp_path / "out", db_path=tmp_warehouse)
    items = sample_items(6)
    assert sorted(dispatch(PLAN_ID, items.iloc[:3], replay, db_path=tmp_warehouse).sent) == sorted(items["job_id"][:3])
    second = dispatch(PLAN_ID, items.iloc[3:], files, db_path=tmp_warehouse)
    assert sorted(second.sent) == sorted(items["job_id"][3:]) and not second.skipped and not second.failed
    log = read_log(PLAN_ID, tmp_warehouse).set_index("job_id")
    assert (log["status"] == "sent").all()
    assert dict(log["executor"]) == {**dict.fromkeys(items["job_id"][:3], "replay"),
                                     **dict.fromkeys(items["job_id"][3:], "files")}  # fmt: skip
    with pytest.raises(ValueError, match="logged for executor 'replay'"):
        dispatch(PLAN_ID, items.iloc[:1], files, db_path=tmp_warehouse)


def test_the_executor_refuses_a_second_submission(tmp_warehouse):
    """The guard behind the log: replay sees a repeated (plan_id, job_id) and refuses it, atomically."""
    executor = ReplayExecutor(db_path=tmp_warehouse)
    executor.dispatch(PLAN_ID, sample_items(3))
    with pytest.raises(DuplicateDispatchError, match="globex/job-0001"):
        executor.dispatch(PLAN_ID, sample_items(5))  # 2 new + 3 repeated: nothing of the call is kept
    assert len(_rows(tmp_warehouse, "SELECT * FROM executor.replay_runs")) == 3


# ------------------------------------------------------------------------------------------------ SIGKILL

_KILLED_DISPATCHER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from scheduling.executors.dispatch_log import dispatch
    from scheduling.executors.replay import ReplayExecutor
    from tests.scheduling.executor_samples import sample_items
    marker, seen = Path({marker!r}), {{}}
    def hang(stage):
        seen[stage] = seen.get(stage, 0) + 1
        if stage == {stage!r} and seen[stage] == {nth}:
            marker.write_text(stage)
            time.sleep(600)
    executor = ReplayExecutor(db_path={db!r}, failure_rate=0.1)
    dispatch({plan_id!r}, sample_items(20), executor, db_path={db!r}, batch_size=5, _fault=hang)
    raise SystemExit("dispatch finished without reaching the kill point")
""")


def _dispatch_killed_at(db: Path, tmp_path: Path, stage: str, nth: int) -> None:
    marker = tmp_path / f"marker-{stage}-{nth}"
    script = _KILLED_DISPATCHER.format(
        root=str(REPO_ROOT), marker=str(marker), db=str(db), plan_id=PLAN_ID, stage=stage, nth=nth
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"dispatcher exited before the kill point {stage}#{nth}"
            assert time.monotonic() < deadline, f"dispatcher never reached the kill point {stage}#{nth}"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _assert_exactly_once(db: Path) -> None:
    runs = _rows(db, "SELECT job_id, run_ref FROM executor.replay_runs")
    assert len(runs) == 20 and runs["job_id"].nunique() == 20  # every job ran, none twice
    log = read_log(PLAN_ID, db)
    assert len(log) == 20 and (log["status"] == "sent").all()
    assert dict(zip(log["job_id"], log["executor_ref"])) == dict(zip(runs["job_id"], runs["run_ref"]))


@pytest.mark.parametrize(
    "kills, expect",
    [
        # intent rows committed, nothing submitted: the re-run submits all 20
        ([("intent", 1)], {"sent": 20, "reconciled": 0, "skipped": 0}),
        # chunk 2 submitted but not marked sent: lookup finds it (no second submission), chunks 3-4 are sent
        ([("called", 2)], {"sent": 10, "reconciled": 5, "skipped": 5}),
        # mid-batch, chunk 2 marked: the re-run skips 10 and sends the other 10
        ([("marked", 2)], {"sent": 10, "reconciled": 0, "skipped": 10}),
        # killed twice: after the intents, then the re-run killed before marking its first chunk
        ([("intent", 1), ("called", 1)], {"sent": 15, "reconciled": 5, "skipped": 0}),
    ],
    ids=["after-intent", "after-executor-before-sent", "mid-batch", "twice"],
)
def test_sigkill_at_any_step_dispatches_nothing_twice_and_loses_nothing(tmp_warehouse, tmp_path, kills, expect):
    for stage, nth in kills:
        _dispatch_killed_at(tmp_warehouse, tmp_path, stage, nth)
    log = read_log(PLAN_ID, tmp_warehouse)
    assert len(log) == 20 and set(log["status"]) <= {"intent", "sent"}  # every item has its row before any submit
    result = dispatch(
        PLAN_ID, sample_items(20), ReplayExecutor(db_path=tmp_warehouse, failure_rate=0.1), db_path=tmp_warehouse
    )
    assert {k: len(getattr(result, k)) for k in expect} == expect
    assert not result.failed
    _assert_exactly_once(tmp_warehouse)
    again = dispatch(PLAN_ID, sample_items(20), ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    assert len(again.skipped) == 20 and not again.sent
    _assert_exactly_once(tmp_warehouse)


_RACING_DISPATCHER = textwrap.dedent("""
    import fcntl, sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from scheduling.executors.dispatch_log import dispatch, lock_path
    from scheduling.executors.replay import ReplayExecutor
    from tests.scheduling.executor_samples import sample_items
    folder, first = Path({folder!r}), {first!r}
    def wait_for(*markers):
        deadline = time.monotonic() + 300
        while not any(m.exists() for m in markers):
            if time.monotonic() > deadline:
                raise SystemExit(f"none of {{[m.name for m in markers]}} within 300 s")
            time.sleep(0.02)
    def pause(stage):  # the first keeps the dispatch lock until the second was refused it (or has finished)
        if stage == "intent" and first:
            (folder / "first-has-intents").touch()
            wait_for(folder / "second-refused", folder / "second-done")
    if not first:  # note a refusal of the dispatch lock (the real flock runs; its answer is only observed)
        lock, flock = str(lock_path({db!r})), fcntl.flock
        def observed(handle, operation):
            try:
                return flock(handle, operation)
            except BlockingIOError:
                if getattr(handle, "name", None) == lock:
                    (folder / "second-refused").touch()
                raise
        fcntl.flock = observed
    try:
        result = dispatch({plan_id!r}, sample_items(20), ReplayExecutor(db_path={db!r}), db_path={db!r},
                          batch_size=5, _fault=pause)
    finally:
        if not first:
            (folder / "second-done").touch()
    print(len(result.sent), len(result.reconciled), len(result.skipped))
""")


def test_two_dispatchers_at_once_submit_each_job_once(tmp_warehouse, tmp_path):
    """The first dispatcher stops after writing its intents, holding the dispatch lock, until the second has asked
    for the lock and been refused; then it goes on. The second waits, and finds every job sent."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(first: bool) -> subprocess.Popen:
        script = _RACING_DISPATCHER.format(
            root=str(REPO_ROOT), folder=str(tmp_path), db=str(tmp_warehouse), plan_id=PLAN_ID, first=first
        )
        return subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)

    procs = [start(True)]
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "first-has-intents").exists():
            assert procs[0].poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        procs.append(start(False))
        outs = [p.communicate(timeout=600)[0].split() for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    first, second = procs
    assert first.returncode == 0 and second.returncode == 0
    assert (tmp_path / "second-refused").exists()  # it asked while the first held the lock
    assert outs == [["20", "0", "0"], ["0", "0", "20"]]  # the second waited for the lock, then skipped all
    _assert_exactly_once(tmp_warehouse)


# ------------------------------------------------------------------------------------------------ failures


def test_a_failing_executor_is_logged_then_retried(tmp_warehouse, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the files executor wants its root")
    executor = FilesExecutor(root=blocker)
    items = sample_items(4)
    with pytest.raises(DispatchError, match="4 job\\(s\\) not dispatched to files") as info:
        dispatch(PLAN_ID, items, executor, db_path=tmp_warehouse)
    assert set(info.value.result.failed) == set(items["job_id"])
    log = read_log(PLAN_ID, tmp_warehouse)
    assert (log["status"] == "failed").all() and log["error"].str.contains("Error").all()
    blocker.unlink()
    result = dispatch(PLAN_ID, items, executor, db_path=tmp_warehouse)
    assert sorted(result.sent) == sorted(items["job_id"])
    log = read_log(PLAN_ID, tmp_warehouse)
    assert (log["status"] == "sent").all() and log["error"].isna().all()


def test_a_job_the_executor_rejects_is_failed_with_its_reason(tmp_warehouse):
    items = sample_items(3)
    items.loc[1, "start_time"] = items.loc[1, "start_time"] - pd.Timedelta(hours=1)
    with pytest.raises(DispatchError, match="globex/job-0001: start_time .* is before the plan's time"):
        dispatch(PLAN_ID, items, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    log = read_log(PLAN_ID, tmp_warehouse).set_index("job_id")
    assert log.loc["globex/job-0001", "status"] == "failed"
    assert (log.drop(index="globex/job-0001")["status"] == "sent").all()


def test_refusals_name_the_plan_job_and_field(tmp_warehouse):
    items = sample_items(2)
    with pytest.raises(ValueError, match="dry run"):
        dispatch(PLAN_ID + "#dry-run", items, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    with pytest.raises(ValueError, match="bad plan_id"):
        dispatch("no-time", items, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    bad = items.copy()
    bad.loc[0, "cluster"] = None
    with pytest.raises(ValueError, match="acme/job-0000.*'cluster'"):
        dispatch(PLAN_ID, bad, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    bad = items.astype({"est_duration_h": object})
    bad.loc[1, "est_duration_h"] = "soon"
    with pytest.raises(ValueError, match="globex/job-0001.*'est_duration_h'"):
        dispatch(PLAN_ID, bad, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    dispatch(PLAN_ID, items, ReplayExecutor(db_path=tmp_warehouse), db_path=tmp_warehouse)
    with pytest.raises(ValueError, match="logged for executor 'replay', not 'files'"):
        dispatch(PLAN_ID, items, FilesExecutor(root=tmp_warehouse.parent / "files"), db_path=tmp_warehouse)


def test_defaults_fill_tenant_queue_id_attempt_and_estimate(tmp_warehouse):
    items = sample_items(2).drop(columns=["tenant", "queue_job_id", "attempt", "est_duration_h"])
    items.loc[1, "job_id"] = "no-tenant-job"
    executor = ReplayExecutor(db_path=tmp_warehouse, sigma=0.0, failure_rate=0.0)
    dispatch(PLAN_ID, items, executor, db_path=tmp_warehouse)
    runs = _rows(tmp_warehouse, "SELECT * FROM executor.replay_runs ORDER BY job_id").set_index("job_id")
    assert runs.loc["acme/job-0000", ["tenant", "queue_job_id", "attempt"]].tolist() == ["acme", "job-0000", 1]
    assert runs.loc["no-tenant-job", "queue_job_id"] == "no-tenant-job" and pd.isna(runs.loc["no-tenant-job", "tenant"])
    assert runs.loc["acme/job-0000", "est_duration_h"] == 1.0 and runs.loc["acme/job-0000", "true_duration_h"] == 1.0


# ------------------------------------------------------------------------------------------------ registry


def test_registry_builds_executors_and_names_its_errors(tmp_warehouse, tmp_path):
    assert EXECUTORS.names == ("replay", "files", "kubernetes", "slurm")
    assert isinstance(make_executor(db_path=tmp_warehouse), ReplayExecutor)  # the default
    replay = make_executor("Replay", {"failure_rate": 0.5, "sigma": 0.3}, db_path=tmp_warehouse)
    assert (replay.failure_rate, replay.sigma, replay.name) == (0.5, 0.3, "replay")
    files = make_executor(None, {"kind": "files", "root": str(tmp_path / "out"), "name": "files-eu"})
    assert isinstance(files, FilesExecutor) and files.name == "files-eu" and files.root == tmp_path / "out"
    with pytest.raises(UnknownNameError, match="unknown executor 'slurmish'; known: replay, files, kubernetes, slurm"):
        make_executor("slurmish")
    with pytest.raises(ValueError, match="executor 'replay': unknown setting\\(s\\) \\['failure'\\]"):
        make_executor("replay", {"failure": 0.1})
    with pytest.raises(ValueError, match="settings say kind 'files'"):
        make_executor("replay", {"kind": "files"})
    with pytest.raises(ValueError, match="'failure_rate' must be in \\[0, 1\\]"):
        make_executor("replay", {"failure_rate": 2})


def test_dispatch_items_are_the_plans_starting_assignments_with_the_payload():
    plan = sample_plan(n_jobs=12)
    starting = plan.dispatched()
    assert 0 < len(starting) < 12
    jobs = pd.DataFrame(
        {
            "job_id": plan.assignments["job_id"],
            "tenant": "acme",
            "queue_job_id": plan.assignments["job_id"].str.upper(),
            "image": "registry.example/x:1",
            "attempt": 2,
            "est_duration_h": 1.5,
            "owner": "not a payload column",
        }
    )
    items = dispatch_items(plan, jobs)
    assert sorted(items["job_id"]) == sorted(starting["job_id"])
    assert (
        (items["tenant"] == "acme").all() and (items["attempt"] == 2).all() and (items["est_duration_h"] == 1.5).all()
    )
    assert (items["queue_job_id"] == items["job_id"].str.upper()).all() and "owner" not in items.columns
    bare = dispatch_items(plan)  # no jobs frame: defaults from the assignments
    assert (bare["attempt"] == 1).all() and bare["tenant"].isna().all()
    expected = (bare["end_time"] - bare["start_time"]).dt.total_seconds() / 3600
    assert (bare["est_duration_h"] == expected).all()
    with pytest.raises(ValueError, match="appears more than once"):
        dispatch_items(plan, pd.concat([jobs, jobs]))


def test_the_fleet_file_accepts_exactly_the_registered_executor_kinds():
    """scheduling.domain checks a fleet file's executor kinds without importing the executors: its list must be the
    registry's."""
    from scheduling.domain.fleet import EXECUTOR_KINDS

    assert set(EXECUTOR_KINDS) == set(EXECUTORS.names)
