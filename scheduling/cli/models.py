"""Commands: `predictor-eval`, `power-eval`, `serving-eval`, `train-predictor` (see
scheduling/evaluation/predictor_eval.py, scheduling/models/power.py, scheduling/models/serving.py and
scheduling/models/registered.py). With `--json` exactly one JSON document goes to stdout;
progress goes to stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scheduling.evaluation.power_eval import power_eval, power_eval_markdown
from scheduling.evaluation.services import evaluate_services, plot_services, services_markdown
from scheduling.evaluation.serving_eval import leave_one_configuration_out, summary, summary_markdown
from scheduling.models.measured import (
    energy_profiles_from_files,
    load_energy_profiles,
    load_throughput,
    throughput_from_files,
)
from scheduling.models.serving import KEY as SERVING_KEY
from scheduling.models.serving import load_serving_runs
from scheduling.tasks import train_models
from warehouse.config import REPO_ROOT

DEFAULT_REPORT = Path("var/reports/predictor/results.md")
DEFAULT_POWER_REPORT = Path("var/reports/predictor/power.md")
DEFAULT_SERVING_REPORT = Path("var/reports/predictor/serving.md")
DEFAULT_SERVICES_REPORT = Path("var/reports/planner/services.md")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _emit(result: dict, as_json: bool, summary: str) -> None:
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(summary)


def _resolve(path: str | Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def cmd_predictor_eval(args) -> int:
    # torch (seconds and ~200 MB on import) loads only for this command, not for every `python -m scheduling`
    import torch  # noqa: PLC0415

    from scheduling.evaluation.predictor_eval import EvalConfig, results_markdown, run_all  # noqa: PLC0415

    torch.set_num_threads(1)
    throughput = throughput_from_files(args.data_dir) if args.from_files else load_throughput(args.db)
    cfg = EvalConfig.quick() if args.quick else EvalConfig()
    cfg.protocols = tuple(int(p) for p in args.protocols.split(","))
    result = run_all(throughput, cfg, log=_log)
    report = _resolve(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown = results_markdown(result)
    tmp = report.with_suffix(".tmp")
    tmp.write_text(markdown)
    tmp.replace(report)
    report.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    result["report"] = str(report)
    _emit(result, args.json, markdown)
    return 0


def cmd_power_eval(args) -> int:
    profiles = energy_profiles_from_files(args.data_dir) if args.from_files else load_energy_profiles(args.db)
    result = power_eval(profiles)
    report = _resolve(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown = power_eval_markdown(result)
    report.write_text(markdown)
    result["report"] = str(report)
    _emit(result, args.json, markdown)
    return 0


def cmd_serving_eval(args) -> int:
    runs = load_serving_runs(args.data_dir)
    errors = leave_one_configuration_out(runs)
    result = summary(errors)
    result["curves"] = int(runs.groupby(list(SERVING_KEY)).ngroups)
    report = _resolve(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown = summary_markdown(result)
    report.write_text(markdown + "\n")
    errors.to_csv(report.with_suffix(".csv"), index=False)
    result["report"] = str(report)
    _emit(result, args.json, markdown)
    return 0


def cmd_services_eval(args) -> int:
    result = evaluate_services(train_days=args.train_days, data_dir=args.data_dir, db_path=args.db,
                               forecasts=args.forecasts)  # fmt: skip
    report = _resolve(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    markdown = services_markdown(result)
    report.write_text(markdown + "\n")
    hours = result.pop("hours")
    hours.to_csv(report.with_suffix(".csv"), index=False)
    result["plot"] = str(plot_services(hours, report.with_suffix(".png")))
    result["report"] = str(report)
    _emit(result, args.json, markdown)
    return 0


def cmd_train_predictor(args) -> int:
    result = train_models(db_path=args.db, as_of=args.as_of, evaluate=not args.no_eval, log=_log)
    _emit(result, args.json, json.dumps(result, indent=2, default=str))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("predictor-eval", help="evaluate the throughput/interference predictor (3 protocols)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--quick", action="store_true", help="tiny settings for smoke tests (numbers not meaningful)")
    p.add_argument("--protocols", default="1,2,3", help="comma-separated subset of 1,2,3")
    p.add_argument("--report", default=str(DEFAULT_REPORT), help="markdown table (a .json beside it)")
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    p.add_argument("--from-files", action="store_true", help="read the Gavel files, not marts.gpu_throughput")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_predictor_eval)

    p = subparsers.add_parser("power-eval", help="evaluate the GPU power model (leave-one-batch-size-out)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--report", default=str(DEFAULT_POWER_REPORT))
    p.add_argument("--db", default=None)
    p.add_argument("--from-files", action="store_true", help="read the Zeus file, not marts.gpu_energy_profiles")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_power_eval)

    p = subparsers.add_parser(
        "serving-eval", help="evaluate the serving model (leave one configuration out, ML.ENERGY runs)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--report", default=str(DEFAULT_SERVING_REPORT), help="markdown table (each configuration: .csv)")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_serving_eval)

    p = subparsers.add_parser(
        "services-eval", help="inference services planned hourly for carbon vs static provisioning (ServeGen days)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--train-days", type=int, default=7, help="days that fit the load forecast (default 7)")
    p.add_argument("--forecasts", default="auto", help="intensity forecasts: auto, naive, oracle, warehouse, dacf")
    p.add_argument("--report", default=str(DEFAULT_SERVICES_REPORT), help="markdown table (every hour: .csv)")
    p.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_services_eval)

    p = subparsers.add_parser("train-predictor", help="train predictor + power model, evaluate, register a version")
    p.add_argument("--json", action="store_true")
    p.add_argument("--db", default=None)
    p.add_argument("--as-of", default=None, help="version timestamp (default: now, UTC)")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation protocols (metrics: training only)")
    p.set_defaults(func=cmd_train_predictor)
