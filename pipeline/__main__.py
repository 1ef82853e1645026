"""`python -m pipeline run`: the main job end to end on the embedded defaults, printing a summary per stage.

ingest (every file source) → transform (dbt build) → forecast train + predict at `--as-of` → train and register the
performance predictor and the power model → operate: a day of trace jobs submitted to the queue, the hourly loop
(sync → plan → dispatch) on the replay executor for `--loop-hours` from that day's midnight, and the carbon ledger
of what ran (realized against run-now).
The planning times are explicit (default a replayable day in 2021), never the wall clock.
"""

from __future__ import annotations

import argparse
import sys
import time

from tabulate import tabulate

from forecasting import service as forecast_service
from forecasting.service import cutoff_from
from pipeline.operate import DEFAULT_DEMO_LOAD, planning_forecast_models, run_demo_loop
from scheduling.executors.replay import DEFAULT_FAILURE_RATE, DEFAULT_SIGMA
from scheduling.output.ledger import service_rows
from scheduling.planning.policies.registry import DEFAULT_POLICY
from scheduling.tasks import train_models
from transforms.runner import build
from warehouse.ingest import ingest, summarize

DEFAULT_AS_OF = "2021-07-15T12:00:00Z"


def _stage(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def _done(started: float) -> None:
    print(f"   ({time.perf_counter() - started:.1f} s)", flush=True)


def run(args: argparse.Namespace) -> int:
    t = _stage("ingest: every file source into raw.* (idempotent; unchanged batches are skipped)")
    print(tabulate(summarize(ingest(None)), headers="keys", intfmt=","))
    _done(t)

    if args.until == "ingest":
        return 0

    t = _stage("transform: dbt build (staging → intermediate → marts, with tests)")
    result = build()
    print(f"   dbt build: {result.counts} ({result.unit_tests} unit tests)")
    _done(t)
    if args.until == "transform":
        return 0

    t = _stage(f"forecast: train ({'tiny' if args.tiny else 'default'} settings) up to {args.train_end}")
    trained = forecast_service.train(
        models=args.models,
        train_end=args.train_end,
        budget_s=args.budget_s,
        tiny=args.tiny,
        workers=args.workers,
        progress=lambda msg: print(f"   {msg}", flush=True),
    )
    print(
        tabulate(
            [
                {
                    "model": r.model,
                    "target": r.target,
                    "status": r.status,
                    "seconds": round(r.seconds, 1),
                    "val_mape": r.metrics.get("mape"),
                    "note": (r.message or "")[:60],
                }
                for r in trained
            ],
            headers="keys",
        )
    )
    _done(t)
    t = _stage(f"forecast: predict 96 h issued at {args.as_of}")
    rows, summary = forecast_service.predict(args.as_of, horizon=96)
    print(f"   {len(rows):,} forecast rows written to forecast.forecasts")
    _done(t)
    if args.until == "forecast":
        return 0

    cutoff = cutoff_from(args.train_end)
    t = _stage(
        f"performance: train and register the predictor and the power model (version as of {cutoff.isoformat()})"
    )
    registered = train_models(as_of=cutoff, evaluate=False)
    print(
        tabulate(
            [{"model": name, "status": r.get("status"), "version": r.get("version")} for name, r in registered.items()],
            headers="keys",
        )
    )
    _done(t)
    if args.until == "models":
        return 0

    return operate(args, planning_forecast_models(r.model for r in trained if r.status == "good"))


def operate(args: argparse.Namespace, forecast_models=None) -> int:
    """The operate stage alone (`python -m pipeline operate`: on a warehouse the earlier stages filled)."""
    t = _stage(
        f"operate: {args.loop_jobs} trace jobs of {args.as_of[:10]} through the queue, the hourly loop for "
        f"{args.loop_hours} h on the replay executor (policy {args.policy}, run-time spread {args.sigma}, "
        f"{args.failure_rate:.0%} failures), then the carbon ledger"
    )
    demo = run_demo_loop(
        args.as_of,
        n_jobs=args.loop_jobs,
        hours=args.loop_hours,
        policy=args.policy,
        forecast_models=forecast_models,
        load=args.load,
        sigma=args.sigma,
        failure_rate=args.failure_rate,
        progress=lambda msg: print(f"   {msg}", flush=True),
    )
    shown = ("jobs", "finished", "failed", "deadlines_met_pct", "deadline_regret_pct", "realized_kgco2e")
    row = {**demo.load, **{k: demo.ledger.totals.get(k) for k in shown}}
    row.update({k: demo.ledger.totals.get(k) for k in ("counterfactual_kgco2e", "saving_pct")})
    print(tabulate([row], headers="keys", floatfmt=".3f"))
    power = {
        k: sum(h.plan.get("power", {}).get(k, 0) for h in demo.hours) for k in ("raised_at_risk", "changed_for_carbon")
    }
    paused = sum(h.plan.get("preempted", {}).get("decided", 0) for h in demo.hours)
    print(f"   power limits of running jobs changed: {power['raised_at_risk']} raised at risk, "
          f"{power['changed_for_carbon']} for carbon; {paused} runs preempted at a checkpoint for carbon")  # fmt: skip
    if "region" in demo.ledger.rollups:
        print("\n   per region")
        print(tabulate(demo.ledger.rollups["region"], headers="keys", showindex=False, floatfmt=".3f"))
    print("\n   the simulator on the same jobs (exact run times, no failures)")
    print(tabulate(demo.simulated, headers="keys", floatfmt=".3f"))
    if demo.ledger.services:
        print("\n   inference services (against static provisioning for the peak in the home region)")
        print(tabulate(service_rows(demo.ledger.services), headers="keys", floatfmt=".4f"))
    print(f"\n   ledger report: {demo.report}")
    print("   the queue: python -m scheduling jobs list; one job: python -m scheduling jobs show demo/<job_id>")
    _done(t)
    return 0


def _operate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--as-of", default=DEFAULT_AS_OF, help=f"planning/issue time (default {DEFAULT_AS_OF})")
    p.add_argument("--policy", default=DEFAULT_POLICY, help=f"placement policy (default {DEFAULT_POLICY})")
    p.add_argument("--loop-jobs", type=int, default=320, help="trace jobs submitted for the day (default 320)")
    p.add_argument("--loop-hours", type=int, default=48, help="planning hours the loop runs (default 48)")
    p.add_argument(
        "--load",
        type=float,
        default=DEFAULT_DEMO_LOAD,
        help=f"re-size the fleet so the day's jobs ask for this share of its GPU-hours (default {DEFAULT_DEMO_LOAD})",
    )
    p.add_argument("--sigma", type=float, default=DEFAULT_SIGMA, help="replay run-time spread (lognormal sigma)")
    p.add_argument("--failure-rate", type=float, default=DEFAULT_FAILURE_RATE, help="replay failure rate per run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the main job end to end")
    _operate_args(p)
    p.add_argument("--train-end", default="2021-06-30", help="training cut-off for the forecasters")
    p.add_argument("--models", nargs="+", default=None, help="forecasters to train (default: the service's set)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="wall-clock budget of each training lane (s, default 330; with --workers 2 the TFT has a lane of its own)",
    )
    p.add_argument(
        "--workers",
        type=int,
        choices=(1, 2),
        default=2,
        help="training lanes: 2 (default) trains the TFT in a second process beside the other forecasters",
    )
    p.add_argument("--tiny", action="store_true", help="tiny model settings (quick demo)")
    p.add_argument(
        "--until",
        choices=("ingest", "transform", "forecast", "models", "operate"),
        default="operate",
        help="stop after this stage",
    )
    p.set_defaults(func=run)
    o = sub.add_parser("operate", help="only the operate stage, on a warehouse `run` filled (trained models)")
    _operate_args(o)
    o.set_defaults(func=operate)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
