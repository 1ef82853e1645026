"""Power-limit changes of running jobs on a real slurmctld: the executor records each change in the Slurm job (the
comment's limit in force, the name's history), the watcher the shipped prolog starts on the node applies it with the
GPU tool (a recorder here: no GPUs), and the changes come back as `power_changed` events, also from the jobcomp file
once squeue has forgotten the job. Then a change through the action log, killed mid-change, made once, and loop
hours on Slurm until one decides a change, killed mid-change and run again: each change reaches Slurm and the GPUs
once, and comes back into raw.job_events."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from scheduling import loop
from scheduling.executors.clock import PlanClock
from scheduling.executors.power_log import apply_power_changes, read_changes, record_decisions
from scheduling.executors.registry import make_executor
from scheduling.executors.slurm_job import JobKey, PowerChange, with_power_limit
from scheduling.queue.intake import submit_mappings
from scheduling.service import plan_fleet
from tests.conftest import REPO_ROOT
from tests.scheduling.executor_samples import PLAN_TIME, crash_mid_change_then_reconcile, plan_id_at, sample_items
from tests.scheduling.slurm.cluster import NODE, LocalSlurm, missing_packages, wait_for, write_fleet

MIN = pd.Timedelta(minutes=1)
H = pd.Timedelta(hours=1)
WATCHER = "power-limit-watcher.sh"


@pytest.fixture(scope="module")
def slurm_forgetful():
    """A real Slurm with the shipped prolog whose squeue forgets an ended job after 2 s (MinJobAge; slurmctld
    purges about once a minute), so that the jobcomp file is all that is left of it."""
    if missing_packages() or os.geteuid() != 0:
        pytest.skip("the Slurm tests need root and slurm-wlm/munge (see conftest.py)")
    folder = Path(tempfile.mkdtemp(prefix="cp-slurm-power-"))
    cluster = LocalSlurm(folder, prolog=REPO_ROOT / "deploy" / "slurm" / "prolog-power-limit.sh", min_job_age_s=2)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _executor(cluster):
    wall0 = pd.Timestamp.now(tz="UTC").floor("s")
    settings = {
        "conf": str(cluster.conf),
        "output": str(cluster.dir / "out-%j.txt"),
        "plan_origin": PLAN_TIME.isoformat(),
        "wall_origin": wall0.isoformat(),
        "seconds_per_hour": 60,  # a plan minute per wall second
        "timeout_s": 20,
    }
    return make_executor("slurm", settings)


def _dispatch(executor, prefix: str, seconds: int, gpus: int, watts: float) -> tuple[str, str]:
    """One job of `gpus` GPUs at `watts` that sleeps `seconds`, dispatched at PLAN_TIME; (planner id, Slurm id)."""
    items = sample_items(1, plan_time=PLAN_TIME, prefix=prefix)
    items["cluster"] = items["cluster"].iloc[0]
    items["node"] = f"{items['cluster'].iloc[0]}/{NODE}"
    items["end_time"] = PLAN_TIME + H
    items["est_duration_h"] = 1.0
    items["cpu_milli"], items["memory_mib"] = 1000, 1024
    items["gpu_count"], items["gpu_milli"], items["power_limit_w"] = gpus, 1000, watts
    items["gpu_devices"] = ",".join(str(i) for i in range(gpus))
    items["command"] = json.dumps(f"sleep {seconds}")
    records = executor.dispatch(plan_id_at(PLAN_TIME, policy=prefix), items)
    assert records["error"].isna().all(), records["error"].tolist()
    return items["job_id"].iloc[0], str(records["executor_ref"].iloc[0])


def _slurm_job(executor, ref: str) -> dict | None:
    return next((j for j in executor.cli.jobs() if str(j["job_id"]) == ref), None)


def _running(executor, ref: str) -> dict | None:
    job = _slurm_job(executor, ref)
    return job if job is not None and job["job_state"] == "RUNNING" else None


def _slurm_gpus(job: dict) -> str:
    """The GPU indexes Slurm gave the job (squeue's gres_detail ``gpu:2(IDX:0-1)``), as SLURM_JOB_GPUS lists them."""
    first, _, last = job["gres_detail"][0].split("IDX:")[1].rstrip(")").partition("-")
    return ",".join(str(i) for i in range(int(first), int(last or first) + 1))


def _watchers(ref: str) -> list[int]:
    """Pids of the power-limit watchers running for Slurm job `ref`."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(a.endswith(WATCHER.encode()) for a in args) and ref.encode() in args:
            out.append(int(entry.name))
    return out


def test_a_limit_changed_mid_run_reaches_the_gpus_and_comes_back_as_events(slurm_forgetful):
    cluster = slurm_forgetful
    executor = _executor(cluster)
    assert executor.changes_power_limits
    job_id, ref = _dispatch(executor, "recap", seconds=30, gpus=2, watts=300.0)
    job = wait_for(lambda: _running(executor, ref), what="the job running")
    gpus = _slurm_gpus(job)
    wait_for(lambda: _watchers(ref) or None, what="the watcher the prolog started")
    started = executor.clock.to_plan(pd.Timestamp(job["start_time"], unit="s", tz="UTC"))
    at1, at2 = PLAN_TIME + 10 * MIN, PLAN_TIME + 20 * MIN  # plan time; the job runs until about 12:31
    assert started < at1
    plan1, plan2 = plan_id_at(at1, policy="recap"), plan_id_at(at2, policy="recap")

    # no run: another job, or this one before it started
    assert executor.set_power_limit("acme/nope", 250.0, at1, plan_id=plan1) is None
    assert executor.set_power_limit(job_id, 250.0, started - MIN, plan_id=plan1) is None
    assert executor.power_change_ref(plan1, job_id) is None

    change = executor.set_power_limit(job_id, 250.0, at1, plan_id=plan1)
    assert change == f"{ref}/power-limit/{plan1}"
    # idempotent per deciding plan: the same key changes nothing (not even with other watts)
    assert executor.set_power_limit(job_id, 210.0, at1, plan_id=plan1) == change
    assert executor.power_change_ref(plan1, job_id) == change and executor.power_change_ref(plan2, job_id) is None
    slurm = _slurm_job(executor, ref)
    assert JobKey.parse(slurm["name"]).power == (PowerChange(250.0, at1, plan1),)
    assert "power_limit_w=300" in job["comment"].split()  # the dispatch's; every other word stays
    assert slurm["comment"] == job["comment"].replace("power_limit_w=300", "power_limit_w=250")
    assert executor.running(at1 + MIN).set_index("job_id").loc[job_id, "power_limit_w"] == 250.0
    # the watcher on the node applied it to the job's GPUs: the prolog's limit first, then the change, once each
    applied = f"-i {gpus} -pl 250"
    wait_for(lambda: applied in cluster.nvidia_smi_calls, what=f"nvidia-smi {applied}")
    with pytest.raises(ValueError, match="before the last one"):
        executor.set_power_limit(job_id, 230.0, at1 - MIN, plan_id=plan_id_at(at1 - MIN, policy="recap"))

    assert executor.set_power_limit(job_id, 200.5, at2, plan_id=plan2) == f"{ref}/power-limit/{plan2}"
    wait_for(lambda: f"-i {gpus} -pl 200" in cluster.nvidia_smi_calls, what="nvidia-smi of the second change")
    running = executor.running(at2 + MIN).set_index("job_id")
    assert running.loc[job_id, "power_limit_w"] == 200.5  # the plan's watts; the GPU tool gets whole watts
    assert executor.running(at1 + MIN).set_index("job_id").loc[job_id, "power_limit_w"] == 250.0
    mine = [c for c in cluster.nvidia_smi_calls if c.startswith(f"-i {gpus} ")]
    assert mine == [f"-i {gpus} -pl 300", applied, f"-i {gpus} -pl 200"], cluster.nvidia_smi_calls

    # the events, each in the window holding its plan time
    def changes(now, since):
        events = executor.sync(now, since=since)
        return events[(events["event"] == "power_changed") & (events["planner_job_id"] == job_id)]

    assert changes(at1, PLAN_TIME).empty
    first = changes(at1 + MIN, at1)
    assert first[["event_time", "power_limit_w", "executor_ref"]].values.tolist() == [[at1, 250.0, ref]]
    assert changes(PLAN_TIME + 2 * H, at1 + MIN)["power_limit_w"].tolist() == [200.5]

    # the job ends: no run to change any more, and the watcher is gone
    wait_for(lambda: (j := _slurm_job(executor, ref)) is None or j["job_state"] == "COMPLETED", 60, "the job's end")
    late = plan_id_at(PLAN_TIME + 50 * MIN, policy="recap")
    assert executor.set_power_limit(job_id, 150.0, PLAN_TIME + 50 * MIN, plan_id=late) is None
    wait_for(lambda: not _watchers(ref), what="the watcher's exit")
    # once squeue has forgotten the job, the jobcomp file still holds both changes (the job name)
    wait_for(lambda: _slurm_job(executor, ref) is None, 150, "slurmctld purging the ended job")
    events = executor.sync(PLAN_TIME + 2 * H)
    events = events[events["planner_job_id"] == job_id]
    assert events["event"].tolist() == ["dispatched", "started", "power_changed", "power_changed", "finished"]
    got = events[events["event"] == "power_changed"][["event_time", "power_limit_w"]].values.tolist()
    assert got == [[at1, 250.0], [at2, 200.5]]
    assert events["event_time"].iloc[-1] > at2
    assert executor.power_change_ref(plan2, job_id) == f"{ref}/power-limit/{plan2}"
    assert job_id not in set(executor.running(at2 + MIN)["job_id"])


def test_a_change_killed_mid_way_is_made_once(slurm_forgetful, tmp_warehouse):
    """The action log (`power_log`) sends the plan's change; the run is killed after Slurm took it and before the
    log's mark. Run again, and once more: Slurm holds the change once and the GPUs got it once."""
    cluster = slurm_forgetful
    executor = _executor(cluster)
    job_id, ref = _dispatch(executor, "once", seconds=20, gpus=1, watts=280.0)
    gpus = _slurm_gpus(wait_for(lambda: _running(executor, ref), what="the job running"))
    at = PLAN_TIME + 5 * MIN
    plan = plan_id_at(at, policy="once")
    decided = pd.DataFrame(
        [{"job_id": job_id, "plan_id": plan_id_at(PLAN_TIME, policy="once"), "attempt": 1, "cluster": "c",
          "from_limit_w": 280.0, "to_limit_w": 240.0, "time_factor": 1.1, "reason": "carbon"}]
    )  # fmt: skip
    assert record_decisions(plan, decided, {"c": executor}, tmp_warehouse) == 1

    def crash(stage):
        if stage == "called":
            raise KeyboardInterrupt("killed after Slurm took the change")

    with pytest.raises(KeyboardInterrupt):
        apply_power_changes(plan, executor, tmp_warehouse, _fault=crash)
    assert read_changes(plan, tmp_warehouse)["status"].tolist() == ["intent"]
    first = apply_power_changes(plan, executor, tmp_warehouse)
    again = apply_power_changes(plan, executor, tmp_warehouse)
    assert (first["reconciled"], first["sent"], again["skipped"]) == ([job_id], [], [job_id])
    logged = read_changes(plan, tmp_warehouse)
    assert logged[["status", "executor_ref"]].values.tolist() == [["sent", f"{ref}/power-limit/{plan}"]]
    assert JobKey.parse(_slurm_job(executor, ref)["name"]).power == (PowerChange(240.0, at, plan),)
    wait_for(lambda: f"-i {gpus} -pl 240" in cluster.nvidia_smi_calls, what="nvidia-smi of the change")
    wait_for(lambda: not _watchers(ref), 60, "the job's end and its watcher's exit")
    assert [c for c in cluster.nvidia_smi_calls if c.startswith(f"-i {gpus} ")].count(f"-i {gpus} -pl 240") == 1


def test_the_power_history_in_a_job_name_round_trips_and_bad_text_is_refused():
    key = JobKey("recap@2021-07-15T12:00:00Z", "acme/j1", 1, "gpu-a")
    assert key.name() == "cp|recap@2021-07-15T12:00:00Z|acme/j1|1|gpu-a"
    changed = key.with_change(PowerChange(212.3456, PLAN_TIME + H, "recap@2021-07-15T13:00:00Z"))
    changed = changed.with_change(PowerChange(300.0, PLAN_TIME + 2 * H, "recap@2021-07-15T14:00:00Z"))
    assert changed.name() == (
        "cp|recap@2021-07-15T12:00:00Z|acme/j1|1|gpu-a|"
        "212.3456@2021-07-15T13:00:00Z@recap@2021-07-15T13:00:00Z,300@2021-07-15T14:00:00Z@recap@2021-07-15T14:00:00Z"
    )
    parsed = JobKey.parse(changed.name())
    assert parsed == key and [(c.watts, c.at) for c in parsed.power] == [
        (212.3456, PLAN_TIME + H),
        (300.0, PLAN_TIME + 2 * H),
    ]
    with pytest.raises(ValueError, match=r"cp\|p@x\|acme/j1\|1\|c\|oops.*bad power-limit history"):
        JobKey.parse("cp|p@x|acme/j1|1|c|oops")
    with pytest.raises(ValueError, match="cannot go into a Slurm job name"):
        key.with_change(PowerChange(200.0, PLAN_TIME, "bad plan,id")).name()
    # the comment's limit in force: replaced in place, every other word kept; appended where it had none
    assert (
        with_power_limit("plan=p job=j power_limit_w=300 gpu_count=2", 249.6)
        == "plan=p job=j power_limit_w=250 gpu_count=2"
    )
    assert with_power_limit("carbon-aware job_type='ResNet-50 (batch size 64)'", 200) == (
        "carbon-aware job_type='ResNet-50 (batch size 64)' power_limit_w=200"
    )


LOOP_T0 = pd.Timestamp("2021-07-15T12:00:00Z")
LOOP_SECONDS_PER_HOUR = 5


def test_a_loop_hours_power_change_reaches_slurm_once(slurm_forgetful, tmp_warehouse, tmp_path, data_dir, monkeypatch):
    """Loop hours (one plan hour = 5 s of wall clock) run jobs on Slurm until an hour decides a power change of a
    running job. That hour is killed after Slurm took the first change and before the action log's mark; run again,
    and once more, each job's Slurm name holds its change once, the GPUs got it once, and the next hour's sync loads
    it as a `power_changed` event at the deciding plan's time."""
    wall0 = pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=2)
    clock = PlanClock.from_settings(LOOP_T0, wall0, LOOP_SECONDS_PER_HOUR)
    settings = {
        "conf": str(slurm_forgetful.conf),
        "output": str(slurm_forgetful.dir / "loop-%j.txt"),
        "plan_origin": LOOP_T0.isoformat(),
        "wall_origin": wall0.isoformat(),
        "seconds_per_hour": LOOP_SECONDS_PER_HOUR,
    }
    fleet_path = tmp_path / "fleet.yaml"
    write_fleet(fleet_path, settings)
    monkeypatch.setenv("FLEET_PATH", str(fleet_path))
    fleet = plan_fleet(None, data_dir)
    jobs = [
        {
            "tenant": "lab",
            "job_id": f"long-{i}",
            "submitted_at": (LOOP_T0 - H).isoformat(),
            "gpus": 1,
            "gpu_milli": 1000,
            "cpu_milli": 1000,
            "memory_mib": 1024,
            "job_type": "ResNet-50 (batch size 64)",
            "est_duration_h": 6.0,
            "deadline": (LOOP_T0 + 10 * H).isoformat(),
            "home_region": "us-west",
            "command": "sleep 60",
        }
        for i in range(4)
    ]
    report = submit_mappings(jobs, source="test", as_of=LOOP_T0, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == len(jobs), report.rejected[:3]
    executor = make_executor("slurm", settings)
    executors = dict.fromkeys(fleet.names, executor)
    run = dict(db_path=tmp_warehouse, data_dir=data_dir, schedule_root=tmp_path / "s", fleet=fleet)
    for h in range(12):
        at = LOOP_T0 + h * H
        time.sleep(max(0.0, (clock.to_wall(at) - pd.Timestamp.now(tz="UTC")).total_seconds()))
        ctx = loop.context(at, executors=executors, **run)
        loop.sync(ctx)
        plan, _, pending = loop.plan(ctx)
        if len(read_changes(ctx.plan_id, tmp_warehouse)):
            break
        loop.dispatch_plan(ctx, plan, pending)
    else:
        pytest.fail("no hour decided a power change")
    decided = read_changes(ctx.plan_id, tmp_warehouse).set_index("job_id")
    gpus = {}  # job -> the GPUs Slurm gave its running Slurm job
    for job in executor.cli.jobs():
        key = JobKey.parse(job["name"])
        if key is not None and key.job_id in decided.index and job["job_state"] == "RUNNING":
            gpus[key.job_id] = _slurm_gpus(job)
    assert sorted(gpus) == sorted(decided.index)
    lines = {job: f"-i {gpus[job]} -pl {round(float(decided.loc[job, 'to_limit_w']))}" for job in decided.index}
    calls = slurm_forgetful.nvidia_smi_calls
    before = {job: calls.count(line) for job, line in lines.items()}

    crash_mid_change_then_reconcile(ctx, executor, tmp_warehouse, plan, pending, len(decided))
    changed = {JobKey.parse(j["name"]).job_id: JobKey.parse(j["name"]).power for j in executor.cli.jobs()
               if JobKey.parse(j["name"]) and JobKey.parse(j["name"]).power}  # fmt: skip
    assert changed == {
        job: (PowerChange(float(decided.loc[job, "to_limit_w"]), ctx.plan_time, ctx.plan_id),) for job in decided.index
    }
    for job, line in lines.items():  # the watcher on the node: the GPU tool once with the job's GPUs and limit
        wait_for(
            lambda line=line: slurm_forgetful.nvidia_smi_calls.count(line) > before[job], what=f"nvidia-smi {line}"
        )
        assert slurm_forgetful.nvidia_smi_calls.count(line) == before[job] + 1
    sync = loop.sync(loop.context(ctx.plan_time + H, executors=executors, **run))
    assert not sync["unreachable"]
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        loaded = con.execute(
            "SELECT planner_job_id, event_time, power_limit_w FROM raw.job_events WHERE event = 'power_changed'"
        ).fetchall()
    assert sorted((j, pd.Timestamp(t), w) for j, t, w in loaded) == sorted(
        (job, ctx.plan_time, float(row["to_limit_w"])) for job, row in decided.iterrows()
    )
