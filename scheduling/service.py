"""One plan for one planning hour T, from given inputs, written to plan.* and var/schedules/<plan time>/.

    plan, info = make_plan(T, jobs=pending, running=running, arrived=arrived)     # nothing written
    summary = write_plan(plan, info)                                             # plan.* + schedule files

The operating loop (`scheduling.loop`) gathers the inputs: the queued jobs (`scheduling.queue`), what the executors
report running at T, the recent arrivals already dispatched (the demand history a policy forecasts from). T is
explicit (a DAG run's data interval end or an `as_of`), never the wall clock. What the plan also uses, as known at
T:

* **Fleet**: the file `FLEET_PATH` names (default `scheduling/domain/fleet.yaml`); `regions` selects a subset,
  default every region with grid data (not GB).
* **Forecasts**: `forecast.forecasts` (carbon_intensity, p50 of the latest issue at or before T, through the
  planner's `WarehouseForecast`); the seasonal naive from actuals where none exist. With the fleet file's
  `signal: marginal`, the plan minimises WattTime's marginal intensity instead: actuals from
  `marts.grid_hourly.carbon_intensity_marginal_gco2_per_kwh`, forecasts from the feed's own
  (`staging.stg_grid__live_forecasts`), the naive of those actuals where none exist; a zone without marginal data
  is an error, never a silent switch to the average.
* **Models**: the latest good registered power model ("gpu-power") and predictor ("gpu-predictor") of
  `model.registry` whose cut-off is at or before T (`scheduling.models.registered.resolve_registered`). Without one,
  flagged (`fallback: true`): power options fitted from marts.gpu_energy_profiles / the files, speeds from Gavel's
  measured isolated throughputs. The versions used are recorded in every explanation record and in the summary.
* **Runtime feedback**: the runs finished before T (`scheduling.executors.runs`) are observations for the
  registered predictor's refiner (on a copy of it); the speeds then follow what those job types really did
  (`scheduling.models.performance.runs`). The refiner state used (`feedback`: runs, job types, latest finish) is
  recorded with the predictor's version.

Writes (not in a dry run): the schedule directory (atomically, `scheduling.output.schedules`) and then plan.plans,
plan.assignments, plan.explanations, plan.unplaced in one transaction (`scheduling.output.plan_store`), whose
`schedule_dir` points at it. A dry run writes plan.explanations only (under plan_id + "#dry-run"), and no files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.domain.fleet import load_fleet
from scheduling.domain.fleet_file import fleet_path, fleet_regions
from scheduling.domain.jobs import SpeedModel
from scheduling.domain.plan import Plan
from scheduling.executors.runs import finished_runs
from scheduling.explain.registry import make_explainer
from scheduling.models.performance.runs import (
    FEEDBACK_RUNS_PER_KEY,
    feedback_summary,
    reference_throughput,
    run_observations,
)
from scheduling.models.registered import PREDICTOR_NAME, predictor_speed_table, resolve_registered
from scheduling.output import plan_store, schedules
from scheduling.output.plan_store import plan_id_for
from scheduling.planning.forecasts import GridSeries, make_forecasts
from scheduling.planning.pausing import PAUSE_COLUMNS, Pausing, evictable_running, pause_running
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from scheduling.planning.power_options import load_power_table, option_arrays
from scheduling.planning.problem import JobTable, abs_hours
from scheduling.planning.recap import RECAP_COLUMNS, Recapping, RunTimeError, recap_running
from scheduling.planning.session import HourlyPlanner, apply_running, off_fleet_running, report_off_fleet
from warehouse.config import warehouse_path
from warehouse.db import reader, table_exists

log = logging.getLogger(__name__)

MIN_HORIZON_H, MAX_HORIZON_H = 24, 168
DEFAULT_HORIZON_H = 168
# plan to end this share of a job's run time before its deadline: a run up to 20 % longer than its estimate still
# ends in time (9 runs in 10 at the replay executor's default spread); the simulator, whose runs are exact, uses 0
DEFAULT_DEADLINE_RESERVE = 0.2
MAX_DEADLINE_RESERVE = 0.9


def plan_fleet(regions: Iterable[str] | None, data_dir=None):
    """The configured fleet (FLEET_PATH), restricted to `regions` or to the zones with grid data."""
    fleet = load_fleet(fleet_path(), data_dir=data_dir)
    if regions:
        return fleet.select(list(regions))
    return fleet.select([r for r, z in zip(fleet.cluster_regions, fleet.cluster_zones) if z != "GB"])


# In-process caches of static inputs (grid actuals per day window; power options are cached per fleet and power
# model version by scheduling.planning.power_options.load_power_table): a CLI run or an Airflow task plans one hour;
# tests and replays that plan several hours in one process reuse them (the marts and files they come from change only
# when dbt or an ingest runs, not between the hours of one process).
_GRID_CACHE: dict = {}


def _source_key(db_path, mart: str) -> str:
    """Where a static input will come from: the warehouse (when it has `marts.<mart>`) or the files."""
    path = Path(db_path) if db_path else warehouse_path()
    if path.exists():
        try:
            with reader(path) as con:
                if table_exists(con, f"marts.{mart}"):
                    return f"warehouse:{path}"
        except Exception:  # noqa: BLE001 - unreadable warehouse: the loaders fall back to files too
            pass
    return "files"


def _grid(zones, plan_time: pd.Timestamp, horizon_h: int, db_path=None, data_dir=None, signal: str = "average"):
    """Grid actuals of `signal` for the UTC day of plan_time minus 8 days to the end of the horizon (a window that
    depends on the day only, so every hour of a day shares it)."""
    day = plan_time.floor("D")
    end = day + pd.Timedelta(hours=24 + horizon_h + 24)
    key = (tuple(zones), day, end, _source_key(db_path, "grid_hourly"), str(data_dir), signal)
    if key not in _GRID_CACHE:
        _GRID_CACHE.clear()
        _GRID_CACHE[key] = GridSeries.load(
            zones, day, end, source="auto", data_dir=data_dir, db_path=db_path, signal=signal
        )
    return _GRID_CACHE[key]


def _power_table(fleet, db_path=None, data_dir=None, as_of=None):
    """Power options from the latest good registered power model at `as_of`, else (flagged) fitted from the mart
    or files; load_power_table caches them per GPU models and model version."""
    return load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=as_of)


def plan_speed_model(pending: pd.DataFrame, as_of, db_path=None, data_dir=None, fleet=None):
    """(SpeedModel, info): speeds from the latest good registered predictor at `as_of`, refined by the runs finished
    before `as_of` (runtime feedback, `_feedback`); else, flagged, Gavel's measured isolated throughputs (the data the
    predictor is trained on; training it here would take minutes), which take no feedback."""
    predictor, info = resolve_registered(PREDICTOR_NAME, as_of=as_of, db_path=db_path)
    if predictor is not None:
        try:
            observations, feedback = _feedback(predictor, as_of, db_path, data_dir, fleet)
            table = predictor_speed_table(predictor, pending["job_type"].astype(str), observations)
            model = SpeedModel(data_dir, table=table, absolute=True)
            return model, {**info, "fallback": False, "feedback": feedback}
        except Exception as exc:  # noqa: BLE001 - a version that cannot predict these jobs: measured speeds
            info = {**info, "version": None, "source": None, "reason": f"predict failed ({type(exc).__name__}: {exc})"}
    model = SpeedModel(data_dir)
    feedback = {**feedback_summary(None), "reason": "no predictor in use: measured speeds take no feedback"}
    return model, {**info, "fallback": True, "source": model.source, "feedback": feedback}


def _feedback(predictor, as_of, db_path=None, data_dir=None, fleet=None) -> tuple[pd.DataFrame | None, dict]:
    """(observations, summary): the runs finished before `as_of` (`scheduling.executors.runs`, the newest
    FEEDBACK_RUNS_PER_KEY per job type x GPU type) as observations for the predictor's refiner. Runs that cannot be
    read leave the plan without feedback, said in the summary."""
    try:
        runs = finished_runs(as_of, db_path=db_path)
    except Exception as exc:  # noqa: BLE001 - unreadable runs must not stop the plan; it plans without them
        return None, {**feedback_summary(None), "reason": f"runs unreadable ({type(exc).__name__}: {exc})"}
    if runs.empty:
        return None, feedback_summary(None)
    fleet = fleet if fleet is not None else plan_fleet(None, data_dir)
    t0 = reference_throughput(predictor, runs["job_type"])
    observations = run_observations(runs, t0, fleet.gpu_models, per_key=FEEDBACK_RUNS_PER_KEY)
    return observations, feedback_summary(observations)


def plan_forecasts(fleet, plan_time: pd.Timestamp, horizon_h: int, db_path=None, data_dir=None):
    """Of the fleet's signal: forecast.forecasts (average) or the live feed's own forecasts (marginal), latest issue
    at or before plan_time, else the seasonal naive from actuals."""
    zones = fleet.zones
    end = plan_time + pd.Timedelta(hours=horizon_h + 24)
    grid = _grid(zones, plan_time, horizon_h, db_path, data_dir, fleet.signal)
    kind = "live" if fleet.signal == "marginal" else "warehouse"
    try:
        return make_forecasts(kind, grid, zones, start=plan_time, end=end, db_path=db_path, data_dir=data_dir)
    except ValueError:
        return make_forecasts("naive", grid, zones)


def make_plan(
    as_of,
    *,
    jobs: pd.DataFrame,
    running: pd.DataFrame | None = None,
    arrived: pd.DataFrame | None = None,
    policy: str = DEFAULT_POLICY,
    regions=None,
    fleet=None,
    horizon_hours: int = DEFAULT_HORIZON_H,
    deadline_reserve: float = DEFAULT_DEADLINE_RESERVE,
    db_path=None,
    data_dir=None,
    recapping: Recapping | None = None,
    pausing: Pausing | None = None,
    forecasts=None,
):
    """(Plan, info) for the planning hour `as_of`, without writing anything (`forecasts`: the intensity forecasts
    of `fleet` at that hour, `plan_forecasts`' by default).

    `jobs`: the planner job frame of the pending jobs (`scheduling.queue.frame`); `running`: the jobs running at T
    (job_id, cluster, num_gpu, gpu_milli, cpu_milli, memory_mib, end_time[, node, gpu_devices]) -- their resources
    stay committed until their end; `arrived`: jobs that arrived recently and were dispatched already, in the job
    frame's columns (history for the demand a policy expects, never planned again); `deadline_reserve`: the share of
    each job's run time planned to spare before its deadline (`JobTable`), raised to the observed run-time error's
    `recapping.reserve_quantile` over the estimate when that is larger (0 keeps plans to the estimate). Running
    jobs that carry their run's details (planned_start, planned_end, dispatch_limit_w, deadline, changes; recap:
    whether its executor can change the limit) get their progress and next power limit
    (`scheduling.planning.recap`, settings `recapping`): `info["recaps"]`, one row per such job. Those that also
    carry checkpointing, preemptions, work_done and preempt (whether the executor can) may be paused through a
    dirty stretch (`scheduling.planning.pausing`, settings `pausing`): `info["pauses"]`; their GPUs are free now.
    With `pausing.for_deadline`, the plan may also preempt them to start a job due now: those join `info["pauses"]`
    (reason `deadline`), and `info["preempted_for"]` names the job each made room for."""
    plan_time = utc(as_of).floor("h")
    # a drained node (FleetCluster.drained) takes no new job: the plan's nodes and capacity leave it out
    fleet = (fleet if fleet is not None else plan_fleet(regions, data_dir)).schedulable()
    running = running if running is not None else pd.DataFrame()
    arrived = arrived if arrived is not None and len(arrived) else None
    info = {
        "pending": int(len(jobs)),
        "running": int(len(running)),
        "arrived_dispatched": 0 if arrived is None else int(len(arrived)),
        "unhostable": list(jobs.attrs.get("unhostable", [])),
        "deadline_reserve": float(deadline_reserve),
    }
    if forecasts is None:
        forecasts = plan_forecasts(fleet, plan_time, horizon_hours, db_path, data_dir)
    info["forecast_source"] = forecasts.name
    info["signal"] = fleet.signal
    power_table = _power_table(fleet, db_path, data_dir, as_of=plan_time)
    settings = recapping or Recapping()
    errors = _run_time_error(plan_time, settings, db_path)
    info["run_time_error"] = {"mu": errors.mu, "sigma": errors.sigma, "runs": errors.runs}
    # the reserve: at least the run-time error's `reserve_quantile` over the estimate, where the plan keeps one
    info["deadline_reserve_used"] = (
        min(max(float(deadline_reserve), errors.ratio(settings.reserve_quantile) - 1.0), MAX_DEADLINE_RESERVE)
        if deadline_reserve > 0
        else 0.0
    )
    pausing = pausing or Pausing()
    info["recaps"], info["pauses"], evictable = recaps, pauses, _ = _recaps(
        running, fleet, power_table, forecasts, plan_time, horizon_hours, settings, errors, pausing
    )
    running = running_ends(running, recaps, pauses, plan_time)
    if jobs.empty:
        moving = frozenset(pauses.loc[pauses["reason"] == "drained", "job_id"])
        report_off_fleet(off_fleet_running(fleet, running), plan_time, info, moving)
        return Plan(plan_time=plan_time, policy=policy, forecast_version=None), info
    table_jobs = pd.concat([jobs, arrived], ignore_index=True) if arrived is not None else jobs
    speed_model, predictor_info = plan_speed_model(table_jobs, plan_time, db_path, data_dir, fleet)
    table = JobTable(
        table_jobs,
        fleet,
        speed_model=speed_model,
        power_table=power_table,
        data_dir=data_dir,
        deadline_reserve=info["deadline_reserve_used"],
        # plans that keep a reserve for runs longer than planned offer slower limits only where a long run still fits
        option_margin=errors.ratio(settings.option_quantile) if deadline_reserve > 0 else 1.0,
        cluster_margin=errors.ratio(settings.cluster_quantile) if deadline_reserve > 0 else 1.0,
    )
    hp = HourlyPlanner(fleet, None, policy, forecasts, table=table, max_horizon=int(horizon_hours), data_dir=data_dir)
    if arrived is not None:
        hp.started[table.jobs["job_id"].isin(set(arrived["job_id"])).to_numpy()] = True
    if len(running):
        unbound = apply_running(hp, running[running["cluster"].isin(fleet.names)], plan_time)
        report_off_fleet(unbound, plan_time, info, frozenset(pauses.loc[pauses["reason"] == "drained", "job_id"]))
    else:
        info["running_off_fleet"] = []
    hp.running_evictable = dict(zip(evictable["job_id"], evictable["cost"].astype(float)))
    idx = np.flatnonzero((hp.table.submit_h <= abs_hours(plan_time)) & ~hp.started)
    plan = hp.plan(plan_time, idx)
    victims = {v: due for v, _, due in (hp.last_outcome.evicted if hp.last_outcome is not None else [])}
    if victims:  # preempted for a job due now: stopped by their executors, like a pause
        chosen = evictable[evictable["job_id"].isin(victims)].drop(columns="cost")
        info["pauses"] = pd.concat([pauses, chosen], ignore_index=True)
        info["preempted_for"] = {v: victims[v] for v in chosen["job_id"]}
    # the model versions behind every decision go into its explanation record (plan.explanations.record.models)
    info["models"] = {"power": _model_ref(power_table.model_info), "predictor": _model_ref(predictor_info)}
    for record in plan.explanations:
        record["models"] = info["models"]
    return plan, info


def running_ends(running: pd.DataFrame, recaps: pd.DataFrame, pauses: pd.DataFrame, plan_time) -> pd.DataFrame:
    """`running` with the end each run holds its GPUs until in this hour's plan: its projected end at the median
    (`recaps`' expected_end) rather than the plan's first estimate; now for a run paused now (`pauses`); and for a long
    job's run (`chunk_end`, `planning.chunks`) at most an hour past the first hour after its chunk, its stop: its GPUs
    wait for the rest of the job until the next plan."""
    hour = pd.Timedelta(hours=1)
    if len(recaps):
        ends = dict(zip(recaps["job_id"], recaps["expected_end"]))
        ends.update(dict.fromkeys(pauses["job_id"], plan_time))
        ends.update(dict.fromkeys(pauses.loc[pauses["reason"] == "chunk", "job_id"], plan_time + hour))
        running = running.copy()
        projected = pd.to_datetime(running["job_id"].map(ends), utc=True)
        running["end_time"] = projected.where(projected.notna(), pd.to_datetime(running["end_time"], utc=True))
    if len(running) and "chunk_end" in running.columns:
        running = running.copy()
        stop = pd.to_datetime(running["chunk_end"], utc=True).dt.ceil("h") + hour
        end = pd.to_datetime(running["end_time"], utc=True)
        running["end_time"] = end.where(stop.isna() | (end <= stop), stop)
    return running


RUN_DETAILS = ("planned_start", "planned_end", "dispatch_limit_w", "deadline", "changes")
PAUSE_DETAILS = ("checkpointing", "preemptions", "work_done", "preempt")


def _run_time_error(plan_time, settings: Recapping, db_path) -> RunTimeError:
    """Actual / planned run time of the runs finished before the plan time, as `RunTimeError` (its fallback when
    they cannot be read)."""
    try:
        done = finished_runs(plan_time, db_path=db_path, per_key=10_000)
        ratios = (done["actual_h"] / done["planned_h"]).to_numpy(float)
    except Exception:  # noqa: BLE001 - unreadable runs: the fallback spread
        ratios = []
    return RunTimeError.fit(ratios, settings)


def _recaps(
    running, fleet, power_table, forecasts, plan_time, horizon_h, settings, errors, pausing
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(`recap_running`, `pause_running`, `evictable_running` less the paused) for the running jobs with their
    run's details (the others: none)."""
    none = (
        pd.DataFrame(columns=list(RECAP_COLUMNS)),
        pd.DataFrame(columns=list(PAUSE_COLUMNS)),
        pd.DataFrame(columns=[*PAUSE_COLUMNS, "cost"]),
    )
    if running is None or running.empty or not set(RUN_DETAILS).issubset(running.columns):
        return none
    runs = running[running["planned_start"].notna() & running["deadline"].notna()]
    if runs.empty:
        return none
    zones = {z: i for i, z in enumerate(forecasts.zones)}
    F, _, _ = forecasts.at(plan_time, int(horizon_h))
    F = F[:, [zones[z] for z in fleet.cluster_zones]]
    options = option_arrays(fleet, power_table, power_aware=True)
    recaps = recap_running(runs, fleet, options, F, plan_time, errors, settings)
    if not set(PAUSE_DETAILS).issubset(runs.columns):
        return recaps, none[1], none[2]
    off = off_fleet_running(fleet, runs)
    drained = frozenset(off.loc[off["node_state"] == "drained", "job_id"])
    pauses = pause_running(recaps, runs, fleet, options, F, plan_time, errors, pausing, drained)
    evictable = evictable_running(recaps, runs, fleet, options, F, plan_time, errors, pausing)
    evictable = evictable[~evictable["job_id"].isin(set(pauses["job_id"]) | set(off["job_id"]))]
    return recaps, pauses, evictable.reset_index(drop=True)


def _model_ref(info: dict) -> dict:
    """The part of a model's resolution recorded with a plan: name, version (None = fallback), trained_at,
    source, fallback flag, and versions skipped because their artifact would not load."""
    ref = {k: info.get(k) for k in ("name", "version", "trained_at", "source", "fallback")}
    if "feedback" in info:
        ref["feedback"] = info["feedback"]
    if info.get("skipped"):
        ref["skipped"] = [s["version"] for s in info["skipped"]]
    if info.get("fallback") and info.get("reason"):
        ref["reason"] = info["reason"]
    return ref


def validate_inputs(
    as_of,
    policy: str,
    regions=None,
    horizon_hours: int = DEFAULT_HORIZON_H,
    deadline_reserve: float = DEFAULT_DEADLINE_RESERVE,
) -> dict:
    """Check the run's settings before any work; ValueError naming the bad value."""
    if as_of is None or str(as_of).strip() == "":
        raise ValueError("as_of is required (an ISO time, e.g. 2021-07-15T12:00Z)")
    try:
        ts = utc(as_of)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"as_of {as_of!r} is not an ISO date/time (e.g. 2021-07-15T12:00Z): {exc}") from None
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy {policy!r} is not one of {list(POLICY_NAMES)}")
    if (
        not isinstance(horizon_hours, (int, np.integer))
        or isinstance(horizon_hours, bool)
        or not MIN_HORIZON_H <= int(horizon_hours) <= MAX_HORIZON_H
    ):
        raise ValueError(f"horizon_hours {horizon_hours!r} must be an integer in [{MIN_HORIZON_H}, {MAX_HORIZON_H}]")
    if (
        isinstance(deadline_reserve, bool)
        or not isinstance(deadline_reserve, (int, float, np.integer, np.floating))
        or not 0 <= float(deadline_reserve) <= MAX_DEADLINE_RESERVE
    ):
        raise ValueError(f"deadline_reserve {deadline_reserve!r} must be a number in [0, {MAX_DEADLINE_RESERVE}]")
    if regions:
        known = fleet_regions()
        bad = [r for r in regions if r not in known]
        if bad:
            raise ValueError(f"region(s) {bad} not in the fleet ({fleet_path()}); choose from {known}")
    return {
        "as_of": iso_z(ts.floor("h")),
        "policy": policy,
        "regions": list(regions or []),
        "horizon_hours": int(horizon_hours),
        "deadline_reserve": float(deadline_reserve),
    }


def write_plan(
    plan: Plan,
    info: dict,
    *,
    dry_run: bool = False,
    db_path=None,
    schedule_root=None,
    created_from: str = "service",
    explainer=None,
    started: float | None = None,
    job_files: dict | None = None,
) -> dict:
    """Write `plan` (see the module doc) with its explanation texts (`job_files`: cluster -> the per-job schedule
    files it gets, see `schedules.render`); returns the summary: plan_id, plan_time,
    policy, dry_run, forecast_version, forecast_source, signal, n_jobs, n_assigned, n_dispatched (start now),
    n_unplaced, n_running, n_arrived_dispatched, running_off_fleet (running jobs on a drained node or one gone from
    the fleet file, per node: `scheduling.planning.session.report_off_fleet`), expected_kgco2e, schedule_dir, files,
    tables, models, seconds."""
    t0 = time.perf_counter() if started is None else started
    plan_time = utc(plan.plan_time)
    explainer = explainer or make_explainer()
    texts = {str(r.get("job_id")): explainer.explain(r) for r in plan.explanations}
    plan_id = plan_id_for(plan.policy, plan_time, dry_run=dry_run)
    schedule_dir, files = None, []
    if dry_run:
        plan_store.write_plan(plan, texts=texts, explanations_only=True, created_from=created_from, db_path=db_path)
        tables = ["plan.explanations"]
    else:
        result = schedules.write_schedules(
            plan, schedule_root, plan_id=plan_id, job_files=job_files
        )  # files first, then the rows
        schedule_dir, files = str(result.path), result.files
        plan_store.write_plan(plan, schedule_dir=schedule_dir, texts=texts, created_from=created_from, db_path=db_path)
        tables = ["plan.plans", "plan.assignments", "plan.explanations", "plan.unplaced"]
    a = plan.assignments
    dispatched = int((a["status"] == "dispatched").sum()) if len(a) else 0
    kg = float(a["expected_kgco2e"].sum()) if len(a) else 0.0
    summary = {
        "plan_id": plan_id,
        "plan_time": iso_z(plan_time),
        "policy": plan.policy,
        "dry_run": bool(dry_run),
        "forecast_version": plan.forecast_version,
        "forecast_source": info.get("forecast_source"),
        "signal": info.get("signal"),
        "n_jobs": int(len(a) + len(plan.unplaced)),
        "n_assigned": int(len(a)),
        "n_dispatched": dispatched,
        "n_unplaced": int(len(plan.unplaced)),
        "n_running": info.get("running", 0),
        "n_arrived_dispatched": info.get("arrived_dispatched", 0),
        "running_off_fleet": info.get("running_off_fleet", []),
        "expected_kgco2e": round(kg, 6),
        "schedule_dir": schedule_dir,
        "files": files,
        "tables": tables,
        "explanations": len(plan.explanations),
        "models": info.get("models"),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    log.info(
        "plan %s: %d jobs, %d assigned (%d start now), %.3f kgCO2e expected; schedule %s",
        plan_id,
        summary["n_jobs"],
        summary["n_assigned"],
        dispatched,
        kg,
        schedule_dir or "(dry run)",
    )
    return summary
