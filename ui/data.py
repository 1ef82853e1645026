"""What the Carbon pages show, read from the warehouse with the shared reader (never the writer lock).

Three documents, each plain JSON (the pages render them; /carbon/api/... returns them as they are):

* `overview`: the last `WINDOW_DAYS` days of the carbon ledger up to its latest day of submission -- realized
  against run-now per day, the saving, deadlines met (the figures of `python -m scheduling ledger --json` for the
  same days) -- the GPU utilization per cluster while the loop ran in those days, and per region the plans'
  forecast of their windows against the same windows at the actual intensity.
* `current_plan`: the newest stored plan (or a given one): its assignments per cluster with the forecast intensity
  of each cluster's zone behind them, and every job it does not start now with the reason it waits.
* `job_page`: one job's spec, state history, decisions (with the explanation record and card text), attempts and
  ledger row.

`read` wraps them: a DAG holding the warehouse makes a page wait at most `BUSY_WAIT_S`, then show what it read
last (marked stale) or, when it has read nothing yet, answer "busy" -- a page never fails because a DAG writes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache

import duckdb
import pandas as pd

from common.jsonutil import to_jsonable
from common.timeutil import utc
from scheduling.domain.fleet import load_fleet
from scheduling.domain.fleet_file import fleet_path
from scheduling.executors.power_log import TABLE as POWER_CHANGES
from scheduling.executors.preempt_log import TABLE as PREEMPTIONS
from scheduling.output.ledger import LEDGER_TABLES, SERVICE_LEDGER, read_ledger, service_totals
from scheduling.planning.pausing import explain_pause
from scheduling.planning.recap import explain_change
from scheduling.queue.store import HISTORY, JOBS, UnknownJob, job_document
from warehouse.db import WarehouseLockTimeout, reader, table_exists

WINDOW_DAYS = 7
BUSY_WAIT_S = 2.0
PLAN_HOURS = 48  # the timeline's span from the plan time
HOUR = pd.Timedelta(hours=1)


class WarehouseBusy(RuntimeError):
    """A writer holds the warehouse and nothing was read before: the page asks to be reloaded."""


# ------------------------------------------------------------------------------------------------ reading


LAST_READS_KEPT = 256  # documents kept for a busy warehouse (the most recently read)
_LAST: OrderedDict[tuple, tuple[float, dict]] = OrderedDict()
_LAST_LOCK = threading.Lock()


def read(what: Callable, *args, db_path=None) -> dict:
    """`what(con, *args)` on a read-only connection (con None when the warehouse does not exist yet). While a
    writer holds the warehouse for longer than BUSY_WAIT_S: the last document read for the same arguments, with
    `stale` {read_at, reason}; WarehouseBusy when there is none."""
    key = (what.__name__, args, str(db_path))
    try:
        try:
            with reader(db_path, timeout_s=BUSY_WAIT_S) as con:
                doc = what(con, *args)
        except FileNotFoundError:
            doc = what(None, *args)
    except (WarehouseLockTimeout, duckdb.IOException) as exc:
        if isinstance(exc, duckdb.IOException) and "lock" not in str(exc).lower():
            raise
        with _LAST_LOCK:
            last = _LAST.get(key)
        if last is None:
            raise WarehouseBusy("a DAG is writing the warehouse; this page reloads in a few seconds") from exc
        read_at, doc = last
        return {**doc, "stale": {"read_at": to_jsonable(pd.Timestamp(read_at, unit="s", tz="UTC")), "reason": "busy"}}
    doc = to_jsonable(doc)
    with _LAST_LOCK:
        _LAST[key] = (time.time(), doc)
        _LAST.move_to_end(key)
        while len(_LAST) > LAST_READS_KEPT:
            _LAST.popitem(last=False)
    return doc


def _has(con, *tables: str) -> bool:
    return con is not None and all(table_exists(con, t) for t in tables)


def _rows(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict(orient="records")


# ------------------------------------------------------------------------------------------------ overview


@lru_cache(maxsize=1)
def fleet_gpus() -> dict[str, int]:
    """GPUs per cluster of the configured fleet (FLEET_PATH); empty when it cannot be loaded here. Loaded once per
    process: the fleet file changes with a deploy, not between page views."""
    try:
        fleet = load_fleet(fleet_path())
    except Exception:  # noqa: BLE001 - no fleet here: utilization is shown without a capacity
        return {}
    return {c.name: int(c.n_gpus) for c in fleet.clusters}


def overview(con, days: int = WINDOW_DAYS) -> dict:
    """The ledger's last `days` days of submission (see the module doc); `window` None on a fresh warehouse."""
    empty = {"window": None, "totals": None, "days": [], "clusters": [], "regions": []}
    if not _has(con, *LEDGER_TABLES):
        return empty
    last = con.execute("SELECT max(submitted_day) FROM marts.carbon_ledger_daily").fetchone()[0]
    if last is None:
        return empty
    end = pd.Timestamp(last, tz="UTC") + pd.Timedelta(days=1)
    start = end - pd.Timedelta(days=days)
    book = read_ledger(con, start, end)
    per_day = book.rollups["day"].rename(columns={"submitted_day": "day"})
    return {
        "window": {"start": start, "end": end, "days": days},
        "ledger_command": f"python -m scheduling ledger --from {start:%Y-%m-%d} --to {end:%Y-%m-%d} --json",
        "totals": book.totals,
        "days": _rows(per_day),
        "clusters": _utilization(con, start, end),
        "regions": _forecast_vs_actual(con, start, end),
    }


def _utilization(con, start: pd.Timestamp, end: pd.Timestamp) -> list[dict]:
    """Per cluster: GPU-hours the dispatched attempts ran in [start, end) while the loop ran (first plan to last
    plan + 1 h), against the cluster's GPUs over the same hours."""
    if not _has(con, "plan.plans", "plan.assignments"):
        return []
    first, last = con.execute(
        "SELECT min(plan_time), max(plan_time) FROM plan.plans WHERE plan_time >= ? AND plan_time < ?",
        [start.to_pydatetime(), end.to_pydatetime()],
    ).fetchone()
    if first is None:
        return []
    lo, hi = utc(first), min(utc(last) + HOUR, end)
    used = con.execute(
        """
        SELECT r.cluster, any_value(r.region) AS region, count(*) AS attempts,
               sum(a.gpu_count * a.gpu_milli / 1000.0
                   * greatest(0, epoch(least(coalesce(r.ended_at, $hi), $hi) - greatest(r.started_at, $lo)))
                   / 3600.0) AS gpu_hours
        FROM marts.job_runs AS r
        JOIN plan.assignments AS a ON a.plan_id = r.plan_id AND a.job_id = r.planner_job_id
        WHERE r.started_at IS NOT NULL AND r.started_at < $hi AND coalesce(r.ended_at, $hi) > $lo
        GROUP BY r.cluster ORDER BY r.cluster
        """,
        {"lo": lo.to_pydatetime(), "hi": hi.to_pydatetime()},
    ).df()
    hours = (hi - lo) / HOUR
    gpus = fleet_gpus()
    out = []
    for row in _rows(used):
        n = gpus.get(row["cluster"])
        pct = 100.0 * row["gpu_hours"] / (n * hours) if n and hours else None
        out.append({**row, "gpus": n, "hours": hours, "utilization_pct": None if pct is None else round(pct, 2)})
    return out


def _forecast_vs_actual(con, start: pd.Timestamp, end: pd.Timestamp) -> list[dict]:
    """Per region, the started attempts of jobs submitted in [start, end): their planned windows at the forecast
    the plan used (expected kgCO2e) and at the actual intensity, the forecast's error, the realized carbon."""
    return _rows(
        con.execute(
            """
            SELECT region, count(*) AS attempts,
                   round(sum(expected_kgco2e), 6) AS forecast_kgco2e,
                   round(sum(planned_window_actual_kgco2e), 6) AS actual_kgco2e,
                   round(100.0 * (sum(expected_kgco2e) - sum(planned_window_actual_kgco2e))
                         / nullif(sum(planned_window_actual_kgco2e), 0), 2) AS forecast_error_pct,
                   round(avg(mean_ci_gco2_per_kwh), 1) AS mean_actual_gco2_per_kwh,
                   round(sum(realized_kgco2e), 6) AS realized_kgco2e
            FROM marts.job_runs
            WHERE started_at IS NOT NULL AND submitted_at >= ? AND submitted_at < ?
            GROUP BY region ORDER BY region
            """,
            [start.to_pydatetime(), end.to_pydatetime()],
        ).df()
    )


# ------------------------------------------------------------------------------------------------ plan


def current_plan(con, plan_id: str | None = None) -> dict:
    """The newest plan (or `plan_id`): meta, assignments, the intensity behind each cluster, the jobs that wait."""
    if not _has(con, "plan.plans", "plan.assignments"):
        return {"plan": None}
    if plan_id is None:
        row = con.execute("SELECT plan_id FROM plan.plans ORDER BY plan_time DESC, plan_id LIMIT 1").fetchone()
        if row is None:
            return {"plan": None}
        plan_id = row[0]
    meta = con.execute("SELECT * FROM plan.plans WHERE plan_id = ?", [plan_id]).df()
    if meta.empty:
        return {"plan": None, "missing": plan_id}
    plan = meta.iloc[0].to_dict()
    t0 = utc(plan["plan_time"])
    assignments = con.execute(
        """
        SELECT a.job_id, a.cluster, a.region, a.zone, a.node, a.gpu_count, a.gpu_milli, a.start_time, a.end_time,
               a.deadline, a.expected_kgco2e, a.status, a.late, e.record::VARCHAR AS record
        FROM plan.assignments AS a
        LEFT JOIN plan.explanations AS e ON e.plan_id = a.plan_id AND e.job_id = a.job_id
        WHERE a.plan_id = ? ORDER BY a.cluster, a.start_time, a.job_id
        """,
        [plan_id],
    ).df()
    unplaced = con.execute("SELECT job_id, reason FROM plan.unplaced WHERE plan_id = ? ORDER BY job_id", [plan_id]).df()
    clusters = (
        assignments.groupby("cluster", sort=True).agg(region=("region", "first"), zone=("zone", "first")).reset_index()
    )
    waiting = [_why_waiting(row, t0) for row in _rows(assignments) if utc(row["start_time"]) > t0]
    waiting += [{"job_id": r["job_id"], "starts": None, "why": f"not placed: {r['reason']}"} for r in _rows(unplaced)]
    return {
        "plan": plan,
        "span": {"start": t0, "end": t0 + PLAN_HOURS * HOUR},
        "clusters": _rows(clusters),
        "assignments": _rows(assignments.drop(columns=["record"])),
        "intensity": _intensity(con, t0, sorted(set(clusters["zone"].dropna()))),
        "waiting": waiting,
        "queued": _queued(con, t0, {w["job_id"]: w["why"] for w in waiting}),
    }


def _why_waiting(row: dict, t0: pd.Timestamp) -> dict:
    """The reason a planned job does not start at the plan time, from its explanation record."""
    record = json.loads(row["record"]) if isinstance(row.get("record"), str) else {}
    cf = record.get("counterfactuals") or {}
    run_now, chosen = cf.get("run_now_kgco2e"), row["expected_kgco2e"]
    hours = (utc(row["start_time"]) - t0) / HOUR
    why = f"waits {hours:.0f} h for {row['region']} ({row['cluster']}): {chosen:.3f} kgCO2e expected"
    if run_now:
        why += f" against {run_now:.3f} if run now ({100.0 * (run_now - chosen) / run_now:.1f} % less)"
    constraints = record.get("binding_constraints") or []
    if constraints:
        why += "; binding: " + ", ".join(str(c) for c in constraints)
    return {"job_id": row["job_id"], "starts": row["start_time"], "why": why}


def _intensity(con, t0: pd.Timestamp, zones: list[str]) -> dict:
    """Per zone over the timeline: the stored forecast (p10, p50, p90 of the latest issue at or before t0) where
    forecast.forecasts has one, else the seasonal-naive forecast the planner falls back to (the same hour on the
    last day known at t0), as {source, hours: [{time, p10, p50, p90}]}."""
    out = {}
    end = t0 + PLAN_HOURS * HOUR
    stored = pd.DataFrame()
    if zones and _has(con, "forecast.forecasts"):
        stored = con.execute(
            f"""
            WITH latest AS (
                SELECT region, max(issued_at) AS issued_at FROM forecast.forecasts
                WHERE target = 'carbon_intensity' AND issued_at <= ? AND region IN ({", ".join("?" for _ in zones)})
                GROUP BY region
            )
            SELECT f.region, f.target_time AS time, avg(f.p10) AS p10, avg(f.p50) AS p50, avg(f.p90) AS p90
            FROM forecast.forecasts AS f JOIN latest USING (region, issued_at)
            WHERE f.target = 'carbon_intensity' AND f.target_time >= ? AND f.target_time < ?
                  AND NOT coalesce(f.is_fallback, false)
            GROUP BY f.region, f.target_time ORDER BY f.region, time
            """,
            [t0.to_pydatetime(), *zones, t0.to_pydatetime(), end.to_pydatetime()],
        ).df()
    actual = pd.DataFrame()
    if zones and _has(con, "marts.grid_hourly"):
        actual = con.execute(
            f"""
            SELECT region, hour_utc AS time, carbon_intensity_direct_gco2_per_kwh AS ci FROM marts.grid_hourly
            WHERE region IN ({", ".join("?" for _ in zones)}) AND hour_utc >= ? AND hour_utc < ?
            """,
            [*zones, (t0 - pd.Timedelta(days=2)).to_pydatetime(), t0.to_pydatetime()],
        ).df()
    for zone in zones:
        part = stored[stored["region"] == zone] if len(stored) else stored
        if len(part):
            out[zone] = {"source": "forecast.forecasts", "hours": _rows(part.drop(columns=["region"]))}
            continue
        known = actual[actual["region"] == zone] if len(actual) else actual
        by_time = {utc(t): v for t, v in zip(known.get("time", []), known.get("ci", []))}
        hours = []
        for h in range(PLAN_HOURS):
            t = t0 + h * HOUR
            back = t - pd.Timedelta(days=1 + h // 24)
            value = by_time.get(back)
            hours.append({"time": t, "p10": None, "p50": value, "p90": None})
        out[zone] = {"source": "seasonal naive (same hour, last known day)", "hours": hours}
    return out


def _queued(con, t0: pd.Timestamp, reasons: dict[str, str]) -> list[dict]:
    """queue.jobs waiting for a plan or a dispatch (queued, planned), oldest first, each with why it waits: the
    plan's reason, or that it came after the plan."""
    if not _has(con, JOBS):
        return []
    rows = _rows(
        con.execute(
            f"SELECT tenant, job_id, state, submitted_at, deadline, est_duration_h, attempts FROM {JOBS} "
            "WHERE state IN ('queued', 'planned') ORDER BY submitted_at, tenant, job_id"
        ).df()
    )
    for row in rows:
        why = reasons.get(f"{row['tenant']}/{row['job_id']}")
        if why is None:
            after = utc(row["submitted_at"]) > t0
            why = "submitted after this plan: the next hourly plan places it" if after else "not in this plan"
        row["why"] = why
    return rows


# ------------------------------------------------------------------------------------------------ job


def job_page(con, tenant: str, job_id: str) -> dict:
    """One job: `found` False when the queue does not know it; else the queue's document (spec, system, history,
    decisions), its attempts (marts.job_runs) and its ledger row (marts.carbon_ledger)."""
    if not _has(con, JOBS, HISTORY):
        return {"found": False, "job": f"{tenant}/{job_id}"}
    try:
        doc = job_document(con, (tenant, job_id))
    except UnknownJob:
        return {"found": False, "job": f"{tenant}/{job_id}"}
    runs, ledger_row = [], None
    if _has(con, *LEDGER_TABLES):
        runs = _rows(
            con.execute(
                "SELECT * FROM marts.job_runs WHERE tenant = ? AND job_id = ? ORDER BY attempt, plan_id",
                [tenant, job_id],
            ).df()
        )
        found = con.execute("SELECT * FROM marts.carbon_ledger WHERE tenant = ? AND job_id = ?", [tenant, job_id]).df()
        ledger_row = _rows(found)[0] if len(found) else None
    power = []
    if _has(con, POWER_CHANGES):
        found = con.execute(
            f"SELECT * FROM {POWER_CHANGES} WHERE job_id = ? ORDER BY changed_at", [f"{tenant}/{job_id}"]
        ).df()
        power = [{**row, "text": explain_change(row)} for row in _rows(found)]
    preemptions = []
    if _has(con, PREEMPTIONS):
        found = con.execute(
            f"SELECT * FROM {PREEMPTIONS} WHERE job_id = ? ORDER BY preempt_at", [f"{tenant}/{job_id}"]
        ).df()
        preemptions = [{**row, "text": explain_pause(row)} for row in _rows(found)]
    return {
        "found": True, **doc, "runs": runs, "ledger": ledger_row, "power_changes": power, "preemptions": preemptions,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ services

PROVISIONS = "plan.service_provisions"
# what the service page shows of each hour
SERVICE_HOUR_COLUMNS = (
    "hour_utc", "clusters", "replicas", "gpus", "demand_tokens_per_s", "tokens", "kgco2e", "g_per_1k_tokens",
    "static_gpus", "static_g_per_1k_tokens", "slo_met", "latency_ms", "latency_slo_ms",
)  # fmt: skip


def services(con, days: int = WINDOW_DAYS) -> dict:
    """Every service of the ledger's last `days` days (up to its latest hour): `service_totals` per service."""
    if not _has(con, SERVICE_LEDGER):
        return {"window": None, "services": []}
    last = con.execute(f"SELECT max(hour_utc) FROM {SERVICE_LEDGER}").fetchone()[0]
    if last is None:
        return {"window": None, "services": []}
    end = utc(last) + HOUR
    start = end - pd.Timedelta(days=days)
    hours = con.execute(
        f"SELECT * FROM {SERVICE_LEDGER} WHERE hour_utc >= ? AND hour_utc < ? ORDER BY service, hour_utc",
        [start.to_pydatetime(), end.to_pydatetime()],
    ).df()
    rows = [{"service": name, **service_totals(part)} for name, part in hours.groupby("service", sort=True)]
    return {"window": {"start": start, "end": end, "days": days}, "services": rows}


def service_page(con, tenant: str, service_id: str, days: int = WINDOW_DAYS) -> dict:
    """One service: its totals, hour by hour over the last `days` days of its ledger (load, GPUs, replicas,
    gCO2e per 1k tokens served and static, target met) and the latest plans' provisions with their explanation."""
    name = f"{tenant}/{service_id}"
    doc = {"service": name, "totals": None, "hours": [], "provisions": []}
    if _has(con, SERVICE_LEDGER):
        last = con.execute(f"SELECT max(hour_utc) FROM {SERVICE_LEDGER} WHERE service = ?", [name]).fetchone()[0]
        if last is not None:
            start = utc(last) + HOUR - pd.Timedelta(days=days)
            full = con.execute(
                f"SELECT * FROM {SERVICE_LEDGER} WHERE service = ? AND hour_utc >= ? ORDER BY hour_utc",
                [name, start.to_pydatetime()],
            ).df()
            doc["totals"] = service_totals(full)
            doc["hours"] = _rows(full[list(SERVICE_HOUR_COLUMNS)])
    if _has(con, PROVISIONS):
        doc["provisions"] = _rows(
            con.execute(
                f"SELECT plan_time, cluster, replicas, gpus, batch_cap, planned_tokens_per_s, predicted_latency_ms, "
                f"expected_kgco2e, explanation FROM {PROVISIONS} WHERE service = ? ORDER BY plan_time DESC LIMIT 24",
                [name],
            ).df()
        )
    return doc
