"""Command `bench-loop`: time and memory of one hour of the operating loop (sync, plan, dispatch, event load).

    python -m scheduling bench-loop --queued 5000 --running 1000 --repeats 3 --json

The state is built on a temporary copy of the warehouse (--db, default WAREHOUSE_PATH), so the user's queue is
untouched: the copy keeps the static inputs (marts, forecasts, registered models) and loses the loop's own state
(queue.*, executor.*, plan.*, raw.job_events). Then, with one replay executor for every cluster (the bench never
dispatches to a real executor):

* the running set: a `performance-first` plan (earliest start) of 2 x `--running` trace jobs of two days before T
  is made in memory at T-1h; `--running` of the jobs it starts at once and whose replay run outlasts T are
  submitted, and that plan, restricted to them, is written and dispatched by `loop.dispatch_plan`; the bench checks
  that the executor reports exactly that many running at T; with --checkpointing every one of them checkpoints
  (the hour then also decides which to preempt, for carbon and for due jobs, `scheduling.planning.pausing`);
* the queue: `--queued` trace jobs arriving over the 24 hours before T (T is a midnight by default), submitted
  after that, so that all of them are queued at T;
* with `--services N`, N inference services submitted a day before T (the example file's three models in turn, at
  `BENCH_SERVICE_SCALE` of their ServeGen rate, allowed anywhere): the hour also plans their replicas first.

Each repeat copies the prepared file and runs the hour T in a fresh process (as an Airflow task or `plan-hourly`
does: cold caches; what the command module imports is loaded before the clock starts, anything a step imports
lazily is timed with it), timing `loop.sync`, `loop.plan` and `loop.dispatch_plan`; the process's
peak resident memory (ru_maxrss, interpreter and libraries included) comes back with it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tabulate import tabulate

from common.jsonutil import to_jsonable
from common.timeutil import HOUR, iso_z, utc_hour
from scheduling import loop
from scheduling.domain.plan import Plan
from scheduling.evaluation.results import environment
from scheduling.executors.items import dispatch_items
from scheduling.executors.replay import ReplayExecutor
from scheduling.output.plan_store import plan_id_for
from scheduling.planning.pausing import Pausing
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from scheduling.queue import store
from scheduling.queue.files import read_job_file
from scheduling.queue.frame import job_frame
from scheduling.queue.intake import submit_mappings
from scheduling.queue.service_intake import EXAMPLE_SERVICES, submit_service_file
from scheduling.queue.spec import parse_job
from scheduling.queue.trace import CHECKPOINT_INTERVAL_MIN, trace_jobs
from scheduling.service import DEFAULT_HORIZON_H, make_plan, plan_fleet, validate_inputs, write_plan
from warehouse.config import warehouse_path
from warehouse.db import reader, table_exists, warehouse_lock, writer

TARGETS = {"loop_hour_s": 5.0, "peak_mb": 500.0}
PREP_POLICY = "performance-first"  # starts each job at once where it fits: the running set
LOOP_STATE = ("queue", "executor", "plan", "ops")  # schemas the loop writes; and LOOP_RAW
LOOP_RAW = ("raw.job_events", "raw.service_usage")  # what the loop's sync loads from its executors


def register(subparsers) -> None:
    b = subparsers.add_parser(
        "bench-loop",
        help="time and peak memory of one operating-loop hour (sync, plan, dispatch) on a prepared queue",
        description="Build a queue of --queued trace jobs and --running running jobs on a temporary copy of the "
        "warehouse, then time one hour of the loop (sync + plan + dispatch + event load) --repeats times, each in "
        "a fresh process on a fresh copy of the prepared state. Prints the medians and the peak resident memory.",
    )
    b.add_argument("--queued", type=int, default=5000, help="queued jobs at the measured hour (default 5000)")
    b.add_argument("--running", type=int, default=1000, help="running jobs at the measured hour (default 1000)")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--as-of", default="2021-07-16T00:00Z", help="the measured hour T (default 2021-07-16T00:00Z)")
    b.add_argument("--policy", default=DEFAULT_POLICY, choices=list(POLICY_NAMES))
    b.add_argument("--horizon-hours", type=int, default=DEFAULT_HORIZON_H)
    b.add_argument(
        "--fleet-gpus",
        type=int,
        default=2000,
        help="re-size the configured fleet to about this many GPUs, so that the running set fits (default 2000; 0 = "
        "the fleet as configured)",
    )
    b.add_argument("--db", default=None, help="warehouse to copy (default WAREHOUSE_PATH); never written")
    b.add_argument("--data-dir", default=None)
    b.add_argument(
        "--checkpointing",
        action="store_true",
        help="every running job checkpoints: the hour also decides which of them to preempt",
    )
    b.add_argument(
        "--services",
        type=int,
        default=0,
        help="inference services in the queue (the example file's three models in turn, each at 2 %% of its "
        "ServeGen rate; default 0)",
    )
    b.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    b.set_defaults(func=cmd_bench_loop)


# ------------------------------------------------------------------------------------------------ state


def bench_fleet(fleet_gpus: int, data_dir=None):
    """The configured fleet (regions with grid data), re-sampled to about `fleet_gpus` GPUs (deterministic; 0 =
    as configured)."""
    fleet = plan_fleet(None, data_dir)
    return fleet.scaled(fleet_gpus, keep_declared=True) if fleet_gpus else fleet


def copy_warehouse(source: Path | None, target: Path) -> bool:
    """Copy the warehouse file (under its shared lock) and drop the loop's state in the copy. False when there is
    no warehouse to copy: the copy then starts empty and the plan reads the grid from the DATA_DIR files."""
    if source is not None and source.exists():
        with warehouse_lock(source, exclusive=False):
            shutil.copyfile(source, target)
            wal = source.with_name(source.name + ".wal")
            if wal.exists():
                shutil.copyfile(wal, target.with_name(target.name + ".wal"))
    with writer(target) as con:
        for schema in LOOP_STATE:
            con.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for table in LOOP_RAW:
            con.execute(f"DROP TABLE IF EXISTS {table}")
            if table_exists(con, "raw._batches"):
                con.execute("DELETE FROM raw._batches WHERE table_name = ?", [table])
    return source is not None and source.exists()


def _evenly(items: list, n: int) -> list:
    """`n` of `items` spread evenly over them (keeps the arrival pattern of a trace day)."""
    if n >= len(items):
        return list(items)
    return [items[i] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]


def _queued_jobs(day, n: int, fleet, data_dir=None) -> list[dict]:
    """`n` trace jobs arriving over `day` (the generator drops jobs the fleet cannot host: ask for a few more)."""
    if n == 0:
        return []
    jobs = trace_jobs(day, int(n * 1.05) + 10, fleet, data_dir=data_dir)
    if len(jobs) < n:
        raise ValueError(f"the trace of {day:%Y-%m-%d} gave {len(jobs)} jobs this fleet can host, fewer than {n}")
    return _evenly(jobs, n)


BENCH_SERVICE_SCALE = 0.02  # each bench service serves this share of its ServeGen model's requests


def _submit_services(n: int, T, db: Path, fleet, data_dir=None) -> int:
    """`n` services submitted a day before T: the example file's services in turn, under ids svc-000 ..., each at
    BENCH_SERVICE_SCALE of its ServeGen rate and allowed anywhere."""
    if n == 0:
        return 0
    example = read_job_file(EXAMPLE_SERVICES, key="services")
    rows = []
    for i in range(n):
        base = dict(example[i % len(example)].data)
        base.update(service_id=f"svc-{i:03d}", rate_scale=BENCH_SERVICE_SCALE, min_replicas=1, allowed_regions=[])
        rows.append(base)
    path = db.with_name("bench-services.yaml")
    path.write_text(yaml.safe_dump({"services": rows}))
    report = submit_service_file(path, as_of=T - pd.Timedelta(days=1), fleet=fleet, db_path=db, data_dir=data_dir)
    if report.counts.get("accepted", 0) != n:
        raise ValueError(f"intake of the services: {report.counts}")
    return n


def _queue_counts(db: Path, T) -> dict[str, int]:
    with reader(db) as con:
        if not table_exists(con, "queue.jobs"):
            return {}
        rows = con.execute(
            "SELECT state, count(*) FROM queue.jobs WHERE submitted_at <= ? GROUP BY 1", [T.to_pydatetime()]
        ).fetchall()
    return {s: int(n) for s, n in rows}


def _dispatch_running_set(n: int, T, settings: dict, executor: ReplayExecutor, checkpointing: bool = False) -> int:
    """Dispatch `n` trace jobs at T-1h that still run at T; returns how many the plan of the candidates started.

    The candidates (2n + 20 trace jobs of the day before the planning day) are planned in memory with PREP_POLICY
    at T-1h; of the jobs that plan starts at once, those whose replay run outlasts T are kept and `n` of them,
    spread over the day, are submitted; the plan restricted to them (the same nodes: a subset of a packing fits)
    is written and dispatched by `loop.dispatch_plan`, through the dispatch log, as the loop would."""
    db, fleet, data_dir = settings["db_path"], settings["fleet"], settings["data_dir"]
    prep = T - HOUR
    day = T.floor("D") - pd.Timedelta(days=2)
    candidates = trace_jobs(day, 2 * n + 20, fleet, data_dir=data_dir)
    if checkpointing:
        candidates = [{**j, "checkpoint_interval_min": CHECKPOINT_INTERVAL_MIN} for j in candidates]
    frame = job_frame([parse_job(j, where=f"trace job {j['job_id']}") for j in candidates], fleet, data_dir=data_dir)
    trial, info = make_plan(prep, jobs=frame, policy=PREP_POLICY, fleet=fleet, db_path=db, data_dir=data_dir)
    items = dispatch_items(trial, frame.assign(attempt=1))
    runs, _ = executor.plan_runs(plan_id_for(PREP_POLICY, prep), items)
    outlast = set(runs.loc[runs["true_end"] > T, "job_id"])
    chosen = _evenly([j for j in candidates if f"{j['tenant']}/{j['job_id']}" in outlast], n)
    if len(chosen) < n:
        raise ValueError(
            f"a plan of {len(candidates)} trace jobs starts {len(outlast)} that run past {iso_z(T)} on a fleet of "
            f"{fleet.total_gpus} GPUs, fewer than --running {n}: raise --fleet-gpus"
        )
    report = submit_mappings(chosen, source="bench-loop:running", as_of=prep, db_path=db, data_dir=data_dir)
    if report.counts.get("accepted", 0) != n:
        raise ValueError(f"intake of the running set: {report.counts}")
    keep = {f"{j['tenant']}/{j['job_id']}" for j in chosen}
    a = trial.assignments
    subset = Plan(
        trial.plan_time,
        trial.policy,
        trial.forecast_version,
        assignments=a[a["job_id"].isin(keep)].reset_index(drop=True),
        explanations=[e for e in trial.explanations if e["job_id"] in keep],
    )
    ctx = loop.context(prep, policy=PREP_POLICY, **settings)
    pending, _, _ = loop.inputs(ctx)
    write_plan(subset, info, db_path=db, schedule_root=settings["schedule_root"], created_from="bench-loop")
    loop.dispatch_plan(ctx, subset, pending)
    return len(items)


def prepare(
    db: Path,
    T: pd.Timestamp,
    *,
    queued: int,
    running: int,
    fleet_gpus: int,
    schedule_root: Path,
    data_dir=None,
    checkpointing: bool = False,
    services: int = 0,
) -> dict:
    """Build the state the measured hour T starts from in the warehouse copy `db` (see the module doc)."""
    fleet = bench_fleet(fleet_gpus, data_dir)
    executor = ReplayExecutor(db_path=db)
    settings = {
        "db_path": db,
        "data_dir": data_dir,
        "schedule_root": schedule_root,
        "fleet": fleet,
        "executors": dict.fromkeys(fleet.names, executor),
    }
    started = _dispatch_running_set(running, T, settings, executor, checkpointing) if running else 0
    reported = executor.running(T)
    if len(reported) != running:
        raise ValueError(f"the replay executor reports {len(reported)} jobs running at {iso_z(T)}, not {running}")
    if queued:
        jobs = _queued_jobs(T.floor("D") - pd.Timedelta(days=1), queued, fleet, data_dir)
        report = submit_mappings(jobs, source="bench-loop:queued", as_of=T, db_path=db, data_dir=data_dir)
        if report.counts.get("accepted", 0) != queued:
            raise ValueError(f"intake of the queue: {report.counts}")
    return {
        "fleet": {"clusters": len(fleet), "gpus": int(fleet.total_gpus)},
        "services": _submit_services(services, T, db, fleet, data_dir),
        "queue": _queue_counts(db, T),
        "running_at_T": int(len(reported)),
        "trial_plan_started": started,
    }


# ------------------------------------------------------------------------------------------------ one hour


def measure_hour(spec: dict) -> dict:
    """One loop hour on the prepared copy `spec["db"]`, timed per phase (run in a fresh process)."""
    fleet = bench_fleet(spec["fleet_gpus"], spec["data_dir"])
    executor = ReplayExecutor(db_path=spec["db"])
    ctx = loop.context(
        spec["as_of"],
        policy=spec["policy"],
        horizon_hours=spec["horizon_hours"],
        db_path=spec["db"],
        data_dir=spec["data_dir"],
        schedule_root=spec["schedule_root"],
        fleet=fleet,
        executors=dict.fromkeys(fleet.names, executor),
        # checkpointing runs: every preemption rule is on, so the hour weighs each of them (the most work)
        pausing=Pausing(for_carbon=True, for_deadline=True) if spec.get("checkpointing") else None,
    )
    t0 = time.perf_counter()
    synced = loop.sync(ctx)
    t1 = time.perf_counter()
    result, summary, pending = loop.plan(ctx, created_from="bench-loop")
    t2 = time.perf_counter()
    sent = loop.dispatch_plan(ctx, result, pending)
    t3 = time.perf_counter()
    return {
        "sync_s": t1 - t0,
        "plan_s": t2 - t1,
        "dispatch_s": t3 - t2,
        "loop_hour_s": t3 - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "events": int(synced["events"]),
        "entered": synced["entered"],
        "pending": int(summary["n_jobs"]),
        "running": int(summary["n_running"]),
        "assigned": int(summary["n_assigned"]),
        "unplaced": int(summary["n_unplaced"]),
        "dispatched": int(sent["sent"] + sent["reconciled"]),
        "preempted": int(summary.get("preempted", {}).get("decided", 0)),
        "services": summary.get("services", {}),
        "running_checkpointing": int(running_checkpointing_jobs(spec["db"], spec["as_of"])),
        "forecast_source": summary["forecast_source"],
    }


def _in_fresh_process(spec: dict) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure_hour, (spec,))


# ------------------------------------------------------------------------------------------------ command


def bench_loop(
    *,
    queued: int = 5000,
    running: int = 1000,
    repeats: int = 3,
    as_of="2021-07-16T00:00Z",
    policy: str = DEFAULT_POLICY,
    horizon_hours: int = DEFAULT_HORIZON_H,
    fleet_gpus: int = 2000,
    db=None,
    data_dir=None,
    checkpointing: bool = False,
    services: int = 0,
) -> dict:
    """Prepare the state once, measure the hour `repeats` times; the JSON document of the command."""
    if min(queued, running, fleet_gpus, services) < 0 or repeats < 1:
        raise ValueError("--queued, --running, --services and --fleet-gpus must be >= 0, --repeats >= 1")
    T = utc_hour(as_of)
    validate_inputs(T, policy, None, horizon_hours)
    source = Path(db) if db else warehouse_path()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        tmp = Path(tmp)
        prepared = tmp / "prepared.duckdb"
        copied = copy_warehouse(source, prepared)
        with reader(prepared) as con:
            grid_mart = table_exists(con, "marts.grid_hourly")
        state = prepare(
            prepared,
            T,
            queued=queued,
            running=running,
            fleet_gpus=fleet_gpus,
            schedule_root=tmp / "schedules-prep",
            data_dir=data_dir,
            checkpointing=checkpointing,
            services=services,
        )
        prepare_s = time.perf_counter() - t0
        hours = []
        for r in range(repeats):
            copy = tmp / f"hour-{r}.duckdb"
            shutil.copyfile(prepared, copy)
            spec = {
                "db": str(copy),
                "as_of": iso_z(T),
                "policy": policy,
                "horizon_hours": horizon_hours,
                "fleet_gpus": fleet_gpus,
                "data_dir": data_dir,
                "schedule_root": str(tmp / f"schedules-{r}"),
                "checkpointing": checkpointing,
            }
            hours.append(_in_fresh_process(spec))
            copy.unlink()
    last = hours[-1]
    counts = {k: [h[k] for h in hours] for k in ("pending", "running", "dispatched", "events")}
    median = {k: round(float(np.median([h[k] for h in hours])), 3) for k in ("loop_hour_s", "sync_s", "plan_s")}
    median["dispatch_s"] = round(float(np.median([h["dispatch_s"] for h in hours])), 3)
    peak = round(max(h["peak_rss_mb"] for h in hours), 1)
    return {
        "benchmark": "bench-loop",
        "as_of": iso_z(T),
        "policy": policy,
        "horizon_hours": horizon_hours,
        "queued": state["queue"].get("queued", 0),
        "running": last["running"],
        "pending_planned": last["pending"],
        "assigned": last["assigned"],
        "unplaced": last["unplaced"],
        "dispatched": last["dispatched"],
        "preempted": last["preempted"],
        "running_checkpointing": last["running_checkpointing"],
        "services": last["services"],
        "events": last["events"],
        "entered": last["entered"],
        **median,
        "loop_hour_s_all": [round(h["loop_hour_s"], 3) for h in hours],
        "process_peak_rss_mb": peak,
        "targets": TARGETS,
        "latency_target_met": median["loop_hour_s"] < TARGETS["loop_hour_s"],
        "memory_target_met": peak < TARGETS["peak_mb"],
        "repeats": repeats,
        "same_state_each_repeat": all(len(set(v)) == 1 for v in counts.values()),
        "fleet": state["fleet"],
        "warehouse": {
            "copied_from": str(source) if copied else None,
            "grid": "marts.grid_hourly" if grid_mart else "DATA_DIR files",
            "forecast_source": last["forecast_source"],
        },
        "running_from": f"{running} of the jobs a {PREP_POLICY} plan of {2 * running + 20} trace jobs of "
        f"{(T.floor('D') - pd.Timedelta(days=2)):%Y-%m-%d} starts at {iso_z(T - HOUR)} and whose replay run "
        f"outlasts {iso_z(T)}, dispatched by loop.dispatch_plan at {iso_z(T - HOUR)}; `running` = what the replay "
        f"executor reports at {iso_z(T)}",
        "queued_from": f"{queued} trace jobs arriving over {(T.floor('D') - pd.Timedelta(days=1)):%Y-%m-%d}, "
        "submitted after the running set was dispatched",
        "what": "loop_hour_s = loop.sync (staged submissions, the executor's events of [T-1h, T) loaded into "
        "raw.job_events, queue states) + loop.plan (pending jobs around what runs; plan.* and schedule files) + "
        "loop.dispatch_plan (exactly-once dispatch log, replay runs); each repeat on a fresh copy of the prepared "
        "warehouse in a fresh process (imports and the fleet's node sampling not timed); process_peak_rss_mb = "
        "that process's ru_maxrss, the largest over the repeats",
        "prepare_s": round(prepare_s, 1),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "environment": environment(),
    }


def running_checkpointing_jobs(db, as_of) -> int:
    """The running jobs at `as_of` whose job checkpoints (read after the hour: its jobs that are running now)."""
    with reader(db) as con:
        return int(
            con.execute(
                f"SELECT count(*) FROM {store.JOBS} WHERE state = 'running' AND checkpoint_interval_min IS NOT NULL"
            ).fetchone()[0]
        )


def cmd_bench_loop(args: argparse.Namespace) -> int:
    try:
        out = bench_loop(
            queued=args.queued,
            running=args.running,
            repeats=args.repeats,
            as_of=args.as_of,
            policy=args.policy,
            horizon_hours=args.horizon_hours,
            fleet_gpus=args.fleet_gpus,
            db=args.db,
            data_dir=args.data_dir,
            checkpointing=args.checkpointing,
            services=args.services,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_jsonable(out), sort_keys=True))
        return 0
    rows = [
        ("queued / running at T", f"{out['queued']} / {out['running']}"),
        ("events loaded / dispatched", f"{out['events']} / {out['dispatched']}"),
        ("running checkpointing / preempted", f"{out['running_checkpointing']} / {out['preempted']}"),
        (
            "services / served / their GPUs",
            f"{out['services'].get('services', 0)} / {out['services'].get('served', 0)}"
            f" / {out['services'].get('gpus', 0)}",
        ),
        ("loop hour (median)", f"{out['loop_hour_s']:.2f} s  (target < {TARGETS['loop_hour_s']:g} s)"),
        ("  sync / plan / dispatch", f"{out['sync_s']:.2f} / {out['plan_s']:.2f} / {out['dispatch_s']:.2f} s"),
        ("process peak RSS", f"{out['process_peak_rss_mb']:.0f} MB  (target < {TARGETS['peak_mb']:g} MB)"),
        ("fleet", f"{out['fleet']['clusters']} clusters, {out['fleet']['gpus']} GPUs"),
        ("grid / forecasts", f"{out['warehouse']['grid']} / {out['warehouse']['forecast_source']}"),
        ("repeats / prepare", f"{out['repeats']} / {out['prepare_s']:.0f} s"),
    ]
    print(tabulate(rows, tablefmt="plain"))
    return 0
