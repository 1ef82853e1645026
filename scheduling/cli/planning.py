"""Commands `evaluate`, `bench-plan` and `plan` (the carbon-aware placement planner).

    python -m scheduling evaluate --jobs 1000 --regions 6 --start 2021-07-01 --days 14 --json
    python -m scheduling evaluate --start 2021-07-01 2021-12-01 --load 0.5 0.8 --ablations \\
        --report-md var/reports/planner/results.md          # the results table (periods x loads x policies)
    python -m scheduling bench-plan --jobs 1000 --hours 168 --regions 10 --json
    python -m scheduling plan --as-of 2021-07-15T12:00Z --jobs 200 --json

With --json only one JSON document is printed on stdout; the progress bar goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc, utc_hour
from scheduling.domain.fleet import load_fleet
from scheduling.domain.jobs import generate_jobs
from scheduling.evaluation.bounds import replay_optimum, solve_optimum, solve_preemptive_optimum
from scheduling.evaluation.exact_report import exact_instances, exact_summary
from scheduling.evaluation.load import DEFAULT_LOAD_BASIS, LOAD_BASES
from scheduling.evaluation.report import chart_over_runs
from scheduling.evaluation.results import environment, evaluate, fmt, json_ready, over_seeds, report_markdown, targets
from scheduling.evaluation.scenario import build_scenario
from scheduling.evaluation.simulator import simulate
from scheduling.planning.forecasts import GridSeries, make_forecasts
from scheduling.planning.policies.registry import DEFAULT_POLICY, ONLINE_POLICIES
from scheduling.planning.problem import JobTable
from scheduling.planning.session import HourlyPlanner, plan_hour

DEFAULT_REPORT_DIR = Path("var") / "reports" / "planner"


def register(subparsers) -> None:
    e = subparsers.add_parser(
        "evaluate",
        help="simulate every placement policy and the LP bound over a grid period",
        description="Replay a job trace hour by hour over historical grid data with every "
        "placement policy (plans from the forecasts known each hour, carbon from "
        "the actual intensity) and the offline LP bound.",
    )
    e.add_argument("--jobs", type=int, default=1000)
    e.add_argument("--regions", type=int, default=6, help="the first N regions of the fleet (default 6)")
    e.add_argument("--start", nargs="+", default=["2021-07-01"], help="period start(s), UTC")
    e.add_argument("--days", type=float, default=14)
    e.add_argument(
        "--load",
        nargs="+",
        type=float,
        default=[0.5],
        help="target average GPU utilisation(s) under performance-first (the fleet is sized to it)",
    )
    e.add_argument(
        "--seed",
        type=int,
        nargs="+",
        default=[0],
        help="trace seed(s); several: every period and load per seed, and the results over the seeds "
        "(mean and range; one run moves by 2-3 points of share with the trace)",
    )
    e.add_argument("--forecasts", default="auto", choices=["auto", "warehouse", "dacf", "naive", "oracle"])
    e.add_argument("--forecast-model", default=None, help="model name in forecast.forecasts (default: best present)")
    e.add_argument(
        "--forecast-version",
        default="backtest",
        help="model_version in forecast.forecasts (default backtest: the stored backtest -- versions "
        "backtest-*, from `python -m forecasting backtest --store` -- with the most issues in the "
        "period, else every version; 'all': every version, the latest issue wins; or a label)",
    )
    e.add_argument(
        "--policies",
        default="all",
        help="comma list or all (priority, priority-noprices, "
        "performance-first, greedy-carbon, carbon-time, round-robin, "
        "random)",
    )
    e.add_argument("--no-optimum", action="store_true", help="skip the LP bound")
    e.add_argument(
        "--ablations",
        action="store_true",
        help="also run priority without capacity prices, priority and rolling-lp with oracle / naive "
        "forecasts, and rolling-lp with perfect information (oracle forecasts, true next arrivals)",
    )
    e.add_argument("--lp-time-limit", type=float, default=900.0)
    e.add_argument(
        "--exact",
        action="store_true",
        help="also the node-aware optimum (whole jobs on real nodes, MILP) and each policy's share of its reduction",
    )
    e.add_argument("--exact-time-limit", type=float, default=600.0, help="seconds for the node-aware MILP")
    e.add_argument(
        "--exact-json",
        default=None,
        help="write each instance's and policy's share of the node-aware optimum's reduction, the deadline "
        "satisfaction and the summary over the instances there (JSON; runs with --exact)",
    )
    e.add_argument("--pods", default="default", help="openb pod list variant (default, gpuspec10, ...)")
    e.add_argument("--max-duration-h", type=float, default=48.0)
    e.add_argument(
        "--postpone-margin-h",
        type=float,
        default=1.0,
        help="a job may be postponed only to a start leaving this many hours before its latest timely "
        "start (default 1)",
    )
    e.add_argument(
        "--calibrate",
        type=int,
        default=2,
        help="re-size the fleet up to N times so that the GPU-hours performance-first runs the jobs with "
        "are --load of the fleet's (0: size on the fleet-weighted estimate only)",
    )
    e.add_argument(
        "--load-basis",
        default=DEFAULT_LOAD_BASIS,
        choices=sorted(LOAD_BASES),
        help="how a shared-GPU job counts in --load: the GPU-milli it asks for (gpu-milli, default) or the share of "
        "a device it holds when jobs of its size share the device (device-share)",
    )
    e.add_argument("--fleet", default=None, help="fleet YAML (default scheduling/domain/fleet.yaml)")
    e.add_argument("--data-dir", default=None)
    e.add_argument("--grid-source", default="auto", choices=["auto", "warehouse", "files"])
    e.add_argument("--json", action="store_true", help="print the report as JSON (only JSON on stdout)")
    e.add_argument(
        "--out",
        default=None,
        help="also write the JSON report there (default var/reports/planner/evaluate_<start>_<load>.json per run)",
    )
    e.add_argument("--report-md", default=None, help="write the results table (markdown) there")
    e.add_argument(
        "--report-plot",
        default=None,
        help="write a PNG there: share of the optimum's reduction and deadlines per policy, period and "
        "load (mean over seeds, min-max whiskers, the targets as lines)",
    )
    e.add_argument("--no-progress", action="store_true")
    e.add_argument(
        "--from-json",
        nargs="+",
        default=None,
        help="do not simulate: rebuild --report-md (and --json output) from saved evaluate JSON file(s)",
    )
    e.set_defaults(func=cmd_evaluate)

    b = subparsers.add_parser(
        "bench-plan",
        help="latency and peak memory of one hourly plan (JSON)",
        description="Time one plan of N pending jobs over H hours and R regions (coordinator, "
        "agents packing with FGD, tentative nodes, explanations, Plan frame); "
        "also for --also jobs. Prints JSON with CPU count and versions.",
    )
    b.add_argument("--jobs", type=int, default=1000)
    b.add_argument("--also", type=int, nargs="*", default=[5000], help="further job counts (default 5000)")
    b.add_argument("--hours", type=int, default=168)
    b.add_argument("--regions", type=int, default=10)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--policy", default=DEFAULT_POLICY, help=f"placement policy to time (default {DEFAULT_POLICY})")
    b.add_argument(
        "--recent",
        type=int,
        default=0,
        help="also this many jobs that arrived over the 18 h before the plan and were dispatched already "
        "(history: rolling-lp plans them again as expected arrivals)",
    )
    b.add_argument("--plan-time", default="2021-07-05T00:00Z")
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--json", action="store_true", help="(output is always JSON)")
    b.add_argument(
        "--out",
        default=None,
        help="also write bench_plan_<policy>.json there (default var/reports/planner)",
    )
    b.add_argument("--data-dir", default=None)
    b.set_defaults(func=cmd_bench)

    p = subparsers.add_parser(
        "plan",
        help="one hourly plan for a synthetic pending queue (JSON summary)",
        description="Plan a queue of --jobs trace jobs submitted at --as-of with one "
        "policy on an empty fleet; prints the plan summary (and with --full "
        "the whole plan) as JSON.",
    )
    p.add_argument("--as-of", required=True, help="plan time, UTC (never the wall clock)")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--regions", type=int, default=6)
    p.add_argument("--policy", default="rolling-lp")
    p.add_argument("--forecasts", default="auto", choices=["auto", "warehouse", "dacf", "naive", "oracle"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full", action="store_true", help="print the whole plan (assignments, explanations)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_plan)

    r = _scenario_parser(
        subparsers,
        "replay-optimum",
        "the optimum's schedule executed through the cluster agents (what node packing costs the bound; JSON)",
    )
    r.add_argument("--integral", action="store_true", help="replay the whole-job MILP's schedule (time-limited)")
    r.set_defaults(func=cmd_replay)

    b = _scenario_parser(
        subparsers,
        "preemption-bound",
        "the bound if checkpointing jobs could be preempted, beside "
        "the non-preemptive bound, and each policy's share against both (JSON)",
    )
    b.add_argument(
        "--evaluation",
        default=None,
        help="an `evaluate` JSON: the policies' carbon from its run of the same start and load, instead "
        "of simulating them",
    )
    b.add_argument(
        "--policies",
        default="rolling-lp",
        help="policies to simulate when --evaluation is not given (performance-first always is)",
    )
    b.set_defaults(func=cmd_preemption_bound)


def _scenario_parser(subparsers, name: str, help_text: str):
    """A sub-command on one evaluation scenario (the `evaluate` defaults of the reported runs) and an LP limit."""
    parser = subparsers.add_parser(name, help=help_text)
    parser.add_argument("--start", default="2021-07-01")
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--regions", type=int, default=6)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=900.0)
    parser.add_argument("--data-dir", default=None)
    return parser


def _policies(arg: str) -> list[str]:
    if arg in ("all", ""):
        return list(ONLINE_POLICIES)
    return [p.strip() for p in arg.split(",") if p.strip()]


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)


def cmd_evaluate(args: argparse.Namespace) -> int:
    runs = []
    for path in args.from_json or []:
        try:
            saved = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"evaluate --from-json: cannot read {path}: {exc}") from exc
        runs += saved["runs"] if "runs" in saved else [saved]
    if args.from_json:
        # one order whatever the files' order: seed, period, load
        runs.sort(key=lambda r: (int(r["config"].get("seed", 0)), r["config"]["start"], r["config"]["load_target"]))

        for rep in runs:
            rep["targets"] = targets(rep["policies"], rep.get("optimum"))
    seeds = list(dict.fromkeys(args.seed))
    cases = (
        [] if args.from_json else [(seed, start, load) for seed in seeds for start in args.start for load in args.load]
    )
    for seed, start, load in cases:
        t0 = time.perf_counter()
        if not args.no_progress:
            print(f"[evaluate] {start} load {load} seed {seed}: building the scenario", file=sys.stderr)
        sc = build_scenario(
            start=start,
            days=args.days,
            n_jobs=args.jobs,
            regions=args.regions,
            load=load,
            seed=seed,
            forecasts=args.forecasts,
            fleet_path=args.fleet,
            data_dir=args.data_dir,
            pod_list=args.pods,
            max_duration_h=args.max_duration_h,
            grid_source=args.grid_source,
            forecast_model=args.forecast_model,
            forecast_version=None if args.forecast_version == "all" else args.forecast_version,
            calibrate=args.calibrate,
            load_basis=args.load_basis,
        )
        rep = evaluate(
            sc,
            _policies(args.policies),
            with_optimum=not args.no_optimum,
            seed=seed,
            progress=not args.no_progress,
            lp_time_limit_s=args.lp_time_limit,
            ablations=args.ablations,
            postpone_margin_h=args.postpone_margin_h,
            exact=args.exact,
            exact_time_limit_s=args.exact_time_limit,
        )
        rep["runtime_s"] = round(time.perf_counter() - t0, 1)
        runs.append(rep)
        tag = f"{start}_{load}" + (f"_seed{seed}" if len(seeds) > 1 or seed != 0 else "")
        out = (
            Path(args.out)
            if args.out and len(cases) == 1
            else (
                Path(args.out).with_name(f"{Path(args.out).stem}_{tag}.json")
                if args.out
                else DEFAULT_REPORT_DIR / f"evaluate_{tag}.json"
            )
        )
        _write_json(out, rep)
    if args.report_md:
        path = Path(args.report_md)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(report_markdown(runs))
        tmp.replace(path)
    if args.report_plot:
        chart_over_runs(runs, Path(args.report_plot))
    if args.exact_json:
        instances = exact_instances(runs)
        if not instances:
            raise SystemExit("evaluate --exact-json: no run has a node-aware optimum (run with --exact)")
        _write_json(Path(args.exact_json), {"summary": exact_summary(instances), "instances": instances})
    summary = over_seeds(runs)
    payload = runs[0] if len(runs) == 1 else {"runs": runs, **({"over_seeds": summary} if summary else {})}
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        for rep in runs:
            _print_table(rep)
        for row in summary:
            print(
                f"{row['start'][:10]} load {row['load_target']} over seeds {row['seeds']}: {row['policy']:18s} "
                f"share {row['share_mean_pct']:.1f} % ({row['share_min_pct']:.1f}-{row['share_max_pct']:.1f}), "
                f"deadlines {100 * row['deadlines_mean']:.1f} % (min {100 * row['deadlines_min']:.1f})"
            )
    return 0


def _print_table(rep: dict) -> None:
    cfg = rep["config"]
    print(
        f"{cfg['start'][:10]} +{cfg['days']}d load {cfg['load_target']} ({cfg.get('load_basis', 'gpu-milli')}, "
        f"{rep['fleet']['total_gpus']} GPUs) seed {cfg['seed']} forecasts {rep['forecasts']['used']}"
    )
    rows = list(rep["policies"].items()) + ([("optimum", rep["optimum"])] if rep.get("optimum") else [])
    for name, m in rows:
        print(
            f"  {name:18s} {fmt(m['kgco2e'], 1):>9s} kg  red {fmt(m.get('reduction_vs_performance_first_pct')):>6s}%"
            f"  share {fmt(m.get('share_of_optimum_reduction_pct')):>6s}%  deadlines "
            f"{fmt(100 * m['deadline_satisfaction']):>5s}%  regret "
            f"{fmt(None if m.get('deadline_regret') is None else 100 * m['deadline_regret']):>5s}%  "
            f"delay {fmt(m.get('mean_delay_h'), 2)} h"
        )
    if rep.get("optimum_error"):
        print(f"  optimum            not solved: {rep['optimum_error']}")


# ---------------------------------------------------------------------------------------------------- bench
def _reset_peak_rss() -> bool:
    """Reset this process's peak resident set (Linux: VmHWM, by writing 5 to /proc/self/clear_refs), so that the
    peak read after a plan is the plan's. False where that is not possible (no measurement then)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmHWM missing from /proc/self/status")


def _assignments_digest(assignments) -> str:
    """SHA-256 of the plan's assignments in job order: equal digests mean the same plan (a refactor check)."""
    frame = assignments.sort_values("job_id", kind="stable").reset_index(drop=True)
    return hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest()


def _bench_one(
    n_jobs: int,
    hours: int,
    regions: int,
    plan_time,
    seed: int,
    repeats: int,
    data_dir,
    policy: str = DEFAULT_POLICY,
    recent: int = 0,
) -> dict:
    t = pd.Timestamp(plan_time)
    fleet = load_fleet(regions=regions, data_dir=data_dir)
    jobs = generate_jobs(n_jobs, t, 1, fleet, seed=seed, data_dir=data_dir, arrival="all-at-start", max_duration_h=48.0)
    demand = float((jobs["num_gpu"] * jobs["gpu_milli"] / 1000.0 * jobs["duration_h_home"]).sum())
    n_pending = len(jobs)
    if recent:  # jobs that arrived over the 18 h before the plan and were dispatched: history, not pending
        past = generate_jobs(
            recent, t - pd.Timedelta(hours=18), 18, fleet, seed=seed + 1, data_dir=data_dir, max_duration_h=48.0
        )
        past["job_id"] = "recent-" + past["job_id"].astype(str)
        jobs = pd.concat([jobs, past], ignore_index=True)
    grid = GridSeries.load(fleet.zones, t, t + pd.Timedelta(hours=hours + 72), data_dir=data_dir)
    fc = make_forecasts("auto", grid, fleet.zones, start=t, end=t + pd.Timedelta(hours=hours + 72))
    lat, setup, cpu, stats, mem_peak, rss_peak = [], [], [], None, [], []
    summary = {}
    for r in range(repeats + 1):  # the last round runs under tracemalloc (memory only: it slows allocation)
        traced = r == repeats
        gc.collect()
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        table = JobTable(jobs, fleet, data_dir=data_dir)
        hp = HourlyPlanner(
            fleet,
            table=table,
            policy=policy,
            forecasts=fc,
            explain=True,
            tentative=True,
            max_horizon=hours,
            min_horizon=hours,
        )
        hp.started[n_pending:] = True
        rss_reset = not traced and _reset_peak_rss()
        t1 = time.perf_counter()
        c1 = time.process_time()
        plan = hp.plan(t)
        t2 = time.perf_counter()
        c2 = time.process_time()
        if rss_reset:
            rss_peak.append(_peak_rss_mb())
        if traced:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            mem_peak.append(peak)
            continue
        setup.append(t1 - t0)
        lat.append(t2 - t1)
        cpu.append(c2 - c1)
        stats = plan.stats
        summary = plan.summary()
        assignments_sha256 = _assignments_digest(plan.assignments)
    return {
        "jobs": n_pending,
        "recent_arrivals": int(len(jobs) - n_pending),
        "hours": hours,
        "regions": regions,
        "clusters": len(fleet),
        "fleet_gpus": fleet.total_gpus,
        "job_gpu_hours": round(demand, 1),
        "horizon_h": stats.get("horizon_h"),
        "power_options": stats.get("n_options"),
        "plan_latency_s": {
            "min": round(min(lat), 4),
            "median": round(float(np.median(lat)), 4),
            "max": round(max(lat), 4),
        },
        "plan_cpu_s_median": round(float(np.median(cpu)), 4),
        "setup_s_median": round(float(np.median(setup)), 4),
        "plan_plus_setup_s_median": round(float(np.median(np.add(lat, setup))), 4),
        "coordinator_s": stats.get("coordinator_s"),
        "tentative_s": stats.get("tentative_s"),
        # rolling-lp's parts (last timed plan): the LP (candidates, matrix, HiGHS), HiGHS alone, the explanations
        "lp_s": stats.get("lp_s"),
        "lp_solve_s": (stats.get("lp") or {}).get("solve_s"),
        "explain_s": stats.get("explain_s"),
        "tracemalloc_peak_mb": round(max(mem_peak) / 2**20, 1),
        # the whole process (interpreter, libraries, loaded grid data, HiGHS's native memory) at its peak during
        # the plan: the figure the 300 MB target is checked on where Linux lets us reset the peak
        "process_peak_rss_mb": round(max(rss_peak), 1) if rss_peak else None,
        "assigned": summary["n_assigned"],
        "dispatched": summary["n_dispatched"],
        "unplaced": summary["n_unplaced"],
        "agent_rejections": stats.get("agent_rejections"),
        "n_explanations": len(plan.explanations),
        "assignments_sha256": assignments_sha256,
        # targets: 1000 jobs in under 1 s and 300 MB peak; 5000 jobs in under 5 s (no memory target)
        "targets": {"latency_s": 1.0, "peak_mb": 300.0} if n_jobs <= 1000 else {"latency_s": 5.0, "peak_mb": None},
    }


def cmd_bench(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = [
        _bench_one(
            n,
            args.hours,
            args.regions,
            args.plan_time,
            args.seed,
            args.repeats,
            args.data_dir,
            args.policy,
            args.recent,
        )
        for n in [args.jobs] + list(args.also or [])
    ]
    for r in results:
        r["latency_target_met"] = r["plan_latency_s"]["median"] <= r["targets"]["latency_s"]
        peak = r["process_peak_rss_mb"] if r["process_peak_rss_mb"] is not None else r["tracemalloc_peak_mb"]
        limit = r["targets"]["peak_mb"]
        r["memory_target_met"] = None if limit is None else peak <= limit
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    payload = {
        "benchmark": "bench-plan",
        "policy": args.policy,
        "load_average_1min": load1,
        "note": "plan_latency_s is wall time; plan_cpu_s this process's CPU time (the fairer figure on a shared "
        "machine: compare load_average_1min with cpu_count)",
        "what": "one HourlyPlanner.plan(t): problem build, priority, vectorized coordinator over (K, H, C), FGD "
        "agents packing the jobs starting now, tentative nodes for later starts, explanations, Plan frame; "
        "setup = JobTable (durations, power options, hosting) + agents",
        "results": results,
        "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "environment": environment(),
    }
    out = Path(args.out) if args.out else DEFAULT_REPORT_DIR
    name = f"bench_plan_{args.policy}.json"
    _write_json(out / name, payload)
    print(json.dumps(payload, indent=2))
    return 0


# ---------------------------------------------------------------------------------------------------- plan
def cmd_replay(args: argparse.Namespace) -> int:
    sc = build_scenario(
        start=args.start,
        days=args.days,
        n_jobs=args.jobs,
        regions=args.regions,
        load=args.load,
        seed=args.seed,
        data_dir=args.data_dir,
        calibrate=2,
    )
    out = replay_optimum(sc, integral=args.integral, time_limit_s=args.time_limit)
    base = simulate(sc, "performance-first").metrics["kgco2e"]
    out["performance_first_kgco2e"] = base
    out["replay_share_of_optimum_reduction_pct"] = (
        100.0 * (base - out["replay"]["kgco2e"]) / max(base - out["optimum_kgco2e"], 1e-12)
    )
    print(json.dumps(json_ready(out), indent=2))
    return 0


def _matching_run(path: str, sc) -> dict:
    """The policies' metrics of the run of an `evaluate` JSON made on the same scenario (start, load, jobs, seed)."""
    saved = json.loads(Path(path).read_text())
    runs = saved.get("runs", [saved] if "config" in saved else [])
    for run in runs:
        cfg = run["config"]
        if (
            utc(cfg["start"]) == sc.start
            and abs(float(cfg["load_target"]) - float(sc.load)) < 1e-9
            and (cfg["n_jobs"] == len(sc.jobs))
            and int(cfg.get("seed", 0)) == int(sc.config.get("seed", 0))
        ):
            return run["policies"]
    raise SystemExit(
        f"{path}: no run with start {sc.start}, load {sc.load} and {len(sc.jobs)} jobs "
        f"(runs: {[(r['config']['start'], r['config']['load_target']) for r in runs]})"
    )


def cmd_preemption_bound(args: argparse.Namespace) -> int:
    """Both bounds on one scenario, and the share of each bound's reduction every policy captures."""
    sc = build_scenario(
        start=args.start,
        days=args.days,
        n_jobs=args.jobs,
        regions=args.regions,
        load=args.load,
        seed=args.seed,
        data_dir=args.data_dir,
        calibrate=2,
    )
    if args.evaluation:
        kg = {name: m["kgco2e"] for name, m in _matching_run(args.evaluation, sc).items()}
    else:
        kg = {
            name: simulate(sc, name).metrics["kgco2e"]
            for name in dict.fromkeys(["performance-first", *_policies(args.policies)])
        }
    bounds = {
        "optimum": solve_optimum(sc, args.time_limit),
        "optimum_preemptive": solve_preemptive_optimum(sc, args.time_limit),
    }
    base = kg["performance-first"]
    out = {
        "start": str(sc.start),
        "load": sc.load,
        "jobs": len(sc.jobs),
        **bounds,
        "preemption_saves_at_most_kg": bounds["optimum"]["kgco2e"] - bounds["optimum_preemptive"]["kgco2e"],
        "policies": {
            name: {
                "kgco2e": v,
                **{
                    f"share_of_{b}_reduction_pct": 100.0 * (base - v) / max(base - bounds[b]["kgco2e"], 1e-12)
                    for b in bounds
                },
            }
            for name, v in kg.items()
        },
    }
    print(json.dumps(json_ready(out), indent=2))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    t = utc_hour(args.as_of)
    fleet = load_fleet(regions=args.regions, data_dir=args.data_dir)
    jobs = generate_jobs(args.jobs, t, 1, fleet, seed=args.seed, data_dir=args.data_dir, arrival="all-at-start")
    plan = plan_hour(
        t, jobs, fleet=fleet, policy=args.policy, forecasts=args.forecasts, data_dir=args.data_dir, seed=args.seed
    )
    payload = plan.to_dict() if args.full else plan.summary()
    print(json.dumps(payload, indent=2, default=str))
    return 0
