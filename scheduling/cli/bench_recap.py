"""`python -m scheduling bench-recap`: what hourly power limits of running jobs save, against the maximum limit and
against a limit chosen once at dispatch, on the same trace jobs.

    python -m scheduling bench-recap --day 2021-07-15 --jobs 160 --json

On temporary copies of the warehouse (never written), a day of trace jobs goes through the intake and the loop runs
until every job has ended, on a replay executor with run-time spread `--sigma` and no failures, twice: with the
limits chosen at dispatch only (`Recapping(enabled=False)`) and with hourly re-capping (the default). For every
finished run, its carbon as run (each stretch at its limit's draw, at the actual intensity of its zone) is set
against the same run at the maximum limit from the same start on the same cluster: the same work, at the maximum
limit's speed and draw (the power model's). Reported per mode: kgCO2e as run and at the maximum limit, the
reduction, and how much longer the runs took (sum of run hours against the sum at the maximum limit), beside
Chase's published figure (-13.6 % carbon for +2.5 % run time). Data transfers are left out (equal in both).
Beside them, the frontier (`scheduling.evaluation.recap_frontier`): the least carbon any hourly limit schedule of
the hourly mode's runs could emit at Chase's +2.5 %, knowing the actual intensity, with the 2.5 % over all runs
together or for every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from tabulate import tabulate

from common.jsonutil import to_jsonable
from common.timeutil import HOUR, utc
from scheduling import loop
from scheduling.cli.bench_loop import copy_warehouse
from scheduling.cli.compare_loop import OPEN_STATES
from scheduling.domain.execution import Segment, work_done_h
from scheduling.evaluation.recap_frontier import FrontierRun, frontier_kg
from scheduling.executors.replay import ReplayExecutor
from scheduling.planning.forecasts import GridSeries
from scheduling.planning.power_choice import window_intensity_integral
from scheduling.planning.power_options import load_power_table, option_arrays
from scheduling.planning.recap import Recapping
from scheduling.queue import store
from scheduling.queue.intake import submit_mappings
from scheduling.queue.trace import trace_jobs
from scheduling.service import plan_fleet
from warehouse.config import warehouse_path

CHASE = {"carbon_pct": -13.6, "runtime_pct": 2.5}
MODES = {"dispatch-only": Recapping(enabled=False), "hourly": Recapping()}


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "bench-recap",
        help="hourly power limits of running jobs against the maximum limit and a limit chosen at dispatch",
        description="Run the loop on copies of the warehouse with limits chosen at dispatch only and with hourly "
        "re-capping; value every finished run as run and at the maximum limit from the same start.",
    )
    c.add_argument("--day", default="2021-07-15", help="the jobs' arrival day (UTC, default 2021-07-15)")
    c.add_argument("--jobs", type=int, default=160)
    c.add_argument("--sigma", type=float, default=0.15, help="replay run-time spread (default 0.15)")
    c.add_argument("--max-hours", type=int, default=120, help="loop hours at most per mode (default 120)")
    c.add_argument("--db", default=None, help="warehouse to copy (default WAREHOUSE_PATH); never written")
    c.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    c.set_defaults(func=cmd_bench_recap)


def _open_jobs(db: Path) -> int:
    jobs = store.list_jobs(db_path=db)
    return int(jobs["state"].isin(OPEN_STATES).sum()) if len(jobs) else 0


def value_runs(db: Path, executor: ReplayExecutor, fleet, day) -> pd.DataFrame:
    """One row per finished run: its kgCO2e and hours as run (stretches at their limits), and at the maximum limit
    from the same start (the same work at the maximum limit's speed and draw), at the actual intensity."""
    runs = executor.runs()
    runs = runs[(runs["outcome"] == "finished") & runs["cancelled_at"].isna()].reset_index(drop=True)
    changes = executor.changes()
    with duckdb.connect(str(db), read_only=True) as con:
        plans = con.execute("SELECT plan_id, job_id, draw_kw, gpu_model FROM plan.assignments").df()
        logged = con.execute("SELECT plan_id, job_id, draw_kw FROM plan.power_changes").df() if len(changes) else None
    plans = plans.set_index(["plan_id", "job_id"])
    draws = {} if logged is None else dict(zip(zip(logged["plan_id"], logged["job_id"]), logged["draw_kw"]))
    tf, pw, lw = option_arrays(fleet, load_power_table(fleet, db_path=db, as_of=day), power_aware=True)
    cluster = {n: i for i, n in enumerate(fleet.names)}
    end = runs["true_end"].max() + 2 * HOUR
    grid = GridSeries.load(fleet.zones, day, end, source="auto", db_path=db)
    ci = grid.window(day, int(np.ceil((end - day) / HOUR)))
    zone = {z: i for i, z in enumerate(fleet.zones)}
    rows = []
    for run in runs.to_dict(orient="records"):
        c = cluster[run["cluster"]]
        series = ci[:, zone[fleet.cluster_zones[c]]]
        mine = changes[(changes["plan_id"] == run["plan_id"]) & (changes["job_id"] == run["job_id"])]
        mine = mine.sort_values("changed_at")
        stretches = [(run["start_time"], float(plans.loc[(run["plan_id"], run["job_id"]), "draw_kw"]))]
        stretches += [(t, float(draws[(p, run["job_id"])])) for t, p in zip(mine["changed_at"], mine["change_plan_id"])]
        ends = [t for t, _ in stretches[1:]] + [run["true_end"]]
        kg = sum(kw * _integral(series, day, a, b) for (a, kw), b in zip(stretches, ends)) / 1000.0
        # the same work at the maximum limit: the dispatch limit's hours over its time factor
        k = int(np.argmin(np.abs(np.nan_to_num(lw[:, c], nan=1e9) - run["power_limit_w"])))
        segments = [
            Segment(run["start_time"], 1.0),
            *(Segment(t, f) for t, f in zip(mine["changed_at"], mine["time_factor"])),
        ]
        hours_at_dispatch = work_done_h(segments, run["true_end"])
        max_h = hours_at_dispatch / tf[k, c]
        share = float(run["gpu_count"]) * float(run["gpu_milli"]) / 1000.0
        kw_max = share * pw[0, c] / 1000.0 * float(fleet.pue[c])
        kg_max = (
            kw_max * _integral(series, day, run["start_time"], run["start_time"] + pd.Timedelta(hours=max_h)) / 1000
        )
        rows.append(
            {
                "job_id": run["job_id"],
                "cluster": run["cluster"],
                "start_h": (utc(run["start_time"]) - day) / HOUR,
                "gpu_share": share,
                "kgco2e": kg,
                "kgco2e_max_limit": kg_max,
                "hours": (run["true_end"] - run["start_time"]) / HOUR,
                "hours_max_limit": max_h,
                "changes": int(len(mine)),
            }
        )
    return pd.DataFrame(rows)


def frontier_pct(valued: pd.DataFrame, fleet, table, db: Path, day, runtime_budget: float, curve: bool,
                 per_run: bool = False) -> float:  # fmt: skip
    """How much less carbon than at the maximum limit the best hourly limit schedule of these runs emits with
    their run time at most `runtime_budget` longer (all together, or `per_run` each), knowing the actual
    intensity (`recap_frontier`): over every settable limit of each GPU's curve (`curve`) or the planner's."""
    end = day + pd.Timedelta(hours=float((valued["start_h"] + 2 * valued["hours_max_limit"]).max()) + 2)
    grid = GridSeries.load(fleet.zones, day, end, source="auto", db_path=db)
    ci = grid.window(day, int(np.ceil((end - day) / HOUR)))
    zone = {z: i for i, z in enumerate(fleet.zones)}
    index = {n: i for i, n in enumerate(fleet.names)}
    runs = []
    for row in valued.itertuples(index=False):
        c = index[row.cluster]
        model = fleet.clusters[c].config.gpu_model
        options = table.curve_options(model) if curve else table.options(model)
        kw = [row.gpu_share * o.power_w / 1000.0 * float(fleet.pue[c]) for o in options]
        runs.append(
            FrontierRun(
                start_h=float(row.start_h),
                work_h=float(row.hours_max_limit),
                time_factors=tuple(o.time_factor for o in options),
                draws_kw=tuple(kw),
                intensity=ci[:, zone[fleet.cluster_zones[c]]],
            )
        )
    return 100.0 * (frontier_kg(runs, runtime_budget, per_run) / float(valued["kgco2e_max_limit"].sum()) - 1.0)


def _integral(series: np.ndarray, origin, a, b) -> float:
    """∫ intensity dt over [a, b] in (g/kWh)·h, hourly values from `origin`."""
    start = (utc(a) - origin) / HOUR
    return float(window_intensity_integral(series, start, max((utc(b) - utc(a)) / HOUR, 0.0)))


def run_mode(source: Path, workdir: Path, day, mappings, fleet, recapping, sigma, max_hours):
    """(the mode's figures, its valued runs)."""
    copy = workdir / "warehouse.duckdb"
    copy_warehouse(source, copy)
    submit_mappings(mappings, source="bench-recap", as_of=day + pd.Timedelta(days=1), db_path=copy)
    executor = ReplayExecutor(db_path=copy, sigma=sigma, failure_rate=0.0)
    settings = {"db_path": copy, "fleet": fleet, "executors": dict.fromkeys(fleet.names, executor),
                "schedule_root": workdir / "schedules", "recapping": recapping}  # fmt: skip
    t0, hours = time.perf_counter(), 0
    while hours < max_hours and (hours < 24 or _open_jobs(copy)):
        loop.run_hour(day + hours * HOUR, **settings)
        hours += 1
    valued = value_runs(copy, executor, fleet, day)
    kg, kg_max = valued["kgco2e"].sum(), valued["kgco2e_max_limit"].sum()
    h, h_max = valued["hours"].sum(), valued["hours_max_limit"].sum()
    with duckdb.connect(str(copy), read_only=True) as con:
        late = con.execute(
            "SELECT count(*) FILTER (WHERE q.state = 'finished' AND q.state_changed_at > q.deadline), count(*) "
            f"FROM {store.JOBS} AS q"
        ).fetchone()
    return {
        "runs": int(len(valued)),
        "runs_changed": int((valued["changes"] > 0).sum()),
        "kgco2e": round(float(kg), 3),
        "kgco2e_max_limit": round(float(kg_max), 3),
        "carbon_pct": round(100.0 * (kg / kg_max - 1.0), 2) if kg_max else None,
        "runtime_pct": round(100.0 * (h / h_max - 1.0), 2) if h_max else None,
        "finished_late": int(late[0]),
        "jobs": int(late[1]),
        "loop_hours": hours,
        "seconds": round(time.perf_counter() - t0, 1),
    }, valued


def bench_recap(day="2021-07-15", n_jobs=160, sigma=0.15, max_hours=120, db=None) -> dict:
    day = utc(day).floor("D")
    source = Path(db) if db else warehouse_path()
    if not source.exists():
        raise ValueError(f"no warehouse at {source}: run `make run` first")
    fleet = plan_fleet(None, None)
    mappings = trace_jobs(day, n_jobs, fleet)
    modes = {}
    for name, recapping in MODES.items():
        with tempfile.TemporaryDirectory(prefix=f"bench-recap-{name}-") as tmp:
            modes[name], valued = run_mode(source, Path(tmp), day, mappings, fleet, recapping, sigma, max_hours)
    hourly, once = modes["hourly"], modes["dispatch-only"]
    table = load_power_table(fleet, db_path=source, as_of=day)
    budget = CHASE["runtime_pct"] / 100.0
    frontier = {  # on the hourly runs (their starts and clusters), at Chase's run-time budget
        "runtime_pct": CHASE["runtime_pct"],
        "carbon_pct_curve": round(frontier_pct(valued, fleet, table, source, day, budget, curve=True), 2),
        "carbon_pct_planner_options": round(frontier_pct(valued, fleet, table, source, day, budget, curve=False), 2),
        "carbon_pct_curve_per_run": round(
            frontier_pct(valued, fleet, table, source, day, budget, curve=True, per_run=True), 2
        ),
    }
    return {
        "benchmark": "bench-recap",
        "day": day.date().isoformat(),
        "jobs_submitted": len(mappings),
        "sigma": sigma,
        "modes": modes,
        "chase": CHASE,
        "frontier": frontier,
        "hourly_vs_dispatch_only_pct": round(100.0 * (hourly["kgco2e"] / once["kgco2e"] - 1.0), 2),
        "targets": {
            "carbon_at_least_chase": hourly["carbon_pct"] is not None and hourly["carbon_pct"] <= CHASE["carbon_pct"],
            "runtime_at_most_chase": hourly["runtime_pct"] is not None
            and hourly["runtime_pct"] <= CHASE["runtime_pct"],
            "less_than_dispatch_only": hourly["kgco2e"] < once["kgco2e"],
        },
        "environment": {"cpus": os.cpu_count()},
    }


def cmd_bench_recap(args: argparse.Namespace) -> int:
    try:
        doc = bench_recap(args.day, args.jobs, args.sigma, args.max_hours, args.db)
    except ValueError as exc:
        print(f"bench-recap: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_jsonable(doc), sort_keys=True))
        return 0
    rows = [{"mode": m, **v} for m, v in doc["modes"].items()]
    rows.append({"mode": "Chase (published)", **doc["chase"]})
    print(tabulate(rows, headers="keys", floatfmt=".3f"))
    f = doc["frontier"]
    print(
        f"\nthe best hourly limits at +{f['runtime_pct']} % run time, knowing the actual intensity: "
        f"{f['carbon_pct_curve']} % (every limit of the curves; {f['carbon_pct_planner_options']} % with the "
        f"planner's), {f['carbon_pct_curve_per_run']} % when every run may take only {f['runtime_pct']} % longer"
    )
    print(f"hourly against dispatch-only: {doc['hourly_vs_dispatch_only_pct']} % carbon; targets: {doc['targets']}")
    return 0
