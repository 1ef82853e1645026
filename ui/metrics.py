"""The planner's state as Prometheus metrics (`/carbon/metrics`), read from the warehouse through the pages'
read-only path. Names follow Prometheus' conventions: base units (seconds, grams, ratios), `_total` counters,
labels of bounded cardinality only (state, tenant, service, cluster, zone, region, executor, step; never a job).

* **queue**: jobs per state and tenant; the oldest waiting job's age and the jobs at risk, at the last planning hour.
* **loop** (`ops.loop_steps`): the last planning hour and when it was written, each step's duration and failure,
  executors reachable, jobs unconfirmed, dispatches failed.
* **carbon** (`marts.carbon_ledger`, `marts.service_ledger`, the action logs): realized, run-now and saved gCO2e,
  jobs ended and deadlines met, missed and regretted per cluster; preemptions and power-limit changes; services'
  tokens, gCO2e and latency-target hours.
* **inputs**: the newest grid hour per zone and its age, the forecasts' issue age and latest error, model versions.
* **GPUs**: allocated GPU-milli per cluster against the fleet the last plan used.

Ages are taken at the last planning hour (the loop's own clock, so a replay reads as a live fleet would); the
alerts on a stalled planner compare the wall-clock time a step was written with Prometheus' `time()`.

A scrape never waits for a DAG that writes: `MetricsCache` answers with the last snapshot and refreshes it in the
background once it is older than its `max_age_s` (the first scrape of a process reads synchronously).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import duckdb
import pandas as pd
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from forecasting.base import TARGET_COLUMNS
from scheduling.executors.power_log import TABLE as POWER_CHANGES
from scheduling.executors.preempt_log import TABLE as PREEMPTIONS
from scheduling.output.ledger import SERVICE_LEDGER
from scheduling.output.loop_log import TABLE as LOOP_STEPS
from scheduling.queue.store import JOBS
from warehouse.db import WarehouseLockTimeout, reader, table_exists

log = logging.getLogger(__name__)
PREFIX = "carbon_planner"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_AGE_S = 15.0  # a snapshot older than this is refreshed in the background on the next scrape
READ_TIMEOUT_S = 2.0  # how long a refresh waits for a writer before it keeps the last snapshot
WAITING = ("queued", "planned")
LIVE = ("dispatched", "running")
# the assignment each dispatched or running job runs under: the one its latest sent dispatch carried out
LIVE_RUNS = f"""
    WITH live AS (
        SELECT tenant || '/' || job_id AS job_id FROM {JOBS} WHERE state IN ({", ".join(f"'{s}'" for s in LIVE)})
    ), last_dispatch AS (
        SELECT job_id, arg_max(plan_id, plan_id) AS plan_id FROM plan.dispatch_log WHERE status = 'sent' GROUP BY job_id
    )
    SELECT a.* FROM live JOIN last_dispatch USING (job_id) JOIN plan.assignments a USING (plan_id, job_id)
"""


def _ts(value) -> float | None:
    """Unix seconds of a timestamp (None for NULL)."""
    if value is None or pd.isna(value):
        return None
    t = pd.Timestamp(value)
    return (t.tz_localize("UTC") if t.tzinfo is None else t).timestamp()


def _gauge(name: str, doc: str, labels=()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def _counter(name: str, doc: str, labels=()) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


class PlannerCollector:
    """A prometheus_client collector over one read-only connection (see the module doc)."""

    def __init__(self, con: duckdb.DuckDBPyConnection | None):
        self.con = con

    def _has(self, *tables: str) -> bool:
        return self.con is not None and all(table_exists(self.con, t) for t in tables)

    def _df(self, sql: str, params=()) -> pd.DataFrame:
        return self.con.execute(sql, list(params)).df()

    def last_plan_time(self) -> pd.Timestamp | None:
        """The newest planning hour a plan step completed (else the newest stored plan)."""
        row = None
        if self._has(LOOP_STEPS):
            row = self.con.execute(
                f"SELECT max(plan_time) FROM {LOOP_STEPS} WHERE step = 'plan' AND error IS NULL"
            ).fetchone()
        if (row is None or row[0] is None) and self._has("plan.plans"):
            row = self.con.execute("SELECT max(plan_time) FROM plan.plans").fetchone()
        return None if row is None or row[0] is None else pd.Timestamp(row[0]).tz_convert("UTC")

    def fleet(self, T) -> dict[str, dict]:
        """{cluster: {gpus, zone}} of the fleet the plan of hour T used ({} where not recorded)."""
        if T is None or not self._has(LOOP_STEPS):
            return {}
        row = self.con.execute(
            f"SELECT fleet FROM {LOOP_STEPS} WHERE step = 'plan' AND plan_time = ?", [T.to_pydatetime()]
        ).fetchone()
        return json.loads(row[0]) if row is not None and row[0] else {}

    def collect(self) -> Iterator:
        T = self.last_plan_time()
        yield from self.queue(T)
        yield from self.loop(T)
        yield from self.carbon()
        yield from self.services()
        fleet = self.fleet(T)
        yield from self.inputs(T, fleet)
        yield from self.gpus(T, fleet)

    # -------------------------------------------------------------------------------------------- queue
    def queue(self, T) -> Iterator:
        jobs = _gauge("queue_jobs", "Jobs in the queue per state and tenant.", ["state", "tenant"])
        oldest = _gauge("queue_oldest_waiting_age_seconds", "Age of the oldest queued or planned job at the last "
                        "planning hour (0 when none waits).")  # fmt: skip
        risk = _gauge("queue_jobs_at_risk", "Jobs at risk at the last planning hour: waiting jobs whose latest start "
                      "(deadline - run time) is within the next hour, and runs planned to end after their deadline.",
                      ["reason"])  # fmt: skip
        if self._has(JOBS):
            counts = self._df(f"SELECT state, tenant, count(*) AS n FROM {JOBS} GROUP BY ALL ORDER BY ALL")
            for r in counts.itertuples(index=False):
                jobs.add_metric([r.state, r.tenant], float(r.n))
            if T is not None:
                age, late_start, late_run = self._risk(T)
                oldest.add_metric([], age)
                risk.add_metric(["latest_start"], float(late_start))
                risk.add_metric(["projected_late"], float(late_run))
        yield from (jobs, oldest, risk)

    def _risk(self, T: pd.Timestamp) -> tuple[float, int, int]:
        marks = ", ".join(f"'{s}'" for s in WAITING)
        t = T.to_pydatetime()
        waiting = self._df(
            f"SELECT tenant || '/' || job_id AS job_id, submitted_at, deadline, est_duration_h FROM {JOBS} "
            f"WHERE state IN ({marks}) AND submitted_at <= ?",
            [t],
        )
        age = 0.0
        if len(waiting):
            age = max(0.0, (T - pd.Timestamp(waiting["submitted_at"].min()).tz_convert("UTC")).total_seconds())
        planned = pd.DataFrame(columns=["job_id", "run_now_duration_h", "end_time", "deadline"])
        if self._has("plan.assignments", "plan.plans"):
            planned = self._df(
                "SELECT a.job_id, a.run_now_duration_h, a.end_time, a.deadline FROM plan.assignments a "
                "JOIN plan.plans p USING (plan_id) WHERE p.plan_time = ?",
                [t],
            )
        hours = waiting.merge(planned[["job_id", "run_now_duration_h"]], on="job_id", how="left")
        run_h = hours["run_now_duration_h"].fillna(hours["est_duration_h"]).astype(float)
        latest = pd.to_datetime(hours["deadline"], utc=True) - pd.to_timedelta(run_h, unit="h")
        late_start = int((latest.notna() & (latest <= T + pd.Timedelta(hours=1))).sum())
        ends, due = pd.to_datetime(planned["end_time"], utc=True), pd.to_datetime(planned["deadline"], utc=True)
        late_run = int((due.notna() & (ends > due)).sum()) + self._running_late()
        return age, late_start, late_run

    def _running_late(self) -> int:
        """Running or dispatched jobs whose dispatching plan ends them after their deadline."""
        if not self._has(JOBS, "plan.assignments", "plan.dispatch_log"):
            return 0
        return int(
            self.con.execute(
                f"SELECT count(*) FROM ({LIVE_RUNS}) WHERE deadline IS NOT NULL AND end_time > deadline"
            ).fetchone()[0]
        )

    # -------------------------------------------------------------------------------------------- loop
    def loop(self, T) -> Iterator:
        last = _gauge("loop_last_plan_time_seconds", "The last planning hour whose plan step completed (Unix time).")
        written = _gauge("loop_last_plan_written_timestamp_seconds",
                         "Wall-clock time that plan step finished (Unix time): time() minus this is how long "
                         "the planner has not planned.")  # fmt: skip
        lag = _gauge("loop_lag_seconds", "Wall-clock seconds from the last completed plan step to this snapshot.")
        duration = _gauge("loop_step_duration_seconds", "Duration of each step's latest run.", ["step"])
        failed = _gauge("loop_step_failed", "1 when each step's latest run raised.", ["step"])
        reachable = _gauge("executor_reachable", "1 when the last hour's sync and dispatch reached the executor.",
                           ["executor"])  # fmt: skip
        unconfirmed = _gauge("loop_unconfirmed_jobs", "Jobs an executor could not confirm in the last sync.")
        failures = _counter("dispatch_failures", "Jobs and actions whose dispatch failed, summed over the hours.")
        standing = _gauge("dispatch_failed_jobs", "Jobs whose dispatch stands failed (a re-run retries them).",
                          ["executor"])  # fmt: skip
        if T is not None:
            last.add_metric([], T.timestamp())
        if self._has(LOOP_STEPS):
            steps = self._df(
                f"SELECT * FROM {LOOP_STEPS} QUALIFY row_number() OVER (PARTITION BY step ORDER BY plan_time DESC, "
                "finished_at DESC) = 1 ORDER BY step"
            )
            for r in steps.to_dict(orient="records"):
                duration.add_metric([r["step"]], float(r["duration_s"]))
                failed.add_metric([r["step"]], 0.0 if r["error"] is None else 1.0)
                if r["step"] == "sync":
                    unconfirmed.add_metric([], float(r["unconfirmed"] or 0))
            done = self._df(
                f"SELECT finished_at FROM {LOOP_STEPS} WHERE step = 'plan' AND error IS NULL "
                "ORDER BY plan_time DESC, finished_at DESC LIMIT 1"
            )
            if len(done):
                written.add_metric([], _ts(done["finished_at"].iat[0]))
                lag.add_metric([], max(0.0, time.time() - _ts(done["finished_at"].iat[0])))
            hour = self._df(
                f"SELECT executors, unreachable FROM {LOOP_STEPS} WHERE step IN ('sync', 'dispatch') "
                f"AND plan_time = (SELECT max(plan_time) FROM {LOOP_STEPS} WHERE step = 'sync')"
            )
            names, down = set(), set()
            for r in hour.to_dict(orient="records"):
                names.update(r["executors"] if r["executors"] is not None else ())
                down.update(r["unreachable"] if r["unreachable"] is not None else ())
            for name in sorted(names | down):
                reachable.add_metric([name], 0.0 if name in down else 1.0)
            total = self.con.execute(f"SELECT coalesce(sum(dispatch_failed), 0) FROM {LOOP_STEPS}").fetchone()[0]
            failures.add_metric([], float(total))
        if self._has("plan.dispatch_log"):
            rows = self._df(
                "SELECT executor, count(*) FILTER (WHERE status = 'failed') AS n FROM plan.dispatch_log "
                "GROUP BY executor ORDER BY executor"
            )
            for r in rows.itertuples(index=False):
                standing.add_metric([r.executor], float(r.n))
        yield from (last, written, lag, duration, failed, reachable, unconfirmed, failures, standing)

    # -------------------------------------------------------------------------------------------- carbon
    def carbon(self) -> Iterator:
        realized = _counter("realized_co2e_grams", "gCO2e the ended jobs emitted, per cluster (carbon ledger).",
                            ["cluster"])  # fmt: skip
        run_now = _counter("run_now_co2e_grams", "gCO2e the finished jobs would have emitted run at once at home "
                           "(the run-now counterfactual), per cluster.", ["cluster"])  # fmt: skip
        saved = _counter("saved_co2e_grams", "Run-now minus realized gCO2e of the finished jobs, per cluster.",
                         ["cluster"])  # fmt: skip
        ended = _counter("jobs_ended", "Jobs ended per cluster and outcome (finished, failed, cancelled).",
                         ["cluster", "outcome"])  # fmt: skip
        deadlines = _counter("deadlines", "Finished jobs per cluster by deadline result (met, missed).",
                             ["cluster", "result"])  # fmt: skip
        regrets = _counter("deadline_regrets", "Jobs late although run at once they would have been on time.",
                           ["cluster"])  # fmt: skip
        saving = _gauge("saving_ratio", "Saved over run-now gCO2e, fleet-wide (the ledger's saving_pct / 100).")
        met = _gauge("deadlines_met_ratio", "Finished jobs on time over finished jobs, fleet-wide.")
        regret = _gauge("deadline_regret_ratio", "Deadline regrets over finished jobs, fleet-wide.")
        preempted = _counter("preemptions", "Preemptions carried out per cluster.", ["cluster"])
        power = _counter("power_limit_changes", "Power-limit changes of running jobs carried out per cluster.",
                         ["cluster"])  # fmt: skip
        if self._has("marts.carbon_ledger"):
            rows = self._df(
                """
                SELECT coalesce(cluster, '') AS cluster,
                       count(*) FILTER (WHERE outcome = 'finished') AS finished,
                       count(*) FILTER (WHERE outcome = 'failed') AS failed,
                       count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
                       count(*) FILTER (WHERE outcome = 'finished' AND deadline_met) AS met,
                       count(*) FILTER (WHERE deadline_regret) AS regrets,
                       coalesce(sum(realized_kgco2e), 0) AS realized,
                       coalesce(sum(realized_kgco2e) FILTER (WHERE counterfactual_kgco2e IS NOT NULL), 0) AS valued,
                       coalesce(sum(counterfactual_kgco2e), 0) AS run_now
                FROM marts.carbon_ledger GROUP BY ALL ORDER BY ALL
                """
            )
            for r in rows.itertuples(index=False):
                c = [r.cluster]
                realized.add_metric(c, 1000.0 * r.realized)
                run_now.add_metric(c, 1000.0 * r.run_now)
                saved.add_metric(c, 1000.0 * (r.run_now - r.valued))
                for outcome in ("finished", "failed", "cancelled"):
                    ended.add_metric([r.cluster, outcome], float(getattr(r, outcome)))
                deadlines.add_metric([r.cluster, "met"], float(r.met))
                deadlines.add_metric([r.cluster, "missed"], float(r.finished - r.met))
                regrets.add_metric(c, float(r.regrets))
            finished = float(rows["finished"].sum())
            counterfactual = float(rows["run_now"].sum())
            if counterfactual:
                saving.add_metric([], (counterfactual - float(rows["valued"].sum())) / counterfactual)
            if finished:
                met.add_metric([], float(rows["met"].sum()) / finished)
                regret.add_metric([], float(rows["regrets"].sum()) / finished)
        for family, table in ((preempted, PREEMPTIONS), (power, POWER_CHANGES)):
            if self._has(table):
                for r in self._df(f"SELECT cluster, count(*) AS n FROM {table} WHERE status = 'sent' "
                                  "GROUP BY ALL ORDER BY ALL").itertuples(index=False):  # fmt: skip
                    family.add_metric([r.cluster], float(r.n))
        yield from (realized, run_now, saved, ended, deadlines, regrets, saving, met, regret, preempted, power)

    def services(self) -> Iterator:
        labels = ["tenant", "service"]
        tokens = _counter("service_output_tokens", "Output tokens each service served.", labels)
        grams = _counter("service_co2e_grams", "gCO2e each service emitted (hours with a known intensity).", labels)
        static = _counter("service_static_co2e_grams", "gCO2e static provisioning for the peak at home would have "
                          "emitted serving the same demand.", labels)  # fmt: skip
        hours = _counter("service_hours", "Service-hours by latency target result (met, missed).",
                         [*labels, "result"])  # fmt: skip
        per_1k = _gauge("service_co2e_grams_per_1k_tokens", "gCO2e per 1000 output tokens served.", labels)
        slo = _gauge("service_slo_attainment_ratio", "Service-hours within the latency target over all.", labels)
        if self._has(SERVICE_LEDGER):
            rows = self._df(
                f"""
                SELECT tenant, service_id, count(*) AS hours, count(*) FILTER (WHERE slo_met) AS met,
                       coalesce(sum(tokens) FILTER (WHERE NOT missing_intensity), 0) AS tokens,
                       coalesce(sum(kgco2e) FILTER (WHERE NOT missing_intensity), 0) AS kg,
                       coalesce(sum(static_kgco2e) FILTER (WHERE NOT missing_intensity), 0) AS static_kg
                FROM {SERVICE_LEDGER} GROUP BY ALL ORDER BY ALL
                """
            )
            for r in rows.itertuples(index=False):
                s = [r.tenant, r.service_id]
                tokens.add_metric(s, float(r.tokens))
                grams.add_metric(s, 1000.0 * r.kg)
                static.add_metric(s, 1000.0 * r.static_kg)
                hours.add_metric([*s, "met"], float(r.met))
                hours.add_metric([*s, "missed"], float(r.hours - r.met))
                if r.tokens:
                    per_1k.add_metric(s, 1e6 * r.kg / r.tokens)
                if r.hours:
                    slo.add_metric(s, float(r.met) / r.hours)
        yield from (tokens, grams, static, hours, per_1k, slo)

    # -------------------------------------------------------------------------------------------- inputs
    def inputs(self, T, fleet: dict[str, dict]) -> Iterator:
        newest = _gauge("grid_newest_hour_timestamp_seconds", "The newest hour of grid data per zone (Unix time).",
                        ["zone"])  # fmt: skip
        age = _gauge("grid_data_age_seconds", "The last planning hour minus the newest grid hour at or before it.",
                     ["zone"])  # fmt: skip
        issue_age = _gauge("forecast_issue_age_seconds", "The last planning hour minus the newest forecast issued at "
                           "or before it, per region.", ["region"])  # fmt: skip
        error = _gauge("forecast_latest_mape_ratio", "Mean absolute percentage error (ratio) of the newest issued "
                       "carbon-intensity forecast's p50 over its hours that have happened, per region.",
                       ["region"])  # fmt: skip
        actual = _gauge("grid_intensity_gco2_per_kwh", "Carbon intensity of each zone's grid at the last planning "
                        "hour (the newest hour known at it).", ["zone"])  # fmt: skip
        forecast = _gauge("forecast_intensity_gco2_per_kwh", "The stored forecast of the last planning hour's "
                          "intensity, from the newest issue at or before it (mean over models), per quantile.",
                          ["zone", "quantile"])  # fmt: skip
        models = InfoMetricFamily(f"{PREFIX}_model", "Registered model versions.",
                                  labels=["model", "target", "version", "status"])  # fmt: skip
        t = None if T is None else T.to_pydatetime()
        if self._has("marts.grid_hourly"):
            zones = self._df(
                "SELECT region, max(hour_utc) AS newest, max(hour_utc) FILTER (WHERE hour_utc <= ?) AS known "
                "FROM marts.grid_hourly GROUP BY ALL ORDER BY ALL",
                [t],
            )
            used = {c["zone"] for c in fleet.values()}
            column = TARGET_COLUMNS["carbon_intensity"]
            for r in zones.to_dict("records"):
                if used and r["region"] not in used:  # a zone no cluster of the fleet is in
                    continue
                if _ts(r["newest"]) is not None:
                    newest.add_metric([r["region"]], _ts(r["newest"]))
                if T is not None and _ts(r["known"]) is not None:
                    age.add_metric([r["region"]], T.timestamp() - _ts(r["known"]))
                    value = self.con.execute(
                        f"SELECT {column} FROM marts.grid_hourly WHERE region = ? AND hour_utc = ?",
                        [r["region"], r["known"]],
                    ).fetchone()
                    if value is not None and value[0] is not None:
                        actual.add_metric([r["region"]], float(value[0]))
        if T is not None and self._has("forecast.forecasts"):
            issues = self._df(
                "SELECT region, max(issued_at) AS issued_at FROM forecast.forecasts "
                "WHERE target = 'carbon_intensity' AND issued_at <= ? GROUP BY ALL ORDER BY ALL",
                [t],
            )
            for r in issues.to_dict("records"):
                issue_age.add_metric([r["region"]], T.timestamp() - _ts(r["issued_at"]))
            now = self._df(
                """
                WITH latest AS (
                    SELECT region, max(issued_at) AS issued_at FROM forecast.forecasts
                    WHERE target = 'carbon_intensity' AND issued_at <= ? GROUP BY region
                )
                SELECT f.region, avg(f.p10) AS p10, avg(f.p50) AS p50, avg(f.p90) AS p90
                FROM forecast.forecasts f JOIN latest USING (region, issued_at)
                WHERE f.target = 'carbon_intensity' AND f.target_time = ? AND NOT coalesce(f.is_fallback, false)
                GROUP BY f.region ORDER BY f.region
                """,
                [t, t],
            )
            for r in now.to_dict("records"):
                for q, key in (("0.1", "p10"), ("0.5", "p50"), ("0.9", "p90")):
                    if r[key] is not None and not pd.isna(r[key]):
                        forecast.add_metric([r["region"], q], float(r[key]))
            if self._has("marts.grid_hourly") and len(issues):
                column = TARGET_COLUMNS["carbon_intensity"]
                scored = self._df(
                    f"""
                    WITH latest AS (
                        SELECT region, max(issued_at) AS issued_at FROM forecast.forecasts
                        WHERE target = 'carbon_intensity' AND issued_at <= ? AND target_time <= ? GROUP BY region
                    )
                    SELECT f.region, avg(abs(f.p50 - g.{column}) / g.{column}) AS mape
                    FROM forecast.forecasts f JOIN latest USING (region, issued_at)
                    JOIN marts.grid_hourly g ON g.region = f.region AND g.hour_utc = f.target_time
                    WHERE f.target = 'carbon_intensity' AND f.target_time <= ? AND g.{column} > 0
                    GROUP BY f.region ORDER BY f.region
                    """,
                    [t, t, t],
                )
                for r in scored.itertuples(index=False):
                    error.add_metric([r.region], float(r.mape))
        if self._has("model.registry"):
            for r in self._df("SELECT DISTINCT model_name, target, version, status FROM model.registry "
                              "ORDER BY ALL").itertuples(index=False):  # fmt: skip
                models.add_metric([r.model_name, r.target, r.version, str(r.status)], {})
        yield from (newest, age, actual, issue_age, forecast, error, models)

    # -------------------------------------------------------------------------------------------- GPUs
    def gpus(self, T, fleet: dict[str, dict]) -> Iterator:
        allocated = _gauge("gpu_milli_allocated", "GPU-milli held at the last planning hour per cluster: the runs "
                           "dispatched or running (as their plan placed them) and the services' replicas.",
                           ["cluster"])  # fmt: skip
        capacity = _gauge("gpu_milli_capacity", "GPU-milli of each cluster in the fleet the last plan used.",
                          ["cluster"])  # fmt: skip
        held: dict[str, float] = {}
        if self._has(JOBS, "plan.assignments", "plan.dispatch_log"):
            rows = self._df(
                f"SELECT cluster, sum(gpu_milli * gpu_count) AS milli FROM ({LIVE_RUNS}) GROUP BY ALL ORDER BY ALL"
            )
            held.update({r.cluster: float(r.milli) for r in rows.itertuples(index=False)})
        if T is not None and self._has("plan.service_provisions"):
            replicas = self._df(
                "SELECT cluster, sum(gpus) AS gpus FROM plan.service_provisions WHERE plan_time = ? "
                "AND cluster IS NOT NULL GROUP BY ALL ORDER BY ALL",
                [T.to_pydatetime()],
            )
            for r in replicas.itertuples(index=False):
                held[r.cluster] = held.get(r.cluster, 0.0) + 1000.0 * float(r.gpus)
        gpus = {name: int(c["gpus"]) for name, c in fleet.items()}
        for name in sorted(set(gpus) | set(held)):
            allocated.add_metric([name], held.get(name, 0.0))
            if name in gpus:
                capacity.add_metric([name], 1000.0 * gpus[name])
        yield from (allocated, capacity)


class _Families:
    """A collector of metric families already made."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def _exposition(collector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def render(con) -> bytes:
    """The exposition text of the warehouse behind `con` (None: no warehouse yet)."""
    return _exposition(PlannerCollector(con))


def _meta(snapshot_at: float, seconds: float, busy: bool) -> bytes:
    """The snapshot's own metrics: when it was read, how long that took, whether a writer held the warehouse."""
    families = [
        _gauge("metrics_snapshot_timestamp_seconds", "When the served snapshot was read (Unix time)."),
        _gauge("metrics_read_seconds", "How long reading the snapshot took."),
        _gauge("metrics_warehouse_busy", "1 when the last refresh found a writer holding the warehouse."),
    ]
    for family, value in zip(families, (snapshot_at, seconds, 1.0 if busy else 0.0)):
        family.add_metric([], value)
    return _exposition(_Families(families))


class MetricsCache:
    """The exposition text of one warehouse, served from a snapshot (see the module doc)."""

    def __init__(self, db_path=None, max_age_s: float = MAX_AGE_S, read_timeout_s: float = READ_TIMEOUT_S):
        self.db_path, self.max_age_s, self.read_timeout_s = db_path, float(max_age_s), float(read_timeout_s)
        self._body: bytes | None = None
        self._at, self._seconds, self._busy = 0.0, 0.0, False
        self._lock = threading.Lock()
        self._refreshing = False

    @property
    def refreshing(self) -> bool:
        """Whether a background refresh is in flight."""
        return self._refreshing

    def text(self) -> bytes:
        """The metrics now: the snapshot, refreshed in the background when older than `max_age_s`."""
        if self._body is None:
            with self._lock:
                if self._body is None:
                    self._refresh()
        elif time.time() - self._at > self.max_age_s:
            with self._lock:
                start = not self._refreshing
                self._refreshing = True
            if start:
                threading.Thread(target=self._background, name="carbon-metrics", daemon=True).start()
        return (self._body or b"") + _meta(self._at, self._seconds, self._busy)

    def _background(self) -> None:
        try:
            self._refresh()
        except Exception as exc:  # noqa: BLE001 - the last snapshot stays served; the next scrape tries again
            log.warning("metrics: the warehouse could not be read: %s", exc)
        finally:
            with self._lock:
                self._refreshing = False

    def _refresh(self) -> None:
        t0 = time.perf_counter()
        try:
            try:
                with reader(self.db_path, timeout_s=self.read_timeout_s) as con:
                    body = render(con)
            except FileNotFoundError:
                body = render(None)
        except (WarehouseLockTimeout, duckdb.IOException) as exc:
            if isinstance(exc, duckdb.IOException) and "lock" not in str(exc).lower():
                raise
            self._busy = True  # keep the last snapshot; the next scrape tries again
            return
        self._body, self._at, self._seconds, self._busy = body, time.time(), time.perf_counter() - t0, False
