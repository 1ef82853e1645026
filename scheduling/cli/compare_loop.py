"""`python -m scheduling compare-loop`: the operating loop on the replay executor against the simulator, on the same
jobs, like for like.

    python -m scheduling compare-loop --day 2021-07-15 --jobs 320 --json

On a temporary copy of the warehouse (its queue, executor and plan state dropped; never written), a day of trace
jobs goes through the intake and the loop runs hour by hour from that day's midnight until every job has ended (at
most --max-hours) on a replay executor with exact run times (sigma 0) and no failures, planning with no deadline
reserve and no power-limit changes of running jobs: what the simulator assumes. The ledger marts are built on the
copy, and the simulator replays the same jobs with the same speeds (the plans' registered predictor) and the stored
forecasts. Both are valued against the ledger's run-now counterfactual over the jobs the loop finished. The target:
savings within 1 percentage point.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from common.jsonutil import to_jsonable
from common.timeutil import HOUR, utc
from scheduling import loop
from scheduling.cli.bench_loop import copy_warehouse
from scheduling.evaluation.same_jobs import simulate_same_jobs
from scheduling.executors.replay import ReplayExecutor
from scheduling.output.ledger import ledger
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from scheduling.planning.recap import Recapping
from scheduling.queue import store
from scheduling.queue.intake import submit_mappings
from scheduling.queue.trace import trace_jobs
from scheduling.service import plan_fleet, plan_speed_model
from scheduling.tasks import build_ledger
from warehouse.config import warehouse_path
from warehouse.db import reader, table_exists

TARGET_PP = 1.0
OPEN_STATES = ("queued", "planned", "dispatched", "running")
FORECASTS = "forecast.forecasts"


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "compare-loop",
        help="the loop on the replay executor against the simulator, same jobs, exact run times",
        description="Run the operating loop on a temporary copy of the warehouse until a day of trace jobs has "
        "ended (replay executor without noise or failures, no deadline reserve), build the ledger, and compare its "
        "saving against run-now with the simulator's on the same jobs.",
    )
    c.add_argument("--day", default="2021-07-15", help="the jobs' arrival day (UTC, default 2021-07-15)")
    c.add_argument("--jobs", type=int, default=320)
    c.add_argument("--policy", default=DEFAULT_POLICY, choices=list(POLICY_NAMES))
    c.add_argument("--max-hours", type=int, default=240, help="loop hours at most (default 240)")
    c.add_argument("--db", default=None, help="warehouse to copy (default WAREHOUSE_PATH); never written")
    c.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    c.add_argument("--keep", default=None, help="work in this (new or empty) directory and keep the warehouse copy")
    c.set_defaults(func=cmd_compare_loop)


def open_jobs(db: Path) -> int:
    jobs = store.list_jobs(db_path=db)
    return int(jobs["state"].isin(OPEN_STATES).sum()) if len(jobs) else 0


def _has_forecasts(db: Path) -> bool:
    with reader(db) as con:
        return table_exists(con, FORECASTS) and con.execute(f"SELECT count(*) FROM {FORECASTS}").fetchone()[0] > 0


@contextmanager
def _workdir(keep):
    """A temporary directory, or `keep` (created; it must be empty) when given."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="compare-loop-") as tmp:
            yield tmp
        return
    path = Path(keep)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise ValueError(f"--keep {path}: not empty")
    yield str(path)


def compare_loop(
    day="2021-07-15",
    n_jobs: int = 320,
    policy: str = DEFAULT_POLICY,
    max_hours: int = 240,
    db=None,
    data_dir=None,
    keep=None,
):
    """The comparison's JSON document (see the module doc). `keep`: a directory to work in instead of a temporary
    one, left with the warehouse copy and the schedules for inspection."""
    day = utc(day).floor("D")
    source = Path(db) if db else warehouse_path()
    t0 = time.perf_counter()
    with _workdir(keep) as tmp:
        copy = Path(tmp) / "warehouse.duckdb"
        if not copy_warehouse(source, copy):
            raise ValueError(f"no warehouse at {source}: run `make run` (or ingest + transform) first")
        fleet = plan_fleet(None, data_dir)
        mappings = trace_jobs(day, n_jobs, fleet, data_dir=data_dir)
        submit_mappings(
            mappings, source="compare-loop", as_of=day + pd.Timedelta(days=1), db_path=copy, data_dir=data_dir
        )
        executor = ReplayExecutor(db_path=copy, sigma=0.0, failure_rate=0.0)
        settings = {
            "policy": policy,
            "deadline_reserve": 0.0,
            "db_path": copy,
            "data_dir": data_dir,
            "fleet": fleet,
            "executors": dict.fromkeys(fleet.names, executor),
            "schedule_root": Path(tmp) / "schedules",
            # the simulator runs every job at the limit it starts with: so does the loop here
            "recapping": Recapping(enabled=False),
        }
        hours = 0
        while hours < max_hours and (hours < 24 or open_jobs(copy)):
            loop.run_hour(day + hours * HOUR, **settings)
            hours += 1
        left = open_jobs(copy)
        loop_s = time.perf_counter() - t0
        build_ledger(db_path=copy)
        book = ledger(day, day + pd.Timedelta(days=1), db_path=copy)
        finished = book.jobs.loc[book.jobs["outcome"] == "finished", "job_id"]
        job_types = pd.DataFrame({"job_type": [m["job_type"] for m in mappings]})
        speeds, _ = plan_speed_model(job_types, day, db_path=copy, data_dir=data_dir, fleet=fleet)
        # the loop plans on forecast.forecasts, or on the seasonal naive where there are none: so does the simulator
        kind = "warehouse" if _has_forecasts(copy) else "naive"
        simulated = simulate_same_jobs(
            day, n_jobs, fleet, [policy], finished, speed_model=speeds, forecasts=kind, db_path=copy, data_dir=data_dir
        )[0]
    totals = book.totals
    gap = None if totals.get("saving_pct") is None else round(totals["saving_pct"] - simulated["saving_pct"], 2)
    return {
        "benchmark": "compare-loop",
        "day": day.date().isoformat(),
        "policy": policy,
        "jobs_submitted": len(mappings),
        "loop_hours": hours,
        "jobs_not_ended": left,
        "loop": {k: totals.get(k) for k in ("jobs", "finished", "failed", "deadlines_met_pct")}
        | {
            "realized_kgco2e": round(totals["realized_kgco2e"], 3),
            "run_now_kgco2e": round(totals["counterfactual_kgco2e"], 3),
            "saving_pct": totals["saving_pct"],
        },
        "simulator": simulated,
        "forecasts": kind,
        "saving_gap_pp": gap,
        "target_pp": TARGET_PP,
        "target_met": gap is not None and abs(gap) <= TARGET_PP,
        "seconds": {"loop": round(loop_s, 1), "total": round(time.perf_counter() - t0, 1)},
    }


def cmd_compare_loop(args: argparse.Namespace) -> int:
    try:
        doc = compare_loop(args.day, args.jobs, args.policy, args.max_hours, args.db, keep=args.keep)
    except ValueError as exc:
        print(f"compare-loop: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_jsonable(doc), sort_keys=True))
        return 0
    rows = [{"side": "loop (replay, exact run times)", **doc["loop"]}, {"side": "simulator", **doc["simulator"]}]
    print(tabulate(rows, headers="keys", floatfmt=".3f"))
    print(
        f"\nsaving gap {doc['saving_gap_pp']} pp (target ±{TARGET_PP}); {doc['loop_hours']} loop hours, "
        f"{doc['jobs_not_ended']} jobs not ended"
    )
    return 0
