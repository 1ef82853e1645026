"""What the Airflow DAGs (and `python -m pipeline run`) call: one function per DAG task, dict in, dict out.

Each function checks its inputs first and raises ValueError naming a bad value, so a DAG run fails at its first
task before any work. Planning time always comes from the run (its Param or data interval), never the wall clock.
"""

from __future__ import annotations

import time
import traceback

import pandas as pd

from common.jsonutil import to_jsonable
from common.timeutil import iso_z, parse_time, utc
from scheduling import loop
from scheduling.evaluation.power_eval import power_eval
from scheduling.evaluation.report import run_evaluation, safe_run_id, validate_evaluation_params
from scheduling.models.measured import load_energy_profiles, load_throughput
from scheduling.models.power import PowerModel
from scheduling.models.registered import POWER_NAME, POWER_TARGET, PREDICTOR_NAME, PREDICTOR_TARGET
from scheduling.output.ledger import LEDGER_SELECT, ledger, write_ledger_report
from scheduling.planning.pausing import Pausing
from scheduling.planning.policies.registry import DEFAULT_POLICY
from scheduling.queue import intake
from scheduling.queue.checks import check_jobs
from scheduling.queue.files import read_job_file
from scheduling.queue.intake import fleet_facts
from scheduling.queue.spec import USER_FIELDS, JobSpecError, parse_job
from scheduling.service import DEFAULT_DEADLINE_RESERVE, DEFAULT_HORIZON_H, validate_inputs
from transforms.runner import build
from warehouse import model_registry
from warehouse.config import var_dir

# ------------------------------------------------------------------------------------------------ plan_hourly


def _run_time(params: dict, name: str, run_times) -> str:
    """The Param `name` when set, else the first of the run's times given (data interval end, logical date,
    run_after) as ISO; "" when there is none. Never the wall clock."""
    value = str(params.get(name) or "").strip()
    if value:
        return value
    return next((iso_z(t) for t in run_times if t is not None), "")


def resolve_plan_run(params: dict, data_interval_end=None, logical_date=None, run_after=None) -> dict:
    """The checked settings of one plan_hourly DAG run: the planning time is the `as_of` Param when given, else
    the run's data interval end, else its logical date, else its run_after (a manual run without a date), floored
    to the hour; never the wall clock. ValueError naming the bad value."""
    as_of = _run_time(params, "as_of", (data_interval_end, logical_date, run_after))
    if not as_of:
        raise ValueError("no planning time: set the as_of Param (ISO, e.g. 2021-07-15T12:00Z)")
    dry_run = params.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ValueError(f"dry_run {dry_run!r} must be true or false")
    regions = params.get("regions") or []
    if isinstance(regions, str) or not isinstance(regions, (list, tuple)):
        raise ValueError(f"regions {regions!r} must be a list of fleet region names")
    checked = validate_inputs(
        as_of,
        str(params.get("policy", DEFAULT_POLICY)),
        list(regions),
        params.get("horizon_hours", DEFAULT_HORIZON_H),
        params.get("deadline_reserve", DEFAULT_DEADLINE_RESERVE),
    )
    checked["dry_run"] = dry_run
    pause = params.get("pause_for_carbon", False)
    if not isinstance(pause, bool):
        raise ValueError(f"pause_for_carbon {pause!r} must be true or false")
    checked["pause_for_carbon"] = pause
    preempt = params.get("preempt_for_deadlines", False)
    if not isinstance(preempt, bool):
        raise ValueError(f"preempt_for_deadlines {preempt!r} must be true or false")
    checked["preempt_for_deadlines"] = preempt
    return checked


def _hour(choice: dict):
    return loop.context(
        choice["as_of"],
        policy=choice["policy"],
        regions=choice["regions"] or None,
        horizon_hours=choice["horizon_hours"],
        deadline_reserve=choice["deadline_reserve"],
        pausing=Pausing(
            for_carbon=bool(choice.get("pause_for_carbon", False)),
            for_deadline=bool(choice.get("preempt_for_deadlines", False)),
        ),
    )


def sync(choice: dict) -> dict:
    """The hour's first step: staged submissions, cancellations, the executors' events of [T-1h, T)."""
    return loop.sync(_hour(choice))


def plan(choice: dict, created_from: str = "airflow:plan_hourly") -> dict:
    """The hour's plan of the queued jobs around what runs (dry run: explanations only); its summary."""
    _, summary, _ = loop.plan(_hour(choice), dry_run=choice["dry_run"], created_from=created_from)
    return summary


def dispatch(choice: dict) -> dict:
    """The hour's stored plan's starting jobs to their executors, exactly once (nothing in a dry run)."""
    if choice["dry_run"]:
        return {"plan_id": None, "sent": 0, "skipped": 0, "reconciled": 0, "dry_run": True}
    return loop.dispatch_plan(_hour(choice))


# ------------------------------------------------------------------------------------------------ ledger


def resolve_ledger_run(params: dict, data_interval_end=None, logical_date=None, run_after=None) -> dict:
    """The checked period of one ledger DAG run, {start, end} (ISO UTC): the jobs submitted on the days of
    [start, end). An empty `end` is the run's data interval end (else its logical date, else its run_after), an
    empty `start` the day before `end`; never the wall clock. ValueError naming a bad value."""
    end = _run_time(params, "end", (data_interval_end, logical_date, run_after))
    if not end:
        raise ValueError("no period end: set the end Param (ISO date, e.g. 2021-07-16)")
    end_at = parse_time(end, "end")
    start = str(params.get("start") or "").strip()
    start_at = parse_time(start, "start") if start else end_at - pd.Timedelta(days=1)
    if start_at >= end_at:
        raise ValueError(f"start {start!r} must be before end {end!r}")
    return {"start": iso_z(start_at), "end": iso_z(end_at)}


def build_ledger(db_path=None) -> dict:
    """Rebuild the ledger marts (marts.job_runs, carbon_ledger, carbon_ledger_daily) from raw.job_events and
    plan.assignments with dbt; returns the selection and dbt's node counts per status. dbt's artifacts go to
    var/dbt/ledger, so the manifest the transform DAG is rendered from (transforms/target) is never rewritten
    while Airflow reads it."""
    target = var_dir() / "dbt" / "ledger"
    result = build(select=list(LEDGER_SELECT), warehouse_path=db_path, target_path=target)
    return {"select": list(LEDGER_SELECT), "counts": result.counts}


def ledger_report(choice: dict, out_dir=None, db_path=None) -> dict:
    """The carbon ledger of `choice`'s period (`scheduling.output.ledger`): its totals, and the HTML report written
    (default under var/reports/ledger/<period>/)."""
    book = ledger(choice["start"], choice["end"], db_path=db_path)
    index = write_ledger_report(book, out_dir)
    return {"start": choice["start"], "end": choice["end"], "totals": to_jsonable(book.totals), "report": str(index)}


# ------------------------------------------------------------------------------------------------ evaluate


def resolve_evaluation_run(params: dict) -> dict:
    """The checked settings of one evaluate DAG run (ValueError naming a bad policy, date, size, region or load)."""
    return validate_evaluation_params(dict(params))


def evaluate(choice: dict, run_id: str) -> dict:
    """Simulate the chosen policies and write the HTML report under var/reports/evaluate/<run id>/."""
    return run_evaluation(
        start=choice["start"],
        days=choice["days"],
        n_jobs=choice["n_jobs"],
        regions=choice["regions"],
        load=choice["load"],
        policies=choice["policies"],
        run_id=safe_run_id(run_id),
        max_cards=choice["max_cards"],
    )


# ------------------------------------------------------------------------------------------------ predictor


def resolve_model_run(as_of, data_interval_end=None) -> str:
    """The version time of a training run: the `as_of` Param when given, else the run's data interval end (ISO)."""
    value = as_of or data_interval_end
    if value is None or str(value).strip() == "":
        raise ValueError("as_of is required (an ISO time, e.g. 2021-07-15T12:00Z)")
    try:
        return utc(value).isoformat()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"as_of {value!r} is not an ISO date/time (e.g. 2021-07-15T12:00Z): {exc}") from None


def train_models(db_path=None, as_of=None, evaluate: bool = True, eval_config=None, log=None) -> dict:
    """Train, evaluate and register the performance predictor and the power model: reads marts.gpu_throughput and
    marts.gpu_energy_profiles (the shared files while the marts do not exist) and registers one version of each in
    model.registry (artifacts under MODELS_DIR). A failing training is registered with status 'failed' and the
    error in its metrics. Returns {name: {version, status, artifact_path, trained_at, headline}}."""
    # torch loads only for training: an hourly plan task, which imports this module too, need not pay for it
    import torch  # noqa: PLC0415

    from scheduling.evaluation.predictor_eval import EvalConfig, environment, run_all  # noqa: PLC0415
    from scheduling.models.performance.predictor import PerformancePredictor  # noqa: PLC0415

    torch.set_num_threads(1)
    log = log or (lambda message: None)
    trained_at = utc(as_of) if as_of is not None else _now_utc()
    result: dict = {}

    # --- predictor ---
    t0 = time.perf_counter()
    try:
        throughput = load_throughput(db_path)
        cfg = eval_config or EvalConfig()
        predictor = PerformancePredictor.train(throughput, cfg.prior, cfg.refiner)
        metrics = {"training": predictor.metadata, "train_s": round(time.perf_counter() - t0, 1)}
        if evaluate:
            log("evaluating the predictor (3 protocols)")
            evaluation = run_all(throughput, cfg, log=log)
            metrics.update(
                {k: evaluation[k] for k in evaluation if k.startswith("protocol") or k in ("targets", "timings")}
            )
        metrics["environment"] = environment()
        params = {"prior": cfg.prior.__dict__, "refiner": cfg.refiner.__dict__, "rows": int(len(throughput))}
        record = model_registry.register_model(
            predictor, PREDICTOR_NAME, PREDICTOR_TARGET, trained_at, params=params, metrics=metrics, db_path=db_path
        )
    except Exception as exc:  # noqa: BLE001 - recorded as a failed version, then re-raised after the power model
        log(f"predictor training failed: {exc}")
        record = model_registry.register_model(
            None,
            PREDICTOR_NAME,
            PREDICTOR_TARGET,
            trained_at,
            status="failed",
            metrics={"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]},
            db_path=db_path,
        )
    result[PREDICTOR_NAME] = _summary(record)

    # --- power model ---
    t0 = time.perf_counter()
    try:
        profiles = load_energy_profiles(db_path)
        power = PowerModel(profiles)
        metrics = {
            "power_eval": power_eval(profiles) if evaluate else None,
            "train_s": round(time.perf_counter() - t0, 1),
        }
        record = model_registry.register_model(
            power,
            POWER_NAME,
            POWER_TARGET,
            trained_at,
            params={"rows": int(len(profiles)), "gpu_types": sorted(profiles.gpu_type.unique())},
            metrics=metrics,
            db_path=db_path,
        )
    except Exception as exc:  # noqa: BLE001
        log(f"power model failed: {exc}")
        record = model_registry.register_model(
            None,
            POWER_NAME,
            POWER_TARGET,
            trained_at,
            status="failed",
            metrics={"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]},
            db_path=db_path,
        )
    result[POWER_NAME] = _summary(record)
    return result


def _summary(record) -> dict:
    metrics = record.metrics or {}
    headline = {}
    if "targets" in metrics:
        headline["targets"] = metrics["targets"]
    if metrics.get("power_eval"):
        headline["power_overall"] = metrics["power_eval"].get("overall")
    if "error" in metrics:
        headline["error"] = metrics["error"]
    return {
        "version": record.version,
        "status": record.status,
        "artifact_path": record.artifact_path,
        "trained_at": record.trained_at.isoformat(),
        "headline": headline,
    }


def _now_utc() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC").floor("s")


# ------------------------------------------------------------------------------------------------ submit_jobs


def resolve_submission(params: dict, data_interval_end=None, logical_date=None, run_after=None) -> dict:
    """The checked settings of one submit_jobs DAG run: a job `file` to submit, or ONE job from the form's fields
    (an empty field = not given). The form's job is parsed and checked against the fleet here, so a bad value fails
    this first task, naming the field and the value; a file is read here (a file that cannot be read fails), its
    jobs are checked one by one by the submit task. `as_of` (the submission time of jobs without submitted_at) is
    the `as_of` Param, else the run's data interval end, logical date or run_after; never the wall clock."""
    as_of = _run_time(params, "as_of", (data_interval_end, logical_date, run_after))
    if not as_of:
        raise ValueError("no submission time: set the as_of Param (ISO, e.g. 2021-07-15T12:00Z)")
    as_of = iso_z(parse_time(as_of, "as_of"))
    replace = params.get("replace", False)
    if not isinstance(replace, bool):
        raise ValueError(f"replace {replace!r} must be true or false")
    file = str(params.get("file") or "").strip()
    job = {k: params[k] for k in USER_FIELDS if k in params and not _form_empty(params[k])}
    choice = {"as_of": as_of, "replace": replace, "file": file or None, "job": None}
    if file:
        if "job_id" in job:
            raise ValueError("give a job file or the job's fields, not both (file and job_id are set)")
        read_job_file(file)  # JobFileError (a ValueError) naming the file when it cannot be read
        return choice
    if "job_id" not in job:
        raise ValueError("job_id is required (or give a job file in `file`)")
    spec = parse_job(job, default_submitted_at=as_of, where=f"the submit_jobs form, job {job['job_id']!r}")
    [(spec, errors)] = check_jobs([spec], fleet_facts())
    if errors:
        raise JobSpecError(f"the submit_jobs form, job {spec.planner_id!r}", errors)
    choice["job"] = to_jsonable(job)
    return choice


def _form_empty(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "") or value == []


def submit_jobs(choice: dict, created_from: str = "airflow:submit_jobs") -> dict:
    """Submit what `resolve_submission` chose; returns the intake report (`IntakeReport.to_dict`). The accepted
    jobs are committed first; then, when any job was rejected (it is in quarantine.rejected_rows), ValueError
    naming each rejected job and field, so that the run shows it."""
    if choice.get("file"):
        report = intake.submit_file(
            choice["file"], replace=choice["replace"], as_of=choice["as_of"], created_from=created_from
        )
    else:
        report = intake.submit_mappings(
            [choice["job"]], source=created_from, replace=choice["replace"], as_of=choice["as_of"]
        )
    out = to_jsonable(report.to_dict())
    if report.rejected:
        messages = [e["message"] for o in report.rejected for e in o.errors]
        raise ValueError(f"{len(report.rejected)} job(s) rejected (quarantined): " + "; ".join(messages[:20]))
    return out


def intake_staging(as_of) -> dict:
    """Move queue.submissions into queue.jobs (`scheduling.queue.intake.intake_staging`); returns the report."""
    return intake.intake_staging(as_of=as_of).to_dict()
