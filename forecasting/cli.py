"""Command line: `python -m forecasting backtest|results|train|predict`.

    python -m forecasting backtest --region CISO --target carbon_intensity --model ensemble \\
        --start 2021-07-01 --end 2021-12-31 --horizon 24 --json
    python -m forecasting results --out var/reports/forecast/results.md
    python -m forecasting train --targets carbon_intensity solar wind --workers 2
    python -m forecasting predict --as-of 2021-07-15T12:00Z --json

`--json` prints exactly one JSON document on stdout; progress and library chatter go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

from common.timeutil import utc
from forecasting import service
from forecasting.data import STANDARD_REGIONS, issue_hour, service_load_hourly
from forecasting.evaluation.backtest import CONTEXT_DAYS, load_inputs, run_backtest, store_forecasts
from forecasting.evaluation.metrics import point_metric_name
from forecasting.evaluation.plots import write_plot
from forecasting.evaluation.results import build_results, render_markdown
from forecasting.evaluation.service_load import evaluate_service_load, service_load_markdown
from forecasting.models.registry import MODEL_NAMES, make_model
from forecasting.store import STORED_PREFIX

TARGET_ALIASES = {
    "carbon_intensity": "carbon_intensity",
    "ci": "carbon_intensity",
    "carbon_intensity_direct_gco2_per_kwh": "carbon_intensity",
    "solar": "solar",
    "solar_mw": "solar",
    "wind": "wind",
    "wind_mw": "wind",
}
REPORT_DIR = Path("var/reports/forecast")


def _target(name: str) -> str:
    try:
        return TARGET_ALIASES[name]
    except KeyError:
        raise SystemExit(f"unknown target {name!r}; use carbon_intensity, solar or wind") from None


def _regions(values) -> list[str]:
    out = []
    for v in values or []:
        out += [r.strip().upper() for r in v.split(",") if r.strip()]
    return out


def _quiet():
    warnings.filterwarnings("ignore")
    service.quiet_library_logs()


# ------------------------------------------------------------------------------------------------------ backtest


def backtest_command(args) -> int:
    _quiet()
    target = _target(args.target)
    regions = _regions(args.region) or list(STANDARD_REGIONS)
    out_stream = sys.stderr if args.json else sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        data, published = load_inputs(regions, source=args.source)
        model = (
            make_model(args.model, target, horizon=max(args.horizon, 24))
            if args.model in ("lgbm", "mix", "ensemble")
            else make_model(args.model, target)
        )
        results = run_backtest(
            model,
            target,
            regions,
            data,
            published,
            start=args.start,
            end=args.end,
            horizon=args.horizon,
            train_end=args.train_end,
            context_days=args.context_days,
        )
        stored = None
        if args.store:
            label = args.store_version or f"{STORED_PREFIX}{utc(args.train_end or args.start).date().isoformat()}"
            stored = {"model": args.model, "model_version": label, "rows": store_forecasts(results, args.model, label)}
        docs = []
        for res in results:
            doc = res.to_json()
            if not args.no_plot and len(res.forecasts):
                doc["plot"] = str(write_plot(res, published, Path(args.plot_dir)))
            docs.append(doc)
    name = point_metric_name(target)
    if len(docs) == 1:
        payload = docs[0]
    else:
        vals = [d[name] for d in docs if d.get(name) is not None]
        payload = {
            "target": target,
            "model": args.model,
            "start": args.start,
            "end": args.end,
            "horizon": args.horizon,
            f"mean_{name}": round(sum(vals) / len(vals), 3) if vals else None,
            "regions": {d["region"]: d for d in docs},
        }
    payload["start"], payload["end"], payload["horizon"] = args.start, args.end, args.horizon
    payload["train_end"] = str(utc(args.train_end or args.start))
    if stored is not None:
        payload["stored"] = stored
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        for d in docs:
            base = d.get("baseline_dacf_mape", d.get("baseline_operator_error_pct_of_mean"))
            print(
                f"{d['region']:5s} {target:17s} {args.model:10s} {name}={d.get(name)} "
                f"coverage={d.get('coverage_p10_p90')} published={base}",
                file=out_stream,
            )
    return 0


# ------------------------------------------------------------------------------------------------------- results


def service_load_command(args) -> int:
    """The inference services' load forecast on the ServeGen days it did not train on
    (`forecasting.evaluation.service_load`)."""
    service.quiet_library_logs()
    loads = service_load_hourly(args.data_dir)
    result = evaluate_service_load(
        loads,
        train_days=args.train_days,
        horizon=args.horizon,
        progress=lambda svc, model: print(f"{svc}: {model} done", file=sys.stderr, flush=True),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    markdown = service_load_markdown(result)
    out.write_text(markdown + "\n")
    result.pop("forecasts").to_csv(out.with_suffix(".csv"), index=False)
    result["report"] = str(out)
    print(json.dumps(result, indent=2, default=str) if args.json else markdown)
    return 0


def results_command(args) -> int:
    _quiet()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    targets = [_target(t.strip()) for t in args.targets.split(",") if t.strip()]
    regions = _regions([args.regions]) if args.regions else list(STANDARD_REGIONS)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.render_only:
        results = json.loads(out.with_suffix(".json").read_text())
        out.write_text(render_markdown(results, results.get("command", "")))
        print(json.dumps(results, default=str) if args.json else f"wrote {out}")
        return 0
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        results = build_results(
            models,
            targets,
            regions,
            args.start,
            args.end,
            horizon=args.horizon,
            jobs=args.jobs,
            source=args.source,
            plot_models=[m.strip() for m in args.plot_models.split(",") if m.strip()],
            plot_dir=str(out.parent),
            progress=say,
        )
    results["elapsed_wall_s"] = round(time.perf_counter() - t0, 1)
    if args.append and out.with_suffix(".json").exists():
        # Keep the runs of other (target, model) pairs from the previous document; replace the ones run now.
        previous = json.loads(out.with_suffix(".json").read_text())
        done = {(r["target"], r["model"]) for r in results["runs"]}
        kept = [r for r in previous.get("runs", []) if (r["target"], r["model"]) not in done]
        results["runs"] = kept + results["runs"]
        results["models"] = list(dict.fromkeys(previous.get("models", []) + results["models"]))
        results["targets"] = list(dict.fromkeys(previous.get("targets", []) + results["targets"]))
        results["baselines"] = {**previous.get("baselines", {}), **results["baselines"]}
        order = {m: i for i, m in enumerate(results["models"])}
        torder = {t: i for i, t in enumerate(results["targets"])}
        results["runs"].sort(key=lambda r: (torder.get(r["target"], 0), order.get(r["model"], 0)))
    command = (
        "python -m forecasting results --out " + str(out) + f" --models {','.join(models)}"
        f" --targets {','.join(targets)} --start {args.start} --end {args.end} --horizon {args.horizon}"
    )
    results["command"] = command
    out.write_text(render_markdown(results, command))
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    if args.json:
        print(json.dumps(results, default=str))
    else:
        print(f"wrote {out} and {out.with_suffix('.json')} in {results['elapsed_wall_s']} s")
    return 0


# ---------------------------------------------------------------------------------------------- train, predict


def _split(values) -> list[str] | None:
    if not values:
        return None
    out = []
    for v in values:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """With --json, stdout carries the JSON document only: anything else printed meanwhile (libraries included,
    at the file-descriptor level) goes to stderr."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _cmd_train(args: argparse.Namespace) -> int:
    service.quiet_library_logs()
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    t0 = time.monotonic()
    with _stdout_to_stderr(args.json):
        results = service.train(
            models=_split(args.models),
            targets=_split(args.targets) or ["carbon_intensity"],
            regions=_split(args.regions) or list(service.DEFAULT_REGIONS),
            train_end=args.train_end,
            budget_s=args.budget_s,
            tiny=args.tiny,
            val_days=args.val_days,
            source=args.source,
            progress=say,
            refit=args.refit,
            workers=args.workers,
        )
    doc = {
        "train_end": args.train_end,
        "cutoff": service.cutoff_from(args.train_end).isoformat(),
        "budget_s": args.budget_s,
        "elapsed_s": round(time.monotonic() - t0, 2),
        "cpu_seconds": round(time.process_time(), 2),
        "cpu_count": os.cpu_count(),
        "results": [r.to_dict() for r in results],
    }
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        for r in results:
            line = f"{r.model:10s} {r.target:17s} {r.status:8s} {r.version or '-':20s} {r.seconds:7.1f} s"
            print(line + (f"  {service.metrics_headline(r.metrics)}" if r.metrics else f"  {r.message or ''}"))
        print(f"elapsed {doc['elapsed_s']} s")
    return 0 if all(r.status != "failed" for r in results) else 1


def _cmd_predict(args: argparse.Namespace) -> int:
    service.quiet_library_logs()
    t0 = time.monotonic()
    with _stdout_to_stderr(args.json):
        rows, summary = service.predict(
            as_of=args.as_of,
            horizon=args.horizon,
            regions=_split(args.regions) or list(service.DEFAULT_REGIONS),
            targets=_split(args.targets) or ["carbon_intensity"],
            models=_split(args.models),
            source=args.source,
            write=not args.no_write,
            bootstrap_tiny=args.tiny,
        )
    doc = {
        "as_of": issue_hour(args.as_of).isoformat(),
        "horizon": args.horizon,
        "rows": int(len(rows)),
        "fallback_rows": int(rows["is_fallback"].sum()) if len(rows) else 0,
        "written": not args.no_write,
        "elapsed_s": round(time.monotonic() - t0, 2),
        "forecasts": [s.to_dict() for s in summary],
    }
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        for s in summary:
            print(
                f"{s.model:10s} {s.target:17s} {s.version or '-':20s} rows {s.rows:5d} fallback {s.fallback_rows:5d}"
                + (f"  ({'; '.join(s.reasons)})" if s.reasons else "")
            )
        print(f"{doc['rows']} rows issued at {doc['as_of']} in {doc['elapsed_s']} s")
    return 0


def _add_train_and_predict(subparsers) -> None:
    """The `train` and `predict` sub-commands (forecasting.service)."""
    p = subparsers.add_parser("train", help="fit, validate and register models (model.registry)")
    p.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help=f"models to train (default: {' '.join(service.DEFAULT_TRAIN_MODELS)})",
    )
    p.add_argument("--targets", nargs="+", metavar="TARGET", help="carbon_intensity (default), solar, wind")
    p.add_argument("--regions", nargs="+", metavar="REGION", help=f"default: {' '.join(service.DEFAULT_REGIONS)}")
    p.add_argument(
        "--train-end",
        default="2021-06-30",
        help="last day of training data (inclusive date) or an exclusive timestamp cut-off",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=service.DEFAULT_BUDGET_S,
        help=f"wall-clock budget per lane (s; default {service.DEFAULT_BUDGET_S:.0f}: all within 15 min)",
    )
    p.add_argument("--val-days", type=int, default=14, help="validation window before the cut-off (days)")
    p.add_argument("--tiny", action="store_true", help="tiny settings (tests, demos)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="2: train the TFT in a second single-threaded process beside the others (2 cores)",
    )
    p.add_argument(
        "--refit",
        choices=("auto", "always", "never"),
        default="auto",
        help="refit on the validation days after scoring (auto: when the budget share allows)",
    )
    p.add_argument("--source", choices=("auto", "warehouse", "files"), default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=_cmd_train)

    p = subparsers.add_parser("predict", help="issue forecasts at --as-of into forecast.forecasts")
    p.add_argument("--as-of", required=True, help="issue time, e.g. 2021-07-15T12:00Z (never the wall clock)")
    p.add_argument("--horizon", type=int, default=96, help="hours ahead (default 96)")
    p.add_argument("--models", nargs="+", metavar="NAME", help="default: every model with a good version")
    p.add_argument("--targets", nargs="+", metavar="TARGET", help="carbon_intensity (default), solar, wind")
    p.add_argument("--regions", nargs="+", metavar="REGION", help=f"default: {' '.join(service.DEFAULT_REGIONS)}")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="when a named model has no version yet, train a tiny one on data before --as-of first",
    )
    p.add_argument("--no-write", action="store_true", help="do not store the rows")
    p.add_argument("--source", choices=("auto", "warehouse", "files"), default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=_cmd_predict)


# ------------------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command; each one's function is `args.func`."""
    parser = argparse.ArgumentParser(prog="python -m forecasting", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("backtest", help="rolling-origin backtest of one model (daily 00:00 UTC issues)")
    p.add_argument("--region", action="append", help="region (repeatable or comma-separated); default: the six")
    p.add_argument("--target", default="carbon_intensity", help="carbon_intensity, solar or wind")
    p.add_argument("--model", default="ensemble", help=f"one of {', '.join(MODEL_NAMES)}")
    p.add_argument("--start", default="2021-07-01", help="first issue date (UTC)")
    p.add_argument("--end", default="2021-12-31", help="last date scored (inclusive)")
    p.add_argument("--horizon", type=int, default=24, help="hours ahead per issue (1–96)")
    p.add_argument("--train-end", default=None, help="training cut-off (exclusive); default --start")
    p.add_argument(
        "--context-days",
        type=int,
        default=CONTEXT_DAYS,
        help="days of data before each issue given to predict (default %(default)s)",
    )
    p.add_argument(
        "--source",
        choices=("auto", "warehouse", "files"),
        default="auto",
        help="marts.grid_hourly (warehouse), the CSVs (files) or whichever exists (auto)",
    )
    p.add_argument("--plot-dir", default=str(REPORT_DIR), help="where the PNG goes")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument(
        "--store",
        action="store_true",
        help="write every issued forecast (all horizons) into forecast.forecasts (model = --model, "
        "model_version = --store-version) for the planner's simulator",
    )
    p.add_argument(
        "--store-version",
        default=None,
        help="model_version label of the stored rows; default backtest-<train end date>",
    )
    p.set_defaults(func=backtest_command)

    p = sub.add_parser("results", help="regenerate the full results table (every model, region, horizon bucket)")
    p.add_argument("--out", default=str(REPORT_DIR / "results.md"))
    p.add_argument("--models", default=",".join(MODEL_NAMES), help="comma-separated model names")
    p.add_argument("--targets", default="carbon_intensity,solar,wind")
    p.add_argument("--regions", default=None, help="comma-separated; default: the six of the standard comparison")
    p.add_argument("--start", default="2021-07-01")
    p.add_argument("--end", default="2021-12-31")
    p.add_argument("--horizon", type=int, default=96)
    p.add_argument("--jobs", type=int, default=1, help="(target, model) backtests run in parallel processes")
    p.add_argument("--source", choices=("auto", "warehouse", "files"), default="auto")
    p.add_argument("--plot-models", default="ensemble", help="models whose per-region plots are written")
    p.add_argument("--render-only", action="store_true", help="re-render the markdown from the existing JSON")
    p.add_argument(
        "--append", action="store_true", help="merge into the existing results (runs of other models/targets are kept)"
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON document on stdout")
    p.set_defaults(func=results_command)

    p = sub.add_parser(
        "service-load", help="inference services' hourly load forecast on the ServeGen days it did not train on"
    )
    p.add_argument("--train-days", type=int, default=7, help="days each service is fitted on (default 7)")
    p.add_argument("--horizon", type=int, default=24, help="hours ahead of each daily 00:00 issue (default 24)")
    p.add_argument("--out", default=str(REPORT_DIR / "service_load.md"), help="markdown table (forecasts: .csv)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=service_load_command)

    _add_train_and_predict(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
