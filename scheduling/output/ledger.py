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

    def to_dict(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "totals": self.totals,
            "rollups": {k: v.to_dict(orient="records") for k, v in self.rollups.items()},
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
)


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
    if not all(table_exists(con, t) for t in LEDGER_TABLES):
        return Ledger(start, end, totals_of(pd.Series(dtype=float)), {}, pd.DataFrame(), pd.DataFrame())
    daily = con.execute(f"SELECT * FROM marts.carbon_ledger_daily{where}", params).df()
    jobs = con.execute(f"SELECT * FROM marts.carbon_ledger{where} ORDER BY tenant, job_id", params).df()
    runs = con.execute(
        "SELECT r.* FROM marts.job_runs AS r JOIN marts.carbon_ledger AS l USING (tenant, job_id)"
        + where.replace("submitted_day", "l.submitted_day")
        + " ORDER BY r.tenant, r.job_id, r.attempt, r.plan_id",
        params,
    ).df()
    if daily.empty:
        return Ledger(start, end, totals_of(pd.Series(dtype=float)), {}, jobs, runs)
    rollups = {
        "tenant": rollup(daily, "tenant"),
        "region": rollup(daily, "region"),
        "day": rollup(daily, "submitted_day"),
    }
    return Ledger(start, end, totals_of(daily[list(SUMS)].sum()), rollups, jobs, runs)


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
