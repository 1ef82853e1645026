"""Slurm end to end: 20 short jobs submitted through queue.jobs, planned hour by hour over replayed hours mapped
onto seconds of wall clock (one plan hour = SECONDS_PER_HOUR s), dispatched with sbatch, run by Slurm, synced, and
valued by the ledger (dbt): the ledger's actual start and end times are Slurm's own, mapped back to plan time. The
fleet's node comes from Slurm. slurmctld is stopped for one hour (once the jobs running before it ended): that hour
reports it unreachable and dispatches nothing, and after the restart every job is submitted exactly once."""

from __future__ import annotations

import subprocess
import time

import duckdb
import pandas as pd
import yaml

from scheduling import loop
from scheduling.executors.clock import PlanClock
from scheduling.executors.registry import make_executor
from scheduling.executors.slurm_cli import epoch
from scheduling.executors.slurm_job import JobKey
from scheduling.output.ledger import LEDGER_SELECT
from scheduling.queue import store
from scheduling.queue.intake import submit_mappings
from tests.scheduling.slurm.cluster import write_fleet
from transforms.runner import build
from warehouse.ingest import ingest

T0 = pd.Timestamp("2021-07-15T12:00:00Z")
SECONDS_PER_HOUR = 6
HOURS = 5
OUTAGE = T0 + pd.Timedelta(hours=1)  # slurmctld is down while this hour runs
# A loaded machine runs hours and jobs late (an hour may take longer than its SECONDS_PER_HOUR): the loop goes on,
# hour after hour, until every job has ended or this much wall time has passed. Waits on Slurm: WAIT_S each.
LOOP_DEADLINE_S = 600
WAIT_S = 300
N_JOBS = 20


def _jobs() -> list[dict]:
    return [
        {
            "tenant": "lab",
            "job_id": f"short-{i:02d}",
            "submitted_at": (T0 - pd.Timedelta(minutes=30)).isoformat(),
            "gpus": 1,
            "gpu_milli": 1000 if i % 5 < 2 else 250,  # 8 whole GPUs, 12 quarters (shards)
            "cpu_milli": 1000,
            "memory_mib": 1024,
            "job_type": "ResNet-50 (batch size 64)",
            "est_duration_h": 0.5,
            "deadline": (T0 + pd.Timedelta(hours=4)).isoformat(),
            "home_region": "us-west",
            "command": ["/bin/sh", "-c", f"sleep 2; echo job {i} done"] if i % 2 else f"sleep 2 && echo job {i} done",
        }
        for i in range(N_JOBS)
    ]


def _wait_idle_queue(executor, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while any(j["job_state"] in ("PENDING", "RUNNING", "COMPLETING") for j in executor.cli.jobs()):
        assert time.monotonic() < deadline, "Slurm jobs still running"
        time.sleep(0.3)


def _states(db) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return dict(con.execute("SELECT state, count(*) FROM queue.jobs GROUP BY state").fetchall())


def test_twenty_jobs_through_the_loop_on_slurm(slurm_cluster, tmp_warehouse, tmp_path, data_dir, monkeypatch):
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=tmp_warehouse, progress=False)  # what the ledger values
    build(select="+grid_hourly", warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    wall0 = pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=2)
    clock = PlanClock.from_settings(T0, wall0, SECONDS_PER_HOUR)
    settings = {
        "conf": str(slurm_cluster.conf),
        "output": str(slurm_cluster.dir / "loop-%j.txt"),
        "plan_origin": T0.isoformat(),
        "wall_origin": wall0.isoformat(),
        "seconds_per_hour": SECONDS_PER_HOUR,
    }
    fleet_path = tmp_path / "fleet.yaml"
    write_fleet(fleet_path, settings)
    monkeypatch.setenv("FLEET_PATH", str(fleet_path))
    report = submit_mappings(_jobs(), source="test", as_of=T0, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == N_JOBS, report.rejected[:3]

    executor = make_executor("slurm", settings)

    def pace(result):  # the next hour runs once the wall clock has reached it; slurmctld is down for OUTAGE
        if result.plan_time == OUTAGE - pd.Timedelta(hours=1):
            _wait_idle_queue(executor)  # no job ends while slurmctld is down (see docs/operating.md, "outage")
            slurm_cluster.stop_controller()
        elif result.plan_time == OUTAGE:
            slurm_cluster.start_controller()
            slurm_cluster.wait_idle()
        wait = (clock.to_wall(result.plan_time + pd.Timedelta(hours=1)) - pd.Timestamp.now(tz="UTC")).total_seconds()
        time.sleep(max(0.0, wait + 0.5))

    time.sleep(max(0.0, (wall0 - pd.Timestamp.now(tz="UTC")).total_seconds()))
    settings_of_run = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}
    deadline = time.monotonic() + LOOP_DEADLINE_S
    results = loop.run_hours(T0, HOURS, progress=pace, **settings_of_run)
    while _states(tmp_warehouse) != {"finished": N_JOBS}:
        assert time.monotonic() < deadline, (
            f"jobs not all finished after {len(results)} hours: {_states(tmp_warehouse)}"
        )
        results.append(loop.run_hour(results[-1].plan_time + pd.Timedelta(hours=1), **settings_of_run))
        pace(results[-1])
    down = next(r for r in results if r.plan_time == OUTAGE)
    assert "slurmctld unreachable" in down.sync["unreachable"]["slurm"] and down.dispatch["sent"] == 0
    assert all("slurmctld unreachable" in error for error in down.dispatch["failed"].values())
    others = [r for r in results if r is not down]
    assert not any(r.sync["unreachable"] for r in others)
    # Slurm 22.05 reads 0 shards on the node after the restart until the shard jobs running then end: those
    # dispatches are refused with the reason and go out an hour later
    refused = [e for r in others for e in r.dispatch["failed"].values()]
    assert all("Slurm reports none" in e for e in refused), refused
    assert sum(r.dispatch["sent"] for r in results) == N_JOBS  # the failed ones once, after the restart

    build(select=list(LEDGER_SELECT), warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        events = con.execute(
            "SELECT planner_job_id, event, event_time, executor_ref FROM raw.job_events ORDER BY event_time"
        ).df()
        runs = con.execute(
            "SELECT e.executor_ref, r.outcome, r.started_at, r.ended_at FROM marts.job_runs AS r JOIN raw.job_events "
            "AS e ON e.plan_id = r.plan_id AND e.planner_job_id = r.tenant || '/' || r.job_id AND e.event = 'started'"
        ).df()
    assert _states(tmp_warehouse) == {"finished": N_JOBS}
    # one Slurm job per planned job, every one ended COMPLETED; the events carry Slurm's own times
    ours = {r["JobId"]: r for r in executor.cli.finished() if JobKey.parse(r.get("Name"))}
    mine = {ref: r for ref, r in ours.items() if JobKey.parse(r["Name"]).plan_id.startswith("rolling-lp@")}
    assert len(mine) == N_JOBS and {r["JobState"] for r in mine.values()} == {"COMPLETED"}
    assert len({JobKey.parse(r["Name"]).job_id for r in mine.values()}) == N_JOBS
    for event, field in (("started", "StartTime"), ("finished", "EndTime")):
        got = events[events["event"] == event].set_index("executor_ref")["event_time"]
        assert len(got) == N_JOBS
        for ref, at in got.items():
            assert pd.Timestamp(at).tz_convert("UTC") == clock.to_plan(epoch(mine[ref][field]))
    assert len(runs) == N_JOBS and set(runs["outcome"]) == {"finished"}
    for row in runs.itertuples(index=False):  # the ledger's actual times are Slurm's
        assert pd.Timestamp(row.started_at).tz_convert("UTC") == clock.to_plan(
            epoch(mine[row.executor_ref]["StartTime"])
        )
        assert pd.Timestamp(row.ended_at).tz_convert("UTC") == clock.to_plan(epoch(mine[row.executor_ref]["EndTime"]))
    outputs = sorted((slurm_cluster.dir / f"loop-{ref}.txt").read_text().strip() for ref in mine)
    assert outputs == sorted(f"job {i} done" for i in range(N_JOBS))


def _user_job(cluster, folder, name: str, *args) -> str:
    """A user's held submission (sbatch as the user would type it): its Slurm job id."""
    script = folder / f"{name}.sh"
    script.write_text(f"#!/bin/bash\nsleep 1\necho {name} ran >> {folder}/{name}.out\n")
    res = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--time=1", "--gres=gpu:1", "--mem=1024M", *args, str(script)],
        env=cluster.env, cwd=folder, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def _wait_state(executor, ref: str, timeout_s: float = WAIT_S) -> str:
    """The Slurm job's state once it left PENDING (or PENDING at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = next((j["job_state"] for j in executor.cli.jobs() if str(j["job_id"]) == ref), "GONE")
        if state != "PENDING" or time.monotonic() > deadline:
            return state
        time.sleep(0.3)


def test_held_jobs_from_slurm_are_imported_planned_and_released_or_moved(
    slurm_cluster, tmp_warehouse, tmp_path, data_dir, monkeypatch
):
    """Users' held, marked jobs are imported, planned, and started by the plan: one where it was submitted (the
    same Slurm job, released), one that may only run in another cluster's region (cancelled here, submitted
    there); a marked job the queue refuses and an unmarked one stay held."""
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=tmp_warehouse, progress=False)
    build(select="+grid_hourly", warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    users = tmp_path / "users"
    users.mkdir()
    wall0 = pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=3)
    clock = PlanClock.from_settings(T0, wall0, SECONDS_PER_HOUR)
    deadline = f"--deadline={clock.to_wall(T0 + pd.Timedelta(hours=12)):%Y-%m-%dT%H:%M:%S}"  # 1 min = 10 plan h
    resnet = "job_type='ResNet-50 (batch size 64)'"
    here = _user_job(slurm_cluster, users, "here", deadline, f"--comment=carbon-aware {resnet} allowed_regions=us-west")
    there = _user_job(
        slurm_cluster, users, "there", deadline, f"--comment=carbon-aware {resnet} home_region=eu-north "
        "allowed_regions=eu-north",
    )  # fmt: skip
    refused = _user_job(slurm_cluster, users, "refused", deadline, "--comment=carbon-aware job_type=mystery")
    unmarked = _user_job(slurm_cluster, users, "unmarked", deadline)
    common = {"conf": str(slurm_cluster.conf), "plan_origin": T0.isoformat(), "wall_origin": wall0.isoformat(),
              "seconds_per_hour": SECONDS_PER_HOUR, "output": str(slurm_cluster.dir / "moved-%j.txt")}  # fmt: skip
    nodes = [{k: n[k] for k in ("name", "gpus", "cpus", "memory_mib")} for n in make_executor("slurm", common).nodes()]
    spec = {
        "version": 1,
        "regions": {"us-west": {"zone": "CISO"}, "eu-north": {"zone": "SE"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [
            {"name": name, "region": region, "gpu_model": "V100", "nodes": nodes,
             "executor": {"kind": "slurm", "name": name, "partition": partition, **common}}
            for name, region, partition in (("slurm-west", "us-west", "gpu"), ("slurm-north", "eu-north", "gpu-b"))
        ],
    }  # fmt: skip
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("FLEET_PATH", str(tmp_path / "fleet.yaml"))
    west = make_executor("slurm", {**common, "name": "slurm-west", "partition": "gpu"})

    def pace(result):
        wait = (clock.to_wall(result.plan_time + pd.Timedelta(hours=1)) - pd.Timestamp.now(tz="UTC")).total_seconds()
        time.sleep(max(0.0, wait + 0.5))

    time.sleep(max(0.0, (wall0 - pd.Timestamp.now(tz="UTC")).total_seconds()))
    run = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}
    deadline = time.monotonic() + LOOP_DEADLINE_S
    results = loop.run_hours(T0, 3, progress=pace, **run)
    while _states(tmp_warehouse).get("finished", 0) < 2:
        assert time.monotonic() < deadline, f"jobs not finished after {len(results)} hours: {_states(tmp_warehouse)}"
        results.append(loop.run_hour(results[-1].plan_time + pd.Timedelta(hours=1), **run))
        pace(results[-1])

    imported = results[0].sync["imported"]
    assert (imported["accepted"], imported["unchanged"]) == (2, 0)
    assert list(imported["rejected"]) == [f"root/cptest-{refused}"]
    assert "workload_class" in imported["rejected"][f"root/cptest-{refused}"]
    assert all(r.sync["imported"]["accepted"] == 0 for r in results[1:])  # released: never imported twice
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        queue = dict(con.execute("SELECT job_id, state || ' ' || created_from FROM queue.jobs").fetchall())
        events = con.execute(
            "SELECT job_id, executor, executor_ref, event FROM raw.job_events ORDER BY event_time, event"
        ).df()
        quarantined = con.execute(
            "SELECT count(*) FROM quarantine.rejected_rows WHERE table_name = 'queue.jobs' AND field = 'workload_class'"
        ).fetchone()[0]
    assert queue == {f"cptest-{j}": "finished executor:slurm-west" for j in (here, there)}
    assert quarantined == 1  # once, though it is offered every hour
    ran_here = events[events["job_id"] == f"cptest-{here}"]
    assert set(ran_here["executor_ref"]) == {here} and set(ran_here["executor"]) == {"slurm-west"}  # released
    ran_there = events[events["job_id"] == f"cptest-{there}"]
    assert set(ran_there["executor"]) == {"slurm-north"} and there not in set(ran_there["executor_ref"])
    assert list(ran_there["event"]) == ["dispatched", "started", "finished"]
    finished = {r["JobId"]: r for r in west.cli.finished()}
    assert finished[there]["JobState"] == "CANCELLED"  # withdrawn from its own cluster before it ran
    moved = finished[ran_there["executor_ref"].iloc[0]]
    assert moved["JobState"] == "COMPLETED" and moved["Partition"] == "gpu-b"
    for name in ("here", "there"):  # each ran once
        assert (users / f"{name}.out").read_text() == f"{name} ran\n"
    jobs = {str(j["job_id"]): j for j in west.cli.jobs()}
    assert jobs[refused]["state_reason"] == jobs[unmarked]["state_reason"] == "JobHeldUser"

    # a job imported, then cancelled in the queue before any plan started it: its Slurm job is withdrawn next hour
    west.cli.cancel(refused)  # nothing else left to import: the withdrawal does not wait for an import
    late = f"--deadline={clock.to_wall(T0 + pd.Timedelta(hours=40)):%Y-%m-%dT%H:%M:%S}"
    withdrawn = _user_job(slurm_cluster, users, "withdrawn", late, f"--comment=carbon-aware {resnet}")
    hour = results[-1].plan_time + pd.Timedelta(hours=1)
    assert loop.sync(loop.context(hour, **run))["imported"]["accepted"] == 1
    store.cancel_job(f"cptest-{withdrawn}", tenant="root", at=hour + pd.Timedelta(minutes=30), db_path=tmp_warehouse)
    after = loop.sync(loop.context(hour + pd.Timedelta(hours=1), **run))["imported"]
    # still held (no plan adopted it: only the sync ran), so offered again, and withdrawn
    assert after == {"accepted": 0, "unchanged": 1, "rejected": {}, "withdrawn": [f"root/cptest-{withdrawn}"]}
    assert _wait_state(west, withdrawn) == "CANCELLED" and not (users / "withdrawn.out").exists()


def test_an_adopted_job_slurm_starts_itself_is_followed_and_planned_nowhere_else(
    slurm_cluster, tmp_warehouse, tmp_path, data_dir, monkeypatch
):
    """A user's held job is adopted under the hour's plan, which defers it; the planner is then down at the job's
    latest start, so Slurm starts it itself. The next hours' syncs move the queue with it (attempt 0 of the
    adopting plan: running, then finished), the plans keep its GPUs bound and never dispatch or withdraw it, and
    the ledger values the run against the adopting plan."""
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=tmp_warehouse, progress=False)
    build(select="+grid_hourly", warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    wall0 = pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=3)
    clock = PlanClock.from_settings(T0, wall0, SECONDS_PER_HOUR)
    settings = {"conf": str(slurm_cluster.conf), "plan_origin": T0.isoformat(), "wall_origin": wall0.isoformat(),
                "seconds_per_hour": SECONDS_PER_HOUR, "output": str(slurm_cluster.dir / "self-%j.txt")}  # fmt: skip
    write_fleet(tmp_path / "fleet.yaml", settings)
    monkeypatch.setenv("FLEET_PATH", str(tmp_path / "fleet.yaml"))
    users = tmp_path / "users"
    users.mkdir()
    script = users / "self.sh"
    release = users / "self.release"  # the job runs until the test has seen it running
    script.write_text(f"#!/bin/bash\nuntil [ -e {release} ]; do sleep 0.2; done\necho self ran >> {users}/self.out\n")
    # a 1-minute time limit is 10 plan hours: Slurm's own latest start (deadline less the limit) is T0 + 1 h, while
    # the planner, for a 0.5 h job, could wait until T0 + 10.5 h
    deadline = clock.to_wall(T0 + pd.Timedelta(hours=11))
    res = subprocess.run(
        ["sbatch", "--parsable", "--hold", "--time=1", "--gres=gpu:1", "--mem=1024M",
         f"--deadline={deadline:%Y-%m-%dT%H:%M:%S}", "--comment=carbon-aware job_type='ResNet-50 (batch size 64)' "
         "est_duration_h=0.5 allowed_regions=us-west", str(script)],
        env=slurm_cluster.env, cwd=users, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    ref = res.stdout.strip()
    job = f"root/cptest-{ref}"
    executor = make_executor("slurm", settings)
    run = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}

    def at_hour(hours: int) -> pd.Timestamp:
        wait = (clock.to_wall(T0 + pd.Timedelta(hours=hours)) - pd.Timestamp.now(tz="UTC")).total_seconds()
        time.sleep(max(0.0, wait + 0.5))
        return T0 + pd.Timedelta(hours=hours)

    first = loop.run_hour(at_hour(0), **run)
    assert first.sync["imported"]["accepted"] == 1 and first.dispatch["sent"] == 0  # deferred to a greener hour
    adopting = first.plan["plan_id"]
    assert JobKey.parse(_slurm_job(executor, ref)["name"]) == JobKey(adopting, job, 0, "slurm-v100")
    # no loop hour at T0 + 1: Slurm starts the job itself at its latest start
    assert _wait_state(executor, ref) == "RUNNING"
    second = loop.run_hour(at_hour(2), **run)
    assert second.sync["entered"] == {"running": 1} and not second.sync["unreachable"]
    assert second.plan["n_running"] == 1 and second.dispatch["sent"] == 0  # bound, not planned again
    release.touch()
    _wait_ended(executor, ref)
    third = loop.run_hour(at_hour(3), **run)
    assert third.sync["entered"] == {"finished": 1} and third.dispatch["sent"] == 0
    assert _states(tmp_warehouse) == {"finished": 1}
    assert (users / "self.out").read_text() == "self ran\n"  # once, never cancelled
    (record,) = [r for r in executor.cli.finished() if r["JobId"] == ref]
    assert record["JobState"] == "COMPLETED" and JobKey.parse(record["Name"]).attempt == 0
    build(select=list(LEDGER_SELECT), warehouse_path=tmp_warehouse, target_path=tmp_path / "target")
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        mine = [f"cptest-{ref}"]  # the cluster also holds other tests' jobs, which this executor reports
        runs = con.execute("SELECT plan_id, attempt, outcome, started_at FROM marts.job_runs WHERE job_id = ?", mine)
        runs = runs.fetchall()
        ledger = con.execute(
            "SELECT outcome, attempts, realized_kgco2e FROM marts.carbon_ledger WHERE job_id = ?", mine
        )
        ledger = ledger.fetchall()
        logged = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'dispatch_log'")
        assert logged.fetchone()[0] == 0  # nothing was ever dispatched
    started = clock.to_plan(epoch(record["StartTime"]))
    assert [(p, a, o, pd.Timestamp(s).tz_convert("UTC")) for p, a, o, s in runs] == [(adopting, 0, "finished", started)]
    assert T0 + pd.Timedelta(hours=1) <= started < T0 + pd.Timedelta(hours=2)
    ((outcome, attempts, realized),) = ledger
    assert (outcome, attempts) == ("finished", 1) and realized > 0


def _wait_ended(executor, ref: str, timeout_s: float = WAIT_S) -> None:
    """Until Slurm has the job among its finished ones."""
    deadline = time.monotonic() + timeout_s
    while not any(r["JobId"] == ref for r in executor.cli.finished()):
        assert time.monotonic() < deadline, f"Slurm job {ref} still not ended after {timeout_s} s"
        time.sleep(0.3)


def _slurm_job(executor, ref: str) -> dict | None:
    return next((j for j in executor.cli.jobs() if str(j["job_id"]) == ref), None)
