"""The carbon ledger: what the fleet really emitted against running every job at once, from the dbt marts.

`ledger(start, end)` sums `marts.carbon_ledger_daily` (per day of submission x tenant x region) over the days in
[start, end): realized and run-now kgCO2e, the saving, deadlines met and regretted, then per tenant, region and
day; it also reads the jobs (`marts.carbon_ledger`) and their attempts (`marts.job_runs`) for the charts.
`write_ledger_report` writes an HTML page with PNG charts: realized vs run-now per day, the saving per region and
tenant, planned vs actual start, and the run-time estimate's error.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from common.jsonutil import canonical_json
from common.timeutil import utc
from scheduling.output.charts import color, pyplot, save_figure
from warehouse.config import var_dir
from warehouse.db import reader, table_exists


@dataclass
class Ledger:
    """The ledger of one period: totals, rollups (tenant, region, day), the jobs and their attempts."""

    start: pd.Timestamp | None
    end: pd.Timestamp | None
    totals: dict
    rollups: dict[str, pd.DataFrame]
    jobs: pd.DataFrame
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    services: dict = field(default_factory=dict)  # `service_totals` per service and "all"; {} without services
    service_hours: pd.DataFrame = field(default_factory=pd.DataFrame)  # marts.service_ledger rows of the period

    def to_dict(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "totals": self.totals,
            "rollups": {k: v.to_dict(orient="records") for k, v in self.rollups.items()},
            "services": self.services,
        }


SUMS = (
    "jobs",
    "finished",
    "failed",
    "cancelled",
    "deadlines_met",
    "deadline_regrets",
    "measured_energy_jobs",
    "realized_kgco2e",
    "valued_realized_kgco2e",
    "counterfactual_kgco2e",
)
LEDGER_TABLES = ("marts.carbon_ledger_daily", "marts.carbon_ledger", "marts.job_runs")
# the dbt selection that rebuilds those marts from the loop's events and assignments and the jobs' own meter readings
# (CodeCarbon / Zeus telemetry; dbt: `<model>+` = it and everything downstream of it)
LEDGER_SELECT = (
    "stg_jobs__events+",
    "stg_jobs__assignments+",
    "stg_jobs__power_changes+",
    "stg_telemetry__gpu_telemetry+",
    "stg_services__usage+",
)
SERVICE_LEDGER = "marts.service_ledger"


def totals_of(sums: pd.Series) -> dict:
    """The figures of summed ledger rows: jobs by outcome, deadlines met (% of finished), realized and run-now
    kgCO2e, the saving (% of run-now, over the jobs that have a counterfactual), jobs with measured energy (%)."""
    jobs, finished = int(sums.get("jobs", 0)), int(sums.get("finished", 0))
    counterfactual = float(sums.get("counterfactual_kgco2e", 0.0))
    saving = counterfactual - float(sums.get("valued_realized_kgco2e", 0.0))
    return {
        "jobs": jobs,
        "finished": finished,
        "failed": int(sums.get("failed", 0)),
        "cancelled": int(sums.get("cancelled", 0)),
        "deadlines_met_pct": round(100.0 * int(sums.get("deadlines_met", 0)) / finished, 2) if finished else None,
        # late, although run now (at submission, at home, default limit) it would have been on time
        "deadline_regret_pct": round(100.0 * int(sums.get("deadline_regrets", 0)) / finished, 2) if finished else None,
        "realized_kgco2e": round(float(sums.get("realized_kgco2e", 0.0)), 6),
        "counterfactual_kgco2e": round(counterfactual, 6),
        "saving_kgco2e": round(saving, 6),
        "saving_pct": round(100.0 * saving / counterfactual, 2) if counterfactual else None,
        "measured_energy_pct": round(100.0 * int(sums.get("measured_energy_jobs", 0)) / jobs, 2) if jobs else None,
    }


def service_totals(hours: pd.DataFrame) -> dict:
    """The figures of service-hours (marts.service_ledger rows): hours, tokens, kgCO2e and gCO2e per 1k tokens,
    served and static, the reduction (% of static), the latency target's attainment (% of hours), mean GPUs. Hours
    whose zone lacks intensity are left out of the carbon figures (counted in `missing_intensity_hours`)."""
    valued = hours[~hours["missing_intensity"].astype(bool)]
    tokens, kg = float(valued["tokens"].sum()), float(valued["kgco2e"].sum())
    static_tokens, static_kg = float(valued["static_tokens"].sum()), float(valued["static_kgco2e"].sum())
    g = 1e6 * kg / tokens if tokens else None
    static_g = 1e6 * static_kg / static_tokens if static_tokens else None
    n = int(len(hours))
    return {
        "service_hours": n,
        "missing_intensity_hours": n - int(len(valued)),
        "tokens": round(tokens, 1),
        "kgco2e": round(kg, 6),
        "g_per_1k_tokens": None if g is None else round(g, 6),
        "static_kgco2e": round(static_kg, 6),
        "static_g_per_1k_tokens": None if static_g is None else round(static_g, 6),
        "reduction_pct": round(100.0 * (1.0 - g / static_g), 2) if g is not None and static_g else None,
        "slo_attainment_pct": round(100.0 * float(hours["slo_met"].astype(bool).sum()) / n, 2) if n else None,
        "static_slo_attainment_pct": (
            round(100.0 * float(hours["static_slo_met"].fillna(False).astype(bool).sum()) / n, 2) if n else None
        ),
        "mean_gpus": round(float(hours["gpus"].mean()), 2) if n else None,
        "static_gpus": round(float(hours["static_gpus"].mean()), 2) if n else None,
    }


def service_rows(services: dict) -> list[dict]:
    """`Ledger.services` as table rows for people: service-hours, tokens, gCO2e per 1k tokens served and static,
    the reduction, the latency target's attainment, GPUs."""
    return [
        {
            "service": name,
            "hours": t["service_hours"],
            "M tokens": round(t["tokens"] / 1e6, 2),
            "kgCO2e": t["kgco2e"],
            "g/1k tokens": t["g_per_1k_tokens"],
            "static g/1k": t["static_g_per_1k_tokens"],
            "reduction %": t["reduction_pct"],
            "SLO met %": t["slo_attainment_pct"],
            "static SLO %": t["static_slo_attainment_pct"],
            "GPUs (mean)": t["mean_gpus"],
            "static GPUs": t["static_gpus"],
        }
        for name, t in services.items()
    ]


def read_service_ledger(con, start=None, end=None) -> tuple[dict, pd.DataFrame]:
    """(`service_totals` per service and "all", the rows) of the service-hours in [start, end)."""
    if not table_exists(con, SERVICE_LEDGER):
        return {}, pd.DataFrame()
    clauses, params = [], []
    if start is not None:
        clauses.append("hour_utc >= ?")
        params.append(utc(start).to_pydatetime())
    if end is not None:
        clauses.append("hour_utc < ?")
        params.append(utc(end).to_pydatetime())
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    hours = con.execute(f"SELECT * FROM {SERVICE_LEDGER}{where} ORDER BY service, hour_utc", params).df()
    if hours.empty:
        return {}, hours
    out = {name: service_totals(part) for name, part in hours.groupby("service", sort=True)}
    out["all"] = service_totals(hours)
    return out, hours


def rollup(daily: pd.DataFrame, by: str) -> pd.DataFrame:
    """`totals_of` per value of `by` (tenant, region or submitted_day)."""
    sums = daily.groupby(by, sort=True)[list(SUMS)].sum()
    return pd.DataFrame([{by: key, **totals_of(row)} for key, row in sums.iterrows()])


def _days(start, end) -> tuple[str, list]:
    """A WHERE clause on submitted_day for the days of [start, end) (a partial day counts)."""
    clauses, params = [], []
    if start is not None:
        clauses.append("submitted_day >= ?")
        params.append(utc(start).date())
    if end is not None:
        clauses.append("submitted_day < ?")
        params.append((utc(end) - pd.Timedelta(microseconds=1)).date() + pd.Timedelta(days=1))
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def ledger(start=None, end=None, db_path=None) -> Ledger:
    """The ledger of the jobs submitted on the days of [start, end) (either bound optional). An empty ledger, not
    an error, when the loop has not run yet (the marts are then missing or empty)."""
    with reader(db_path) as con:
        return read_ledger(con, start, end)


def read_ledger(con, start=None, end=None) -> Ledger:
    """`ledger` on an open connection (a caller reading more beside it opens one)."""
    start = utc(start) if start is not None else None
    end = utc(end) if end is not None else None
    where, params = _days(start, end)
    services, service_hours = read_service_ledger(con, start, end)
    if not all(table_exists(con, t) for t in LEDGER_TABLES):
        empty = Ledger(start, end, totals_of(pd.Series(dtype=float)), {}, pd.DataFrame(), pd.DataFrame())
        return Ledger(**{**empty.__dict__, "services": services, "service_hours": service_hours})
    daily = con.execute(f"SELECT * FROM marts.carbon_ledger_daily{where}", params).df()
    jobs = con.execute(f"SELECT * FROM marts.carbon_ledger{where} ORDER BY tenant, job_id", params).df()
    runs = con.execute(
        "SELECT r.* FROM marts.job_runs AS r JOIN marts.carbon_ledger AS l USING (tenant, job_id)"
        + where.replace("submitted_day", "l.submitted_day")
        + " ORDER BY r.tenant, r.job_id, r.attempt, r.plan_id",
        params,
    ).df()
    if daily.empty:
        return Ledger(start, end, totals_of(pd.Series(dtype=float)), {}, jobs, runs, services, service_hours)
    rollups = {
        "tenant": rollup(daily, "tenant"),
        "region": rollup(daily, "region"),
        "day": rollup(daily, "submitted_day"),
    }
    return Ledger(start, end, totals_of(daily[list(SUMS)].sum()), rollups, jobs, runs, services, service_hours)


# ------------------------------------------------------------------------------------------------ report


def _chart_days(day: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = np.arange(len(day))
    ax.bar(x - 0.2, day["counterfactual_kgco2e"], 0.4, label="run now", color=color(1))
    ax.bar(x + 0.2, day["realized_kgco2e"], 0.4, label="realized", color=color(0))
    ax.set_xticks(x, [str(d) for d in day["submitted_day"]], rotation=45, ha="right")
    ax.set_ylabel("kgCO2e")
    ax.set_title("Realized against run-now, per day of submission")
    ax.legend()
    save_figure(fig, path)


def _chart_saving(frame: pd.DataFrame, key: str, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([str(k) for k in frame[key]], frame["saving_pct"].fillna(0.0), color=color(0))
    ax.set_xlabel("saving against run-now (%)")
    ax.set_title(f"Saving per {key}")
    save_figure(fig, path)


def _chart_start(runs: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    started = runs[runs["started_at"].notna() & runs["planned_start"].notna()]
    ax.scatter(started["planned_start"], started["started_at"], s=8, color=color(2))
    ax.set_xlabel("planned start (UTC)")
    ax.set_ylabel("actual start (UTC)")
    ax.set_title("Planned against actual start")
    fig.autofmt_xdate()
    save_figure(fig, path)


def _chart_runtime_error(runs: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    errors = runs["runtime_error_pct"].dropna()
    ax.hist(errors, bins=30, color=color(3))
    ax.set_xlabel("run time: actual against estimate (%)")
    ax.set_ylabel("attempts")
    ax.set_title("Run-time estimate error")
    save_figure(fig, path)


def _table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if pd.isna(v) else str(v))}</td>" for v in row) + "</tr>"
        for row in frame.itertuples(index=False)
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def write_ledger_report(book: Ledger, out_dir: Path | None = None) -> Path:
    """index.html + charts/*.png + data.json under `out_dir` (default var/reports/ledger/<start>_<end>/);
    returns the index path."""
    label = f"{book.start:%Y%m%dT%H}" if book.start is not None else "all"
    label += f"_{book.end:%Y%m%dT%H}" if book.end is not None else ""
    out = Path(out_dir) if out_dir else var_dir() / "reports" / "ledger" / label
    charts = out / "charts"
    sections = []
    totals = pd.DataFrame([book.totals])
    sections.append("<h2>Totals</h2>" + _table(totals))
    if not book.jobs.empty:
        _chart_days(book.rollups["day"], charts / "per_day.png")
        _chart_saving(book.rollups["region"], "region", charts / "saving_per_region.png")
        _chart_saving(book.rollups["tenant"], "tenant", charts / "saving_per_tenant.png")
        _chart_start(book.runs, charts / "planned_vs_actual_start.png")
        _chart_runtime_error(book.runs, charts / "runtime_error.png")
        for png in ("per_day", "saving_per_region", "saving_per_tenant", "planned_vs_actual_start", "runtime_error"):
            sections.append(f'<img src="charts/{png}.png" alt="{png}">')
        for key, frame in book.rollups.items():
            sections.append(f"<h2>Per {html.escape(key)}</h2>" + _table(frame))
    else:
        sections.append("<p>No job has ended in this period yet: the ledger fills as the loop runs.</p>")
    if book.services:
        rows = pd.DataFrame(service_rows(book.services))
        sections.append("<h2>Inference services</h2>" + _table(rows))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Carbon ledger</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%;margin:1em 0}</style>"
        f"</head><body><h1>Carbon ledger</h1>{''.join(sections)}</body></html>"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page)
    (out / "data.json").write_text(canonical_json(book.to_dict(), indent=2))
    return out / "index.html"
