"""The `slurm` executor against a real slurmctld on this machine: plan time mapped onto minutes of wall clock, short
real jobs, commands split into words, shards read from the cluster, a re-plan that moves a pending job, a cancel,
and slurmctld stopped in the middle of a dispatch."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from scheduling.executors.dispatch_log import DispatchError, dispatch, read_log
from scheduling.executors.registry import make_executor
from scheduling.executors.slurm_cli import SlurmRefused, SlurmUnavailable
from scheduling.executors.slurm_job import JobKey, submission
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.slurm.cluster import CPUS, GPUS, MEMORY_MIB, NODE, SHARDS_PER_GPU, wait_for

H = pd.Timedelta(hours=1)
SECONDS_PER_HOUR = 60  # one plan hour runs in a wall minute


def _executor(cluster, wall_origin):
    settings = {
        "conf": str(cluster.conf),
        "output": str(cluster.dir / "out-%j.txt"),
        "plan_origin": PLAN_TIME.isoformat(),
        "wall_origin": wall_origin.isoformat(),
        "seconds_per_hour": SECONDS_PER_HOUR,
        "timeout_s": 20,
    }
    return make_executor("slurm", settings)


def _items(n: int, start=PLAN_TIME, hours: float = 1.0, prefix: str = "job", **overrides) -> pd.DataFrame:
    items = sample_items(n, plan_time=start, prefix=prefix)
    items["node"] = f"{items['cluster'].iloc[0]}/{NODE}"
    items["cluster"] = items["cluster"].iloc[0]
    items["end_time"] = start + pd.Timedelta(hours=hours)
    items["est_duration_h"] = hours
    items["cpu_milli"] = 1000
    items["memory_mib"] = 1024
    for key, value in overrides.items():
        items[key] = value
    return items


def _now_wall() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC").floor("s")


def test_nodes_and_shards_come_from_the_cluster(slurm_cluster):
    executor = _executor(slurm_cluster, _now_wall())
    assert executor.nodes() == [
        {"name": NODE, "gpus": GPUS, "cpus": CPUS, "memory_mib": MEMORY_MIB, "shards_per_gpu": SHARDS_PER_GPU}
    ]
    out = subprocess.run(
        [sys.executable, "-m", "scheduling", "slurm-nodes", "--conf", str(slurm_cluster.conf)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert yaml.safe_load(out.stdout) == {
        "nodes": [{"name": NODE, "gpus": GPUS, "cpus": CPUS, "memory_mib": MEMORY_MIB}]
    }  # what a fleet file's cluster declares
    row = _items(1, gpu_milli=500, gpu_count=1).iloc[0].to_dict()
    key = JobKey("p@2021-07-15T12:00:00Z", row["job_id"], 1, row["cluster"])
    args, _ = submission(row, key, executor.clock, shards_per_gpu=SHARDS_PER_GPU)
    assert "--gres=shard:4" in args  # half a GPU of 8 shards, not of ten
    with pytest.raises(ValueError, match="Slurm reports none"):
        submission(row, key, executor.clock, shards_per_gpu=0)


def test_jobs_run_and_sync_back_in_plan_time(slurm_cluster):
    wall0 = _now_wall()
    executor = _executor(slurm_cluster, wall0)
    plan_id = plan_id_at(PLAN_TIME)
    items = _items(3)
    # a command string with several words, a list of arguments, and a shared GPU; a 2021 deadline (replayed)
    items["command"] = [json.dumps("echo one two; sleep 2"), json.dumps(["echo", "three four"]), "echo five six"]
    items["gpu_milli"] = [1000, 1000, 250]
    items["gpu_count"] = [2, 1, 1]
    items["deadline"] = PLAN_TIME + 6 * H
    records = executor.dispatch(plan_id, items)
    assert records["error"].isna().all(), records["error"].tolist()
    refs = dict(zip(records["job_id"], records["executor_ref"]))
    assert executor.lookup(plan_id, items["job_id"].iloc[0]) == refs[items["job_id"].iloc[0]]
    assert executor.lookup(plan_id_at(PLAN_TIME + H), items["job_id"].iloc[0]) is None

    def ended():
        events = executor.sync(PLAN_TIME + 24 * H)
        done = events[events["event"].isin(["finished", "failed"])]
        return events if len(done) == 3 else None

    events = wait_for(ended, what="three finished jobs")
    assert set(events.loc[events["event"].isin(["finished", "failed"]), "event"]) == {"finished"}
    outputs = {(slurm_cluster.dir / f"out-{ref}.txt").read_text().strip() for ref in refs.values()}
    assert outputs == {"one two", "three four", "five six"}  # each command split into its words
    for job in items["job_id"]:
        mine = events[events["planner_job_id"] == job].set_index("event")
        assert list(mine.index) == ["dispatched", "started", "finished"]
        assert mine.loc["dispatched", "event_time"] == PLAN_TIME
        started, ended_at = mine.loc["started", "event_time"], mine.loc["finished", "event_time"]
        # Slurm's wall-clock times, mapped back: the job began within seconds (= minutes of plan time) of T
        assert PLAN_TIME <= started < PLAN_TIME + 20 * pd.Timedelta(minutes=1)
        assert started < ended_at
        assert mine["node"].dropna().eq(NODE).all() and mine["executor_ref"].eq(refs[job]).all()
    # windows partition the events and are stable
    split = pd.concat([executor.sync(PLAN_TIME + 5 * pd.Timedelta(minutes=1)),
                       executor.sync(PLAN_TIME + 24 * H, since=PLAN_TIME + 5 * pd.Timedelta(minutes=1))])  # fmt: skip
    assert len(split) == len(events)


def test_running_reports_nodes_and_devices(slurm_cluster):
    wall0 = _now_wall()
    executor = _executor(slurm_cluster, wall0)
    plan_id = plan_id_at(PLAN_TIME, policy="running")
    items = _items(
        1,
        prefix="run",
        command=json.dumps("sleep 6"),
        gpu_milli=1000,
        gpu_count=2,
        power_limit_w=180.0,
        gpu_devices="2,3",
    )
    executor.dispatch(plan_id, items)
    running = wait_for(
        lambda: (
            (r := executor.running(PLAN_TIME + 0.1 * H))
            .loc[r["confirmed"].astype(bool)]
            .pipe(lambda x: x if len(x) else None)
        ),
        what="a running job",
    )
    row = running.iloc[0]
    assert row["job_id"] == items["job_id"].iloc[0] and row["gpu_count"] == 2 and row["power_limit_w"] == 180.0
    assert row["gpu_devices"] == "2,3" and row["end_time"] == PLAN_TIME + H  # the plan's devices (see slurm.py)
    # the prolog (deploy/slurm/) set the planned limit on the GPUs Slurm gave the job
    job = next(j for j in executor.cli.jobs() if str(j["job_id"]) == row["executor_ref"])
    first, _, last = job["gres_detail"][0].split("IDX:")[1].rstrip(")").partition("-")
    expected = "-i " + ",".join(str(i) for i in range(int(first), int(last or first) + 1)) + " -pl 180"
    assert expected in slurm_cluster.nvidia_smi_calls, slurm_cluster.nvidia_smi_calls


def test_a_replan_moves_the_pending_job_and_a_cancel_ends_it(slurm_cluster):
    wall0 = _now_wall()
    executor = _executor(slurm_cluster, wall0)
    first, second = plan_id_at(PLAN_TIME, policy="move"), plan_id_at(PLAN_TIME + H, policy="move")
    items = _items(1, start=PLAN_TIME + 10 * H, prefix="mv", command=json.dumps("true"))
    ref = executor.dispatch(first, items)["executor_ref"].iloc[0]
    moved = _items(1, start=PLAN_TIME + 20 * H, prefix="mv", command=json.dumps("true"))
    assert executor.dispatch(second, moved)["executor_ref"].iloc[0] == ref  # the same Slurm job, moved
    jobs = [
        j for j in executor.cli.jobs() if JobKey.parse(j["name"]) and j["name"].split("|")[2] == moved["job_id"].iloc[0]
    ]
    assert len(jobs) == 1 and jobs[0]["job_state"] == "PENDING"
    begin = pd.Timestamp(jobs[0]["eligible_time"], unit="s", tz="UTC")
    assert abs((begin - executor.clock.to_wall(PLAN_TIME + 20 * H)).total_seconds()) <= 1
    assert (
        executor.lookup(second, moved["job_id"].iloc[0]) == ref
        and executor.lookup(first, moved["job_id"].iloc[0]) is None
    )
    assert executor.cancel(moved["job_id"].iloc[0], PLAN_TIME + 2 * H)
    events = wait_for(
        lambda: (
            (e := executor.sync(PLAN_TIME + 24 * H))
            .loc[e["executor_ref"] == ref]
            .pipe(lambda x: x if "cancelled" in set(x["event"]) else None)
        ),
        what="the cancelled event",
    )
    assert sorted(events["event"]) == ["cancelled", "dispatched"]  # never started
    assert not executor.cancel(moved["job_id"].iloc[0], PLAN_TIME + 3 * H)


def test_slurmctld_down_is_reported_and_the_dispatch_recovers_once(slurm_cluster, tmp_warehouse):
    wall0 = _now_wall()
    executor = _executor(slurm_cluster, wall0)
    plan_id = plan_id_at(PLAN_TIME, policy="outage")
    items = _items(2, prefix="out", command=json.dumps("true"))
    slurm_cluster.stop_controller()
    try:
        with pytest.raises(SlurmUnavailable, match="slurmctld unreachable"):
            executor.sync(PLAN_TIME + H)
        with pytest.raises(DispatchError, match="slurmctld unreachable"):
            dispatch(plan_id, items, executor, db_path=tmp_warehouse)
        assert set(read_log(plan_id, db_path=tmp_warehouse)["status"]) == {"failed"}
    finally:
        slurm_cluster.start_controller()
        slurm_cluster.wait_idle()

    # an answer lost after sbatch: the log is left at intent, and the next run finds the job instead of resubmitting
    def lose_answer(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after the executor call")

    with pytest.raises(KeyboardInterrupt):
        dispatch(plan_id, items.iloc[:1], executor, db_path=tmp_warehouse, _fault=lose_answer)
    result = dispatch(plan_id, items, executor, db_path=tmp_warehouse)
    assert result.reconciled == [items["job_id"].iloc[0]] and result.sent == [items["job_id"].iloc[1]]
    names = [j["name"] for j in executor.cli.jobs() if (k := JobKey.parse(j["name"])) and k.plan_id == plan_id]
    assert sorted(names) == sorted(set(names)) and len(names) == 2  # one Slurm job per planned job


def _user_sbatch(cluster, cwd, script, *args) -> str:
    """A user's own submission (not the executor's): its Slurm job id."""
    res = subprocess.run(
        ["sbatch", "--parsable", *args, str(script)], env=cluster.env, cwd=cwd, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _slurm_job(executor, ref: str) -> dict | None:
    return next((j for j in executor.cli.jobs() if str(j["job_id"]) == ref), None)


def test_a_held_marked_job_is_imported_and_starts_by_its_latest_start_without_a_plan(slurm_cluster, tmp_path):
    wall0 = _now_wall()
    executor = _executor(slurm_cluster, wall0)
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH --hold\nsleep 4\necho trained\n")
    deadline = wall0 + pd.Timedelta(minutes=10)
    marked = _user_sbatch(
        slurm_cluster, tmp_path, script, "--hold", "--time=2", "--gres=shard:2", "--cpus-per-task=2", "--mem=512M",
        f"--deadline={deadline:%Y-%m-%dT%H:%M:%S}", f"--output={tmp_path}/imported-%j.txt",
        "--comment=carbon-aware job_type='ResNet-50 (batch size 64)' est_duration_h=0.25",
    )  # fmt: skip
    plain = _user_sbatch(slurm_cluster, tmp_path, script, "--hold", "--time=1", "--gres=gpu:1")  # not marked
    sleeper = tmp_path / "sleep.sh"
    sleeper.write_text("#!/bin/bash\nsleep 30\n")
    dropped = _user_sbatch(
        slurm_cluster, tmp_path, sleeper, "--begin=now+60", "--time=1", "--gres=gpu:1", "--comment=carbon-aware x=y"
    )  # marked, not held: not imported, but withdrawn on request
    jobs = executor.imports(PLAN_TIME)
    assert [j["job_id"] for j in jobs] == [f"cptest-{marked}"]
    (job,) = jobs
    submitted = executor.clock.to_plan(pd.Timestamp(_slurm_job(executor, marked)["submit_time"], unit="s", tz="UTC"))
    assert job == {
        "tenant": "root",
        "job_id": f"cptest-{marked}",
        "submitted_at": submitted.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "job_type": "ResNet-50 (batch size 64)",
        "est_duration_h": "0.25",  # the comment's words are strings: the intake parses them like a CSV row's
        "gpus": 1,
        "gpu_milli": 2 * 1000 // SHARDS_PER_GPU,  # two of the node's shards per GPU
        "cpu_milli": 2000,
        "memory_mib": 512,
        "deadline": executor.clock.to_plan(deadline).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "script": f"#!/bin/bash\n#SBATCH --chdir={tmp_path}\nsleep 4\necho trained\n",  # no hold: a resubmission runs
    }
    # adopted with a latest start 3 s ahead: released, and Slurm starts it then without any plan (fail-open)
    latest = executor.clock.to_plan(_now_wall() + pd.Timedelta(seconds=3))
    adopting = plan_id_at(PLAN_TIME)
    job_id = f"root/cptest-{marked}"
    executor.adopt({job_id: latest}, PLAN_TIME, plan_id=adopting, cluster="cptest")
    assert executor.imports(PLAN_TIME) == []
    assert JobKey.parse(_slurm_job(executor, marked)["name"]) == JobKey(adopting, job_id, 0, "cptest")
    assert job_id not in set(executor.running(PLAN_TIME)["job_id"])  # released, not started: the planner plans it
    # Slurm started it itself: reported running (its GPUs stay bound) as attempt 0, and never withdrawn
    wait_for(lambda: _slurm_job(executor, marked)["job_state"] == "RUNNING", what="the adopted job's start")
    now = executor.clock.to_plan(_now_wall())
    (run,) = executor.running(now).query("job_id == @job_id").to_dict(orient="records")
    assert (run["job_id"], run["plan_id"], run["attempt"], run["cluster"]) == (job_id, adopting, 0, "cptest")
    assert (run["node"], run["gpu_count"], run["gpu_milli"], run["confirmed"]) == (
        f"cptest/{NODE}",
        1,
        2 * 1000 // SHARDS_PER_GPU,
        True,
    )
    with pytest.raises(SlurmRefused, match="not withdrawn"):
        executor.drop_import(job_id, now)
    wait_for(lambda: _slurm_job(executor, marked)["job_state"] == "COMPLETED", what="the adopted job's end")
    assert (tmp_path / f"imported-{marked}.txt").read_text().strip() == "trained"
    events = executor.sync(executor.clock.to_plan(_now_wall() + pd.Timedelta(seconds=1)), since=PLAN_TIME)
    events = events[events["planner_job_id"] == job_id]
    assert events["event"].tolist() == ["started", "finished"]  # no dispatched: no plan sent it
    assert set(events["attempt"]) == {0} and set(events["plan_id"]) == {adopting}
    assert executor.lookup(adopting, job_id) is None  # the plan's own dispatch of it never reached Slurm
    assert _slurm_job(executor, plain)["state_reason"] == "JobHeldUser"  # the unmarked job is left alone
    assert executor.drop_import(f"root/cptest-{dropped}", PLAN_TIME)
    assert _slurm_job(executor, dropped)["job_state"] == "CANCELLED"
    assert not executor.drop_import(f"root/cptest-{plain}", PLAN_TIME)  # not marked: never the planner's to cancel
    executor.cli.cancel(plain)


def test_running_reports_never_hold_more_than_a_gpu():
    from scheduling.executors.slurm import fit_devices

    def row(job, devices, milli=1000, count=1, confirmed=True):
        return {"job_id": job, "cluster": "c", "node": "c/n1", "gpu_devices": devices, "gpu_count": count,
                "gpu_milli": milli, "confirmed": confirmed, "start_time": PLAN_TIME}  # fmt: skip

    rows = [
        row("a", "0"),
        row("b", "0", confirmed=False),
        row("c", "1", 500),
        row("d", "1", 500),
        row("e", "0,1", count=2),
    ]
    out = {r["job_id"]: r for r in fit_devices(rows, {"n1": 3})}
    assert [out[j]["gpu_devices"] for j in "acd"] == ["0", "1", "1"]  # running ones keep their planned devices
    assert out["b"]["gpu_devices"] == "2"  # the pending one on a taken GPU moves to a free one
    assert out["e"]["node"] is None and out["e"]["gpu_devices"] is None  # fits nowhere: counted, not bound


def test_settings_are_checked_and_the_token_comes_from_the_environment(monkeypatch):
    executor = make_executor("slurm", {"kind": "slurm", "token_env": "TEST_SLURM_JWT", "conf": "/etc/x.conf"})
    with pytest.raises(SlurmUnavailable, match="TEST_SLURM_JWT"):
        executor.cli.env()
    monkeypatch.setenv("TEST_SLURM_JWT", "abc")
    assert executor.cli.env()["SLURM_JWT"] == "abc" and executor.cli.env()["SLURM_CONF"] == "/etc/x.conf"
    with pytest.raises(ValueError, match="unknown setting"):
        make_executor("slurm", {"token": "abc"})
    with pytest.raises(ValueError, match="go together"):
        make_executor("slurm", {"plan_origin": "2021-07-15T00:00Z"})
    clock = make_executor("slurm", {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-01-01T00:00Z",
                                    "seconds_per_hour": 60}).clock  # fmt: skip
    assert clock.to_wall("2021-07-15T02:30Z") == pd.Timestamp("2026-01-01T00:02:30Z")
    assert clock.to_plan("2026-01-01T00:02:30Z") == pd.Timestamp("2021-07-15T02:30Z")
