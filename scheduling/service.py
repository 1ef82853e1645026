"""The hourly planning service: one plan for one planning time, written to plan.* and var/schedules/<plan time>/.

    from scheduling.service import plan_hourly
    summary = plan_hourly("2021-07-15T12:00Z", policy="rolling-lp")          # -> dict (see PlanSummary)
    summary = plan_hourly("2021-07-15T12:00Z", dry_run=True)                 # explanations only

    python -m scheduling plan-hourly --as-of 2021-07-15T12:00Z [--policy rolling-lp] [--regions us-west,eu-north]
        [--horizon-hours 72] [--dry-run] [--explainer chat] [--json]

The planning time is explicit (the DAG's data interval end or an `as_of`), never the wall clock; it is floored
to the hour. Inputs, all as known at that time:

* **Pending jobs** (the job source). The workload is a deterministic stream from `scheduling.domain.jobs.generate_jobs`:
  each UTC day gets `jobs_per_day` jobs (default 48, env `PLAN_JOBS_PER_DAY`) arriving over that day with the
  openb trace's pattern, seeded by the date, ids ``<yyyymmdd>-job-NNNNN``; so the job set of a day never
  depends on when or how often the service runs. A job is *pending* at T when it was submitted at or before T
  (submission = the hour it arrived), has not been dispatched by an earlier stored plan of the same policy
  (plan.assignments of plans with plan_time < T that started it at their plan time), and was submitted no earlier
  than the first stored plan of that policy within the last `PENDING_LOOKBACK_H` hours (so a cold start, with no
  history, plans only the jobs that arrived in the planning hour instead of a day of backlog). Jobs dispatched
  earlier whose planned end is after T are *running*: their GPUs stay committed (and bound on their nodes).
  Re-running the same T therefore gives the same job set, as long as the plans before T are unchanged.
* **Cluster state**: the fleet (the file `FLEET_PATH` names, default `scheduling/domain/fleet.yaml`; `regions`
  selects a subset, default every region but those without grid data at T, i.e. GB) plus the running jobs above.
* **Forecasts**: `forecast.forecasts` (target carbon_intensity, p50 of the latest issue at or before T, through
  the planner's `WarehouseForecast`); the planner's seasonal naive from actuals where none exist.

* **Models**: the latest good registered power model ("gpu-power") and predictor ("gpu-predictor") of
  `model.registry` whose cut-off is at or before T (`scheduling.models.registered.resolve_registered`; failed
  versions and unloadable artifacts are skipped). Without one, flagged (`fallback: true`): power options fitted
  from marts.gpu_energy_profiles / the files, speeds from Gavel's measured isolated throughputs. The versions used
  are recorded in every explanation record (`models` {power, predictor}) and in the summary.

Writes (not in a dry run): the schedule directory (atomically, `scheduling.output.schedules`) and then plan.plans,
plan.assignments, plan.explanations, plan.unplaced in one transaction (`scheduling.output.plan_store`), whose
`schedule_dir` points at it. A dry run writes plan.explanations only (under plan_id + "#dry-run"), and no files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.domain.fleet import load_fleet
from scheduling.domain.fleet_file import fleet_path, fleet_regions
from scheduling.domain.jobs import JOB_COLUMNS, SpeedModel, generate_jobs
from scheduling.domain.plan import Plan
from scheduling.explain.registry import make_explainer
from scheduling.models.registered import PREDICTOR_NAME, predictor_speed_table, resolve_registered
from scheduling.output import plan_store, schedules
from scheduling.output.plan_store import plan_id_for
from scheduling.planning.forecasts import GridSeries, make_forecasts
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES
from scheduling.planning.power_options import load_power_table
from scheduling.planning.problem import JobTable, abs_hours
from scheduling.planning.session import HourlyPlanner, apply_running
from warehouse.config import warehouse_path
from warehouse.db import reader, table_exists

log = logging.getLogger(__name__)

DEFAULT_JOBS_PER_DAY = 48
PENDING_LOOKBACK_H = 48
HISTORY_DAYS = 7
MIN_HORIZON_H, MAX_HORIZON_H = 24, 168
DEFAULT_HORIZON_H = 168


def jobs_per_day() -> int:
    return int(os.environ.get("PLAN_JOBS_PER_DAY", DEFAULT_JOBS_PER_DAY))


def _day_seed(day: pd.Timestamp) -> int:
    return int(day.strftime("%Y%m%d"))


def daily_jobs(day, fleet, n_per_day: int | None = None, data_dir=None) -> pd.DataFrame:
    """The jobs of one UTC day's stream (ids `<yyyymmdd>-job-NNNNN`)."""
    day = utc(day).floor("D")
    jobs = generate_jobs(n_per_day or jobs_per_day(), day, 24, fleet, seed=_day_seed(day), data_dir=data_dir)
    jobs["job_id"] = day.strftime("%Y%m%d") + "-" + jobs["job_id"].astype(str)
    return jobs


def job_stream(start, end, fleet, n_per_day: int | None = None, data_dir=None, extra_days=()) -> pd.DataFrame:
    """The jobs submitted in [start, end] (UTC hours) from the daily streams (see the module doc), plus every job
    of `extra_days`."""
    start, end = utc(start), utc(end)
    days = set(pd.date_range(start.floor("D"), end.floor("D"), freq="D"))
    extra = {utc(d).floor("D") for d in extra_days}
    frames = []
    for day in sorted(days | extra):
        jobs = daily_jobs(day, fleet, n_per_day, data_dir)
        if day not in extra:
            jobs = jobs[(jobs["submit_time"] >= start) & (jobs["submit_time"] <= end)]
        frames.append(jobs)
    if not frames:
        return pd.DataFrame(columns=list(JOB_COLUMNS))
    jobs = pd.concat(frames, ignore_index=True).drop_duplicates("job_id")
    return jobs.sort_values(["submit_time", "job_id"], kind="mergesort").reset_index(drop=True)


def _job_day(job_id: str) -> pd.Timestamp | None:
    try:
        return pd.Timestamp(str(job_id).split("-", 1)[0], tz="UTC")
    except ValueError:
        return None


def plan_history(policy: str, as_of, db_path=None) -> tuple[pd.DataFrame, pd.Timestamp | None]:
    """(dispatched assignments of stored plans of `policy` with plan_time in [as_of - HISTORY_DAYS, as_of), the
    first plan_time of that policy within the pending look-back window, or None)."""
    as_of = utc(as_of)
    lo = as_of - pd.Timedelta(days=HISTORY_DAYS)
    cols = ["job_id", "cluster", "node", "gpu_devices", "gpu_milli", "gpu_count", "start_time", "end_time", "plan_time"]
    empty = pd.DataFrame(columns=cols)
    try:
        with reader(db_path) as con:
            if not (table_exists(con, "plan.plans") and table_exists(con, "plan.assignments")):
                return empty, None
            first = con.execute(
                "SELECT min(plan_time) FROM plan.plans WHERE policy = ? AND plan_time >= ? AND plan_time < ?",
                [policy, (as_of - pd.Timedelta(hours=PENDING_LOOKBACK_H)).to_pydatetime(), as_of.to_pydatetime()],
            ).fetchone()[0]
            rows = con.execute(
                f"SELECT {', '.join('a.' + c for c in cols[:-1])}, p.plan_time FROM plan.assignments a "
                "JOIN plan.plans p USING (plan_id) WHERE p.policy = ? AND p.plan_time >= ? AND p.plan_time < ? "
                "AND a.start_time = p.plan_time ORDER BY p.plan_time, a.job_id",
                [policy, lo.to_pydatetime(), as_of.to_pydatetime()],
            ).df()
    except FileNotFoundError:
        return empty, None
    for col in ("start_time", "end_time", "plan_time"):
        rows[col] = pd.to_datetime(rows[col], utc=True)
    rows = rows.drop_duplicates("job_id", keep="last").reset_index(drop=True)
    return rows, (utc(first) if first is not None else None)


def pending_and_running(
    as_of, policy: str, fleet, db_path=None, data_dir=None, n_per_day: int | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """The pending jobs and the running ones at `as_of` (see the module doc), the jobs of the stream that arrived
    in the pending window but were dispatched already (the recent arrivals a policy may forecast demand from),
    plus counters."""
    as_of = utc(as_of)
    history, first = plan_history(policy, as_of, db_path)
    cutoff = max(first, as_of - pd.Timedelta(hours=PENDING_LOOKBACK_H)) if first is not None else as_of
    run = history[history["end_time"] > as_of]
    run = run[run["cluster"].isin(fleet.names)]
    run_days = {d for d in map(_job_day, run["job_id"]) if d is not None}
    stream = job_stream(cutoff, as_of, fleet, n_per_day, data_dir, extra_days=run_days)
    dispatched = set(history["job_id"])
    window = (stream["submit_time"] >= cutoff) & (stream["submit_time"] <= as_of)
    pending = stream[window & ~stream["job_id"].isin(dispatched)].reset_index(drop=True)
    arrived = stream[window & stream["job_id"].isin(dispatched)].reset_index(drop=True)
    if len(run):
        specs = stream.set_index("job_id")[["cpu_milli", "memory_mib"]]
        run = run.join(specs, on="job_id")
        run["cpu_milli"] = run["cpu_milli"].fillna(0).astype(np.int64)
        run["memory_mib"] = run["memory_mib"].fillna(0).astype(np.int64)
        run = run.rename(columns={"gpu_count": "num_gpu"})
        run["gpu_devices"] = run["gpu_devices"].fillna("")
        run["node"] = run["node"].where(run["node"].notna(), None)
    running = run.reset_index(drop=True)
    info = {
        "history_dispatched": int(len(history)),
        "cold_start": first is None,
        "pending_since": iso_z(cutoff),
        "running": int(len(running)),
        "pending": int(len(pending)),
        "arrived_dispatched": int(len(arrived)),
    }
    return pending, running, arrived, info


def _fleet(regions: Iterable[str] | None, data_dir=None):
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


def _grid(zones, plan_time: pd.Timestamp, horizon_h: int, db_path=None, data_dir=None):
    """Grid actuals for the UTC day of plan_time minus 8 days to the end of the horizon (a window that depends on
    the day only, so every hour of a day shares it)."""
    day = plan_time.floor("D")
    end = day + pd.Timedelta(hours=24 + horizon_h + 24)
    key = (tuple(zones), day, end, _source_key(db_path, "grid_hourly"), str(data_dir))
    if key not in _GRID_CACHE:
        _GRID_CACHE.clear()
        _GRID_CACHE[key] = GridSeries.load(zones, day, end, source="auto", data_dir=data_dir, db_path=db_path)
    return _GRID_CACHE[key]


def _power_table(fleet, db_path=None, data_dir=None, as_of=None):
    """Power options from the latest good registered power model at `as_of`, else (flagged) fitted from the mart
    or files; load_power_table caches them per GPU models and model version."""
    return load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=as_of)


def _speed_model(pending: pd.DataFrame, as_of, db_path=None, data_dir=None):
    """(SpeedModel, info): speeds from the latest good registered predictor at `as_of`; else, flagged, Gavel's
    measured isolated throughputs (the data the predictor is trained on; training it here would take minutes)."""
    predictor, info = resolve_registered(PREDICTOR_NAME, as_of=as_of, db_path=db_path)
    if predictor is not None:
        try:
            table = predictor_speed_table(predictor, pending["job_type"].astype(str))
            return SpeedModel(data_dir, table=table), {**info, "fallback": False}
        except Exception as exc:  # noqa: BLE001 - a version that cannot predict these jobs: measured speeds
            info = {**info, "version": None, "source": None, "reason": f"predict failed ({type(exc).__name__}: {exc})"}
    model = SpeedModel(data_dir)
    return model, {**info, "fallback": True, "source": model.source}


def _forecasts(fleet, plan_time: pd.Timestamp, horizon_h: int, db_path=None, data_dir=None):
    """forecast.forecasts (latest issue at or before plan_time), else the seasonal naive from actuals."""
    zones = fleet.zones
    end = plan_time + pd.Timedelta(hours=horizon_h + 24)
    grid = _grid(zones, plan_time, horizon_h, db_path, data_dir)
    try:
        return make_forecasts("warehouse", grid, zones, start=plan_time, end=end, db_path=db_path, data_dir=data_dir)
    except ValueError:
        return make_forecasts("naive", grid, zones)


def make_plan_for(
    as_of,
    *,
    policy: str = DEFAULT_POLICY,
    regions=None,
    horizon_hours: int = DEFAULT_HORIZON_H,
    db_path=None,
    data_dir=None,
    n_per_day: int | None = None,
):
    """(Plan, info) for the planning time `as_of`, without writing anything."""
    plan_time = utc(as_of).floor("h")
    fleet = _fleet(regions, data_dir)
    pending, running, arrived, info = pending_and_running(plan_time, policy, fleet, db_path, data_dir, n_per_day)
    forecasts = _forecasts(fleet, plan_time, horizon_hours, db_path, data_dir)
    info["forecast_source"] = forecasts.name
    if pending.empty:
        return Plan(plan_time=plan_time, policy=policy, forecast_version=None), info

    power_table = _power_table(fleet, db_path, data_dir, as_of=plan_time)
    # the arrivals already dispatched join the job table as history (marked started, never planned again): the
    # demand a policy forecasts from (rolling-lp's expected arrivals), as the simulator's table holds every arrival
    jobs = pd.concat([pending, arrived], ignore_index=True) if len(arrived) else pending
    speed_model, predictor_info = _speed_model(jobs, plan_time, db_path, data_dir)
    table = JobTable(jobs, fleet, speed_model=speed_model, power_table=power_table, data_dir=data_dir)
    hp = HourlyPlanner(fleet, None, policy, forecasts, table=table, max_horizon=int(horizon_hours), data_dir=data_dir)
    hp.started[table.jobs["job_id"].isin(set(arrived["job_id"])).to_numpy()] = True
    if len(running):
        apply_running(hp, running, plan_time)
    idx = np.flatnonzero((hp.table.submit_h <= abs_hours(plan_time)) & ~hp.started)
    plan = hp.plan(plan_time, idx)
    # the model versions behind every decision go into its explanation record (plan.explanations.record.models)
    info["models"] = {"power": _model_ref(power_table.model_info), "predictor": _model_ref(predictor_info)}
    for record in plan.explanations:
        record["models"] = info["models"]
    return plan, info


def _model_ref(info: dict) -> dict:
    """The part of a model's resolution recorded with a plan: name, version (None = fallback), trained_at,
    source, fallback flag, and versions skipped because their artifact would not load."""
    ref = {k: info.get(k) for k in ("name", "version", "trained_at", "source", "fallback")}
    if info.get("skipped"):
        ref["skipped"] = [s["version"] for s in info["skipped"]]
    if info.get("fallback") and info.get("reason"):
        ref["reason"] = info["reason"]
    return ref


def validate_inputs(as_of, policy: str, regions=None, horizon_hours: int = DEFAULT_HORIZON_H) -> dict:
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
    }


def plan_hourly(
    as_of,
    *,
    policy: str = DEFAULT_POLICY,
    dry_run: bool = False,
    regions=None,
    db_path=None,
    schedule_root=None,
    horizon_hours: int = DEFAULT_HORIZON_H,
    created_from: str = "plan_service",
    explainer=None,
    data_dir=None,
    n_per_day: int | None = None,
) -> dict:
    """Plan the planning time `as_of` (see the module doc) and write it; returns a summary dict: plan_id,
    plan_time, policy, dry_run, forecast_version, forecast_source, n_jobs, n_assigned, n_dispatched, n_unplaced,
    n_running, n_arrived_dispatched (recent arrivals already dispatched: history for demand forecasts),
    expected_kgco2e, schedule_dir, files, tables, models (power/predictor version used, or the
    flagged fallback), seconds."""
    t0 = time.perf_counter()
    checked = validate_inputs(as_of, policy, regions, horizon_hours)
    plan_time = utc(checked["as_of"])
    plan, info = make_plan_for(
        plan_time,
        policy=policy,
        regions=regions,
        horizon_hours=horizon_hours,
        db_path=db_path,
        data_dir=data_dir,
        n_per_day=n_per_day,
    )
    explainer = explainer or make_explainer()
    texts = {str(r.get("job_id")): explainer.explain(r) for r in plan.explanations}
    plan_id = plan_id_for(policy, plan_time, dry_run=dry_run)
    schedule_dir, files = None, []
    if dry_run:
        plan_store.write_plan(plan, texts=texts, explanations_only=True, created_from=created_from, db_path=db_path)
        tables = ["plan.explanations"]
    else:
        result = schedules.write_schedules(plan, schedule_root, plan_id=plan_id)  # files first, then the rows
        schedule_dir, files = str(result.path), result.files
        plan_store.write_plan(plan, schedule_dir=schedule_dir, texts=texts, created_from=created_from, db_path=db_path)
        tables = ["plan.plans", "plan.assignments", "plan.explanations", "plan.unplaced"]
    a = plan.assignments
    dispatched = (
        int((a["status"] == "dispatched").sum())
        if "status" in a.columns
        else int((pd.to_datetime(a["start_time"], utc=True) == plan_time).sum())
        if len(a)
        else 0
    )
    kg = float(a["expected_kgco2e"].sum()) if len(a) else 0.0
    summary = {
        "plan_id": plan_id,
        "plan_time": iso_z(plan_time),
        "policy": policy,
        "dry_run": bool(dry_run),
        "forecast_version": plan.forecast_version,
        "forecast_source": info.get("forecast_source"),
        "n_jobs": int(len(a) + len(plan.unplaced)),
        "n_assigned": int(len(a)),
        "n_dispatched": dispatched,
        "n_unplaced": int(len(plan.unplaced)),
        "n_running": info["running"],
        "n_arrived_dispatched": info.get("arrived_dispatched", 0),
        "cold_start": info["cold_start"],
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
