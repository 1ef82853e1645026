"""Commands of the operating loop: one hour (`plan-hourly`), many hours (`loop`), and the carbon ledger (`ledger`).

python -m scheduling plan-hourly --as-of 2021-07-15T12:00Z [--policy rolling-lp] [--dry-run] [--json]
python -m scheduling loop --from 2021-07-15T00:00Z --hours 48 [--json]
python -m scheduling ledger [--from 2021-07-15] [--to 2021-07-17] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tabulate import tabulate

from common.jsonutil import to_jsonable
from scheduling import loop
from scheduling.explain.registry import EXPLAINERS, make_explainer
from scheduling.output.ledger import ledger, service_rows, write_ledger_report
from scheduling.planning.pausing import Pausing
from scheduling.planning.policies.registry import DEFAULT_POLICY
from scheduling.service import DEFAULT_DEADLINE_RESERVE, DEFAULT_HORIZON_H


def _hour_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=DEFAULT_POLICY)
    p.add_argument("--regions", default="", help="comma-separated fleet regions (default: all with grid data)")
    p.add_argument("--horizon-hours", type=int, default=DEFAULT_HORIZON_H)
    p.add_argument(
        "--deadline-reserve",
        type=float,
        default=DEFAULT_DEADLINE_RESERVE,
        help=f"share of a job's run time planned to spare before its deadline (default {DEFAULT_DEADLINE_RESERVE})",
    )
    p.add_argument(
        "--pause-for-carbon",
        action="store_true",
        help="also stop running checkpointing jobs through dirty stretches (scheduling/planning/pausing.py); off: only "
        "jobs on drained nodes move",
    )
    p.add_argument(
        "--preempt-for-deadlines",
        action="store_true",
        help="also stop a running checkpointing job to start a job due now, where the stopped job still keeps its "
        "deadline (scheduling/planning/pausing.py)",
    )
    p.add_argument("--schedule-root", default=None, help="default: SCHEDULES_DIR or var/schedules")
    p.add_argument("--explainer", default=None, choices=list(EXPLAINERS.names))
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def register(subparsers) -> None:
    h = subparsers.add_parser(
        "plan-hourly",
        help="one hour of the operating loop: sync the executors, plan the queued jobs, dispatch what starts",
        description="What the plan_hourly DAG runs, from the command line, for the planning hour --as-of: the "
        "executors' events of the hour before, the queued jobs planned with the forecasts and registered models "
        "known then, the jobs that start now dispatched to their clusters' executors.",
    )
    h.add_argument("--as-of", required=True, help="planning time, ISO (e.g. 2021-07-15T12:00Z)")
    h.add_argument("--dry-run", action="store_true", help="plan only: write plan.explanations, dispatch nothing")
    _hour_options(h)
    h.set_defaults(func=cmd_plan_hourly)

    lp = subparsers.add_parser(
        "loop",
        help="run the operating loop for consecutive hours (sync -> plan -> dispatch each hour)",
        description="plan-hourly for --hours hours from --from, one line per hour.",
    )
    lp.add_argument("--from", dest="start", required=True, help="first planning hour (UTC)")
    lp.add_argument("--hours", type=int, required=True)
    _hour_options(lp)
    lp.set_defaults(func=cmd_loop)

    p = subparsers.add_parser(
        "ledger",
        help="realized kgCO2e against the run-now counterfactual (from marts.carbon_ledger)",
        description="Sum the carbon ledger of the jobs submitted in [--from, --to): realized and run-now kgCO2e, the "
        "saving, deadlines met, then per tenant, region and day; write the HTML ledger with its charts.",
    )
    p.add_argument("--from", dest="start", default=None, help="first submission day (UTC), inclusive")
    p.add_argument("--to", dest="end", default=None, help="end of the period (UTC), exclusive")
    p.add_argument("--out", default=None, help="report folder (default var/reports/ledger/<period>)")
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=cmd_ledger)


def _settings(args: argparse.Namespace) -> dict:
    return {
        "policy": args.policy,
        "regions": [r for r in args.regions.split(",") if r] or None,
        "horizon_hours": args.horizon_hours,
        "deadline_reserve": args.deadline_reserve,
        "pausing": Pausing(for_carbon=args.pause_for_carbon, for_deadline=args.preempt_for_deadlines),
        "schedule_root": args.schedule_root,
        "explainer": make_explainer(args.explainer),
        "db_path": args.db,
    }


def _line(result: loop.HourResult) -> dict:
    return {
        "hour": result.as_dict()["plan_time"],
        "events": result.sync.get("events", 0),
        "finished": result.sync.get("entered", {}).get("finished", 0),
        "failed": result.sync.get("entered", {}).get("failed", 0),
        "retried": result.sync.get("entered", {}).get("queued", 0),
        "preempted": result.plan.get("preempted", {}).get("decided", 0),
        "pending": result.plan.get("n_jobs", 0),
        "running": result.plan.get("n_running", 0),
        "dispatched": result.dispatch.get("sent", 0) + result.dispatch.get("reconciled", 0),
        "not_sent": len(result.dispatch.get("failed", {})),
        "planned_kgco2e": result.plan.get("expected_kgco2e", 0.0),
    }


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def cmd_plan_hourly(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        ctx = loop.context(args.as_of, **_settings(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        _, summary, _ = loop.plan(ctx, dry_run=True, created_from="cli")
        out = {"plan_time": summary["plan_time"], "plan": summary}
    else:
        result = loop.HourResult(ctx.plan_time)
        result.sync = loop.sync(ctx)
        plan, result.plan, pending = loop.plan(ctx, created_from="cli")
        result.dispatch = loop.dispatch_plan(ctx, plan, pending)
        out = result.as_dict()
    if args.json:
        print(json.dumps(to_jsonable(out), sort_keys=True))
    else:
        for step in ("sync", "plan", "dispatch"):
            if step in out:
                print(f"{step}: " + ", ".join(f"{k}={v}" for k, v in sorted(out[step].items())))
    return 0


def cmd_loop(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        loop.context(args.start, **_settings(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lines = []
    widths = {"hour": 20, "planned_kgco2e": 14}

    def progress(result: loop.HourResult) -> None:
        lines.append(_line(result))
        if args.json:
            return
        if len(lines) == 1:
            print("  ".join(f"{k:>{widths.get(k, len(k))}}" for k in lines[0]), flush=True)
        print("  ".join(f"{_cell(v):>{widths.get(k, len(k))}}" for k, v in lines[-1].items()), flush=True)

    results = loop.run_hours(args.start, args.hours, progress=progress, **_settings(args))
    if args.json:
        print(json.dumps(to_jsonable([r.as_dict() for r in results]), sort_keys=True))
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    book = ledger(args.start, args.end, db_path=args.db)
    index = write_ledger_report(book, args.out)
    if args.json:
        print(json.dumps(to_jsonable({**book.to_dict(), "report": str(index)}), indent=2))
        return 0
    print(tabulate([book.totals], headers="keys", floatfmt=".3f"))
    for key, frame in book.rollups.items():
        print(f"\nper {key}")
        print(tabulate(frame, headers="keys", showindex=False, floatfmt=".3f"))
    if book.services:
        print("\ninference services (against static provisioning for the peak in the home region)")
        print(tabulate(service_rows(book.services), headers="keys", floatfmt=".4f"))
    print(f"\nledger: {index}")
    return 0
