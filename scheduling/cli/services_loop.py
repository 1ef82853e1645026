"""`python -m scheduling services-loop`: inference services beside the batch jobs in the operating loop, against
the same loop without them.

    python -m scheduling services-loop --start 2021-07-08 --days 7 --jobs 320 --json

On two temporary copies of the warehouse (queue, executor and plan state dropped; never written), `--jobs` trace
jobs a day arrive over `--days` days from `--start`, on the configured fleet whose sampled clusters are re-sized so
that they fill `--load` of those clusters' GPU-hours (the declared H100 clusters kept as they are); the loop runs
hour by hour on the replay executor (run-time spread `--sigma`, `--failure-rate`) until the jobs have ended (at
most 48 hours after the last day). One copy also holds the services of `--services` (default the example file),
submitted at the start: each hour plans their replicas first and the jobs around them. The ledger marts are
built on both copies; printed: the jobs' deadlines met, regret and saving on both, and the services' carbon per 1k
tokens against static provisioning and their latency target's attainment. With `--start 2021-07-08 --days 7` the
services serve ServeGen's days 8-14, each hour's load forecast fitted on the 7 days before it (days 1-7 at the
first hour).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from common.jsonutil import to_jsonable
from common.timeutil import HOUR, utc
from scheduling import loop
from scheduling.cli.bench_loop import copy_warehouse
from scheduling.cli.compare_loop import open_jobs
from scheduling.executors.replay import DEFAULT_FAILURE_RATE, DEFAULT_SIGMA, ReplayExecutor
from scheduling.output.ledger import ledger, service_rows
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from scheduling.planning.serving import ServingPolicy
from scheduling.queue.intake import submit_mappings
from scheduling.queue.service_intake import EXAMPLE_SERVICES, submit_service_file
from scheduling.queue.trace import job_gpu_hours, trace_jobs
from scheduling.service import plan_fleet
from scheduling.tasks import build_ledger
from warehouse.config import warehouse_path

TAIL_HOURS = 48
TARGETS = {"reduction_pct": 40.0, "slo_attainment_pct": 99.0}


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "services-loop",
        help="inference services beside the batch jobs in the loop, against the loop without them",
        description="Run the operating loop twice on temporary copies of the warehouse, over --days days of trace "
        "jobs, with and without the services of --services, and compare the jobs' deadlines and the services' "
        "carbon per 1k tokens against static provisioning.",
    )
    c.add_argument("--start", default="2021-07-08", help="first day (UTC, default 2021-07-08: ServeGen's day 8)")
    c.add_argument("--days", type=int, default=7)
    c.add_argument("--jobs", type=int, default=320, help="trace jobs a day (default 320)")
    c.add_argument("--load", type=float, default=0.8, help="share of the sampled clusters' GPU-hours (default 0.8)")
    c.add_argument("--services", default=str(EXAMPLE_SERVICES), help="services file (default the example)")
    c.add_argument("--policy", default=DEFAULT_POLICY, choices=list(POLICY_NAMES))
    c.add_argument("--sigma", type=float, default=DEFAULT_SIGMA)
    c.add_argument("--failure-rate", type=float, default=DEFAULT_FAILURE_RATE)
    c.add_argument("--db", default=None, help="warehouse to copy (default WAREHOUSE_PATH); never written")
    c.add_argument(
        "--no-yield-to-batch",
        action="store_true",
        help="services take the cleanest free GPUs even where the last batch plan starts jobs this hour",
    )
    c.add_argument(
        "--hold-hours",
        type=int,
        default=1,
        help="hours the batch plan holds the services' GPUs (default 1; 0: its whole horizon)",
    )
    c.add_argument("--keep", default=None, help="keep the two warehouses (without.duckdb, with.duckdb) in this folder")
    c.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=cmd_services_loop)


def _run(copy: Path, tmp: Path, start, days: int, jobs: list[dict], fleet, services, settings: dict, say) -> dict:
    """One loop over the period on `copy`; its ledger (jobs and services) and its seconds."""
    t0 = time.perf_counter()
    end = start + pd.Timedelta(days=days)
    submit_mappings(jobs, source="services-loop", as_of=end, db_path=copy)
    if services is not None:
        report = submit_service_file(services, as_of=start, fleet=fleet, db_path=copy)
        if report.rejected:
            raise ValueError(f"{services}: {len(report.rejected)} service(s) rejected: {report.counts}")
    executor = ReplayExecutor(db_path=copy, sigma=settings["sigma"], failure_rate=settings["failure_rate"])
    context = {"policy": settings["policy"], "db_path": copy, "fleet": fleet, "serving": settings["serving"],
               "executors": dict.fromkeys(fleet.names, executor), "schedule_root": tmp / "schedules"}  # fmt: skip
    hours, limit = 0, days * 24 + TAIL_HOURS
    while hours < limit and (hours < days * 24 or open_jobs(copy)):
        loop.run_hour(start + hours * HOUR, **context)
        hours += 1
        if hours % 24 == 0:
            say(f"{'with' if services else 'without'} services: {hours} h, {time.perf_counter() - t0:.0f} s")
    build_ledger(db_path=copy)
    book = ledger(start, end, db_path=copy)
    return {"hours": hours, "jobs_not_ended": open_jobs(copy), "totals": book.totals, "services": book.services,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def services_loop(
    start="2021-07-08",
    days: int = 7,
    n_jobs: int = 320,
    load: float = 0.8,
    services=EXAMPLE_SERVICES,
    policy: str = DEFAULT_POLICY,
    sigma: float = DEFAULT_SIGMA,
    failure_rate: float = DEFAULT_FAILURE_RATE,
    db=None,
    progress=None,
    keep=None,
    serving: ServingPolicy | None = None,
) -> dict:
    """The comparison's JSON document (see the module doc); `keep`: a folder the two warehouses are copied to."""
    if days < 1 or n_jobs < 1 or not 0 < load <= 1:
        raise ValueError("--days and --jobs must be >= 1, --load in (0, 1]")
    say = progress or (lambda _msg: None)
    start = utc(start).floor("D")
    source = Path(db) if db else warehouse_path()
    base = plan_fleet(None)
    first = trace_jobs(start, n_jobs, base)
    fleet = base.scaled(job_gpu_hours(first) / (24.0 * load), seed=0, keep_declared=True)
    jobs = [j for d in range(days) for j in trace_jobs(start + pd.Timedelta(days=d), n_jobs, fleet)]
    settings = {"policy": policy, "sigma": sigma, "failure_rate": failure_rate, "serving": serving}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="services-loop-") as tmp:
        for name, file in (("without", None), ("with", Path(services))):
            copy = Path(tmp) / f"{name}.duckdb"
            if not copy_warehouse(source, copy):
                raise ValueError(f"no warehouse at {source}: run `make run` (or ingest + transform) first")
            runs[name] = _run(copy, Path(tmp) / name, start, days, jobs, fleet, file, settings, say)
            if keep is not None:
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(copy, Path(keep) / copy.name)
    keys = ("jobs", "finished", "failed", "deadlines_met_pct", "deadline_regret_pct", "saving_pct")
    batch = {name: {k: r["totals"].get(k) for k in keys} for name, r in runs.items()}
    served = runs["with"]["services"].get("all", {})
    met = {k: r.get("deadlines_met_pct") for k, r in batch.items()}
    return {
        "benchmark": "services-loop",
        "start": start.date().isoformat(),
        "days": days,
        "jobs_per_day": n_jobs,
        "fleet": {
            "clusters": len(fleet),
            "gpus": int(fleet.total_gpus),
            "declared_gpus": int(sum(c.n_gpus for c in fleet.clusters if c.declared)),
        },  # fmt: skip
        "policy": policy,
        "replay": {"sigma": sigma, "failure_rate": failure_rate},
        "batch": batch,
        "services": runs["with"]["services"],
        "targets": TARGETS,
        "reduction_target_met": (served.get("reduction_pct") or 0) >= TARGETS["reduction_pct"],
        "slo_target_met": (served.get("slo_attainment_pct") or 0) >= TARGETS["slo_attainment_pct"],
        "deadlines_no_worse": met["with"] is not None and met["without"] is not None and met["with"] >= met["without"],
        "loop": {name: {k: r[k] for k in ("hours", "jobs_not_ended", "seconds")} for name, r in runs.items()},
    }


def cmd_services_loop(args: argparse.Namespace) -> int:
    say = (lambda msg: None) if args.no_progress else (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    try:
        serving = ServingPolicy(yield_to_batch=not args.no_yield_to_batch, hold_hours=args.hold_hours or None)
        doc = services_loop(args.start, args.days, args.jobs, args.load, args.services, args.policy, args.sigma,
                            args.failure_rate, args.db, progress=say, keep=args.keep, serving=serving)  # fmt: skip
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_jsonable(doc), sort_keys=True))
        return 0
    print(
        f"{doc['days']} days from {doc['start']}, {doc['jobs_per_day']} jobs a day, fleet {doc['fleet']['gpus']} GPUs"
    )
    print(tabulate([{"loop": k, **v} for k, v in doc["batch"].items()], headers="keys", floatfmt=".2f"))
    print("\nservices (against static provisioning for the peak in the home region)")
    print(tabulate(service_rows(doc["services"]), headers="keys", floatfmt=".4f"))
    print(f"\nreduction ≥ {TARGETS['reduction_pct']:g} %: {doc['reduction_target_met']}; latency target ≥ "
          f"{TARGETS['slo_attainment_pct']:g} %: {doc['slo_target_met']}; deadlines no worse: "
          f"{doc['deadlines_no_worse']}")  # fmt: skip
    return 0
