"""The evaluation report: one HTML page with PNG charts (matplotlib, Agg) and explanation cards.

    from scheduling.evaluation.report import write_report
    result = write_report(evaluation, run_id="2021-07-01_7d")   # -> ReportResult(index, files, n_cards, ...)
    print(result.index)        # var/reports/evaluate/<run>/index.html

`evaluation` is a dict (every key optional except `policies`):

* `meta`: dict shown at the top (period, days, jobs, regions, load, seed, fleet, ...).
* `policies`: DataFrame or records, one row per policy: `policy`, `kgco2e`, `deadline_met_share` (0..1),
  `unallocated_gpus` (mean idle GPUs over the period), optional `n_jobs`, `n_placed`, `energy_kwh`.
* `optimum_kgco2e`: the LP optimum's carbon (the lower bound), or None.
* `utilization`: DataFrame `time`, `policy`, `unallocated_gpus` (hourly), drawn as lines when given.
* `by_region`: DataFrame `policy`, `region`, `kgco2e`; savings per region are computed against `baseline`
  (default: the first of run-now / round-robin / performance-first found, else the worst policy).
* `timeline`: the assignments of one plan (`timeline_policy`): `job_id`, `region`, `start_time`, `end_time`
  [, `gpu_count`, `gpu_milli`].
* `forecast`: DataFrame `region`, `target_time`, `p50` [, `p10`, `p90`, `actual`]: the forecast the timeline's
  plan was made from (the P10-P90 band is drawn where the quantiles exist).
* `explanations`: explanation records (docs/data-contracts.md), `texts`: job_id -> card text (default:
  `scheduling.explain.template.TemplateExplainer`). At most `max_cards` cards are drawn (the page says how many were
  left out), in job_id order.

Everything is written under `var/reports/evaluate/<run>/` (or `out_dir`): index.html, charts/*.png,
cards/*.png, data.json (the numbers behind the charts).
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from common.jsonutil import canonical_json, to_jsonable
from common.timeutil import utc
from scheduling.domain.fleet import DEFAULT_FLEET_PATH
from scheduling.evaluation.ablations import REFERENCE_RUNS
from scheduling.evaluation.bounds import solve_optimum
from scheduling.evaluation.results import over_seeds
from scheduling.evaluation.scenario import build_scenario
from scheduling.evaluation.simulator import simulate
from scheduling.explain.registry import make_explainer
from scheduling.explain.template import TemplateExplainer
from scheduling.output.charts import color, pyplot, save_figure
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES, make_policy
from scheduling.planning.problem import abs_hours
from scheduling.planning.session import HourlyPlanner
from warehouse.config import var_dir

log = logging.getLogger(__name__)

MAX_CARDS = 50
BASELINE_PREFERENCE = ("run-now", "round-robin", "performance-first", "random")


@dataclass
class ReportResult:
    index: Path
    directory: Path
    charts: list[str] = field(default_factory=list)
    cards: list[str] = field(default_factory=list)
    n_cards: int = 0
    n_cards_left_out: int = 0

    def as_dict(self) -> dict:
        return {
            "index": str(self.index),
            "directory": str(self.directory),
            "charts": self.charts,
            "cards": len(self.cards),
            "cards_left_out": self.n_cards_left_out,
        }


def default_report_dir(run_id: str) -> Path:
    return var_dir() / "reports" / "evaluate" / safe_run_id(run_id)


def safe_run_id(run_id: str) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", str(run_id)).strip("._")
    return text[:120] or "run"


def _frame(value) -> pd.DataFrame:
    if value is None:
        return pd.DataFrame()
    if isinstance(value, pd.DataFrame):
        return value.copy()
    return pd.DataFrame(list(value))


# ------------------------------------------------------------------------------------------------ charts


def chart_carbon(policies: pd.DataFrame, optimum: float | None, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = policies["policy"].astype(str).tolist()
    values = policies["kgco2e"].astype(float).to_numpy()
    ax.bar(names, values, color=[color(i) for i in range(len(names))])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:,.1f}", ha="center", va="bottom", fontsize=8)
    if optimum is not None and np.isfinite(optimum):
        ax.axhline(optimum, color="black", linestyle="--", linewidth=1)
        ax.text(len(names) - 0.5, optimum, f" optimum (LP bound) {optimum:,.1f}", va="bottom", ha="right", fontsize=8)
    ax.set_ylabel("kgCO2e")
    ax.set_title("Carbon per policy")
    ax.tick_params(axis="x", rotation=20)
    save_figure(fig, path)


SUMMARY_ORDER = ("rolling-lp", "priority", "carbon-time", "greedy-carbon", "performance-first", "round-robin", "random")


def over_runs(reports: list[dict]) -> pd.DataFrame:
    """The numbers behind `chart_over_runs`: `results.over_seeds(partial=True)` without the bound and the
    reference runs (policies only), in percent, by period (month) and load, our policy first and the baselines in
    the order of the results tables."""
    rows = [
        r for r in over_seeds(reports, partial=True) if r["policy"] != "optimum" and r["policy"] not in REFERENCE_RUNS
    ]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    out = pd.DataFrame(
        {
            "period": frame["start"].astype(str).str[:7],
            "load": frame["load_target"].astype(float),
            "policy": frame["policy"],
            "runs": frame["runs"],
        }
    )
    for stat in ("mean", "min", "max"):
        out[f"share_{stat}"] = frame[f"share_{stat}_pct"].astype(float)
        out[f"deadlines_{stat}"] = 100.0 * frame[f"deadlines_{stat}"].astype(float)
    rank = {name: i for i, name in enumerate(SUMMARY_ORDER)}
    out["order"] = out["policy"].map(lambda n: rank.get(n, len(rank)))
    return out.sort_values(["period", "load", "order", "policy"]).drop(columns="order").reset_index(drop=True)


def chart_over_runs(
    reports: list[dict], path: Path, share_target_pct: float = 90.0, deadline_target_pct: float = 98.0
) -> pd.DataFrame:
    """Two panels over every period x load: each policy's share of the optimum's reduction and its deadline
    satisfaction, bars at the mean over the runs (trace seeds), whiskers min-max, the targets as lines.
    Returns the numbers drawn (`over_runs`)."""
    table = over_runs(reports)
    if table.empty:
        raise ValueError("no evaluate reports to draw")
    plt = pyplot()
    groups = list(dict.fromkeys(zip(table["period"], table["load"])))
    policies = list(dict.fromkeys(table["policy"]))
    width = 0.8 / len(policies)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    panels = (
        ("share", "share of the optimum's reduction (%)", share_target_pct),
        ("deadlines", "jobs meeting their deadline (%)", deadline_target_pct),
    )
    for ax, (key, label, target) in zip(axes, panels):
        for i, name in enumerate(policies):
            part = table[table["policy"] == name].set_index(["period", "load"])
            xs, mean, lo, hi = [], [], [], []
            for g, group in enumerate(groups):
                if group in part.index and np.isfinite(part.loc[group, f"{key}_mean"]):
                    row = part.loc[group]
                    xs.append(g - 0.4 + (i + 0.5) * width)
                    mean.append(row[f"{key}_mean"])
                    lo.append(row[f"{key}_mean"] - row[f"{key}_min"])
                    hi.append(row[f"{key}_max"] - row[f"{key}_mean"])
            if xs:
                runs = int(part["runs"].max())
                ax.bar(
                    xs,
                    mean,
                    width,
                    color=color(i),
                    yerr=[lo, hi],
                    capsize=2,
                    error_kw={"linewidth": 0.8},
                    label=f"{name} ({runs} runs)" if runs > 1 else name,
                )
        ax.axhline(target, color="black", linestyle="--", linewidth=1)
        ax.text(len(groups) - 0.5, target, f"target {target:g} %", ha="right", va="bottom", fontsize=8)
        ax.axhline(0, color="grey", linewidth=0.6)
        ax.set_xticks(range(len(groups)), [f"{p}\nload {load:g}" for p, load in groups])
        ax.set_ylabel(label)
    axes[0].set_title("Carbon: share of the LP bound's reduction vs performance-first")
    axes[1].set_title("Deadlines")
    axes[1].set_ylim(0, 105)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="lower center", ncol=len(policies), fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.06)
    )
    save_figure(fig, path)
    return table


def chart_deadlines(policies: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = policies["policy"].astype(str).tolist()
    share = 100.0 * policies["deadline_met_share"].astype(float).to_numpy()
    ax.bar(names, share, color=[color(i) for i in range(len(names))])
    for i, v in enumerate(share):
        ax.text(i, v, f"{v:.1f} %", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("jobs meeting the deadline (%)")
    ax.set_title("Deadline satisfaction")
    ax.tick_params(axis="x", rotation=20)
    save_figure(fig, path)


def chart_unallocated(policies: pd.DataFrame, utilization: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.4))
    if not utilization.empty and {"time", "policy", "unallocated_gpus"} <= set(utilization.columns):
        util = utilization.copy()
        util["time"] = pd.to_datetime(util["time"], utc=True)
        for i, (name, part) in enumerate(util.groupby("policy", sort=True)):
            part = part.sort_values("time")
            ax.plot(part["time"], part["unallocated_gpus"], label=str(name), color=color(i), linewidth=1)
        ax.legend(fontsize=7, ncol=3)
        ax.set_xlabel("time (UTC)")
        fig.autofmt_xdate()
    else:
        names = policies["policy"].astype(str).tolist()
        values = policies["unallocated_gpus"].astype(float).to_numpy()
        ax.bar(names, values, color=[color(i) for i in range(len(names))])
        ax.tick_params(axis="x", rotation=20)
    ax.set_ylabel("unallocated GPUs")
    ax.set_title("Unallocated GPUs (idle capacity)")
    save_figure(fig, path)


def chart_savings(by_region: pd.DataFrame, baseline: str, path: Path) -> pd.DataFrame:
    """Savings per region against `baseline` (kgCO2e, positive = less carbon); returns the table drawn."""
    plt = pyplot()
    wide = by_region.pivot_table(index="region", columns="policy", values="kgco2e", aggfunc="sum").fillna(0.0)
    wide = wide.sort_index()
    savings = wide.rsub(wide[baseline], axis=0).drop(columns=[baseline]) if baseline in wide.columns else wide * 0
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(wide) + 3), 3.6))
    n = max(1, len(savings.columns))
    width = 0.8 / n
    x = np.arange(len(savings.index))
    for i, name in enumerate(savings.columns):
        ax.bar(x + i * width - 0.4 + width / 2, savings[name].to_numpy(), width, label=str(name), color=color(i))
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x)
    ax.set_xticklabels(savings.index.astype(str), rotation=20)
    ax.set_ylabel(f"kgCO2e saved vs {baseline}")
    ax.set_title(f"Savings per region (against {baseline})")
    if len(savings.columns):
        ax.legend(fontsize=7, ncol=3)
    save_figure(fig, path)
    return savings.reset_index()


def _forecast_frame(forecast: pd.DataFrame) -> pd.DataFrame:
    if forecast.empty:
        return forecast
    f = forecast.copy()
    f["target_time"] = pd.to_datetime(f["target_time"], utc=True)
    for col in ("p10", "p50", "p90", "actual"):
        if col in f.columns:
            f[col] = pd.to_numeric(f[col], errors="coerce")
    return f.sort_values(["region", "target_time"])


def chart_timeline(
    timeline: pd.DataFrame, forecast: pd.DataFrame, path: Path, policy: str | None, max_regions: int = 6
) -> None:
    """Per region: the forecast (P50 line, P10-P90 band) and the plan's jobs as bars under it."""
    plt = pyplot()
    t = timeline.copy()
    if not t.empty:
        t["start_time"] = pd.to_datetime(t["start_time"], utc=True)
        t["end_time"] = pd.to_datetime(t["end_time"], utc=True)
    regions = sorted(set(t["region"].astype(str)) if not t.empty else set())
    if not forecast.empty:
        regions = sorted(set(regions) | set(forecast["region"].astype(str))) if not regions else regions
    regions = regions[:max_regions] or ["(none)"]
    fig, axes = plt.subplots(len(regions), 1, figsize=(9, 2.2 * len(regions)), sharex=True, squeeze=False)
    for ax, region in zip(axes[:, 0], regions):
        f = forecast[forecast["region"].astype(str) == region] if not forecast.empty else forecast
        if not f.empty:
            if {"p10", "p90"} <= set(f.columns) and f[["p10", "p90"]].notna().any().all():
                ax.fill_between(f["target_time"], f["p10"], f["p90"], color="#9ecae1", alpha=0.6, label="P10-P90")
            ax.plot(f["target_time"], f["p50"], color="#08519c", linewidth=1.2, label="forecast P50")
            if "actual" in f.columns and f["actual"].notna().any():
                ax.plot(f["target_time"], f["actual"], color="black", linewidth=0.8, linestyle=":", label="actual")
        ax.set_ylabel("gCO2e/kWh", fontsize=8)
        ax.set_title(str(region), fontsize=9, loc="left")
        jobs = t[t["region"].astype(str) == region] if not t.empty else t
        if not jobs.empty:
            twin = ax.twinx()
            jobs = jobs.sort_values(["start_time", "job_id"])
            for k, row in enumerate(jobs.itertuples(index=False)):
                start = pd.Timestamp(row.start_time)
                width = (pd.Timestamp(row.end_time) - start) / pd.Timedelta(days=1)
                import matplotlib.dates as mdates  # noqa: PLC0415 - plotting loads only when a chart is drawn

                twin.broken_barh(
                    [(mdates.date2num(start.to_pydatetime()), width)], (k % 12, 0.8), facecolors="#fd8d3c", alpha=0.7
                )
            twin.set_ylim(0, 30)
            twin.set_yticks([])
        if ax is axes[0, 0] and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (UTC)")
    fig.suptitle(
        f"Plan timeline against the forecast{f' ({policy})' if policy else ''}: jobs as orange bars", fontsize=10
    )
    fig.autofmt_xdate()
    save_figure(fig, path)


def chart_card(record: dict, forecast: pd.DataFrame, path: Path, end_time=None) -> None:
    """One job: the forecast of its chosen region (and the alternatives' regions), the chosen window shaded,
    the alternatives marked with their carbon."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 2.6))
    chosen = record.get("chosen") or {}
    alts = list(record.get("alternatives") or [])[:5]
    region = str(chosen.get("region")) if chosen.get("region") is not None else None
    regions = [region] if region else []
    regions += [
        str(a.get("region")) for a in alts if a.get("region") is not None and str(a.get("region")) not in regions
    ]
    times = [pd.Timestamp(x) for x in [chosen.get("start_time"), *[a.get("start_time") for a in alts]] if x]
    lo = min(times) - pd.Timedelta(hours=6) if times else None
    hi = max(times) + pd.Timedelta(hours=30) if times else None
    lines = {}
    for i, reg in enumerate(regions):
        f = forecast[forecast["region"].astype(str) == reg] if not forecast.empty else forecast
        if lo is not None and not f.empty:
            f = f[(f["target_time"] >= lo) & (f["target_time"] <= hi)]
        if f.empty:
            continue
        main = reg == region
        if main and {"p10", "p90"} <= set(f.columns) and f[["p10", "p90"]].notna().any().all():
            ax.fill_between(f["target_time"], f["p10"], f["p90"], color="#9ecae1", alpha=0.5)
        ax.plot(
            f["target_time"],
            f["p50"],
            color=color(i),
            linewidth=1.6 if main else 0.8,
            label=f"{reg}{' (chosen)' if main else ''}",
        )
        lines[reg] = f
    if chosen.get("start_time"):
        start = utc(chosen["start_time"])
        end = chosen.get("end_time") or end_time
        end = utc(end) if end is not None else start + pd.Timedelta(hours=1)
        ax.axvspan(
            start,
            max(end, start + pd.Timedelta(hours=1)),
            color="#31a354",
            alpha=0.25,
            label=f"chosen: {_kg(chosen.get('kgco2e'))}",
        )
    for k, alt in enumerate(alts, 1):
        if not alt.get("start_time"):
            continue
        ts = utc(alt["start_time"])
        f = lines.get(str(alt.get("region")))
        y = (
            float(np.interp(ts.value, f["target_time"].astype("int64").to_numpy(), f["p50"].to_numpy()))
            if f is not None and len(f)
            else 0.0
        )
        ax.plot([ts], [y], marker="v", color="#de2d26", markersize=6)
        ax.annotate(f"{k}: {_kg(alt.get('kgco2e'))}", (ts, y), textcoords="offset points", xytext=(3, 5), fontsize=6)
    ax.set_ylabel("gCO2e/kWh", fontsize=8)
    ax.set_title(f"{record.get('job_id')}: forecast, chosen window, alternatives (red)", fontsize=9, loc="left")
    if lines or chosen:
        ax.legend(fontsize=6, loc="upper right")
    import matplotlib.dates as mdates  # noqa: PLC0415 - plotting loads only when a chart is drawn

    ax.xaxis.set_major_locator(mdates.HourLocator(byhour=[0, 12], tz="UTC"))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz="UTC"))
    ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.16, top=0.88)
    save_figure(fig, path, tight=False, dpi=80)


def _kg(value) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(v) else f"{v:.2f} kgCO2e"


# ------------------------------------------------------------------------------------------------ the page


def _table(frame: pd.DataFrame, digits: int = 3) -> str:
    if frame.empty:
        return "<p><em>no rows</em></p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, (float, np.floating)):
                text = "" if math.isnan(float(v)) else f"{float(v):,.{digits}f}"
            else:
                text = str(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


CSS = """
body { font-family: sans-serif; max-width: 1100px; margin: 1em auto; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.5em 1em; margin: 1em 0; }
.card pre { white-space: pre-wrap; font-size: 0.85em; }
img { max-width: 100%; }
"""


def _pick_baseline(names: list[str], policies: pd.DataFrame, requested: str | None) -> str | None:
    if requested and requested in names:
        return requested
    for name in BASELINE_PREFERENCE:
        if name in names:
            return name
    if not policies.empty and "kgco2e" in policies.columns:
        return str(policies.sort_values("kgco2e").iloc[-1]["policy"])
    return names[0] if names else None


def write_report(
    evaluation: dict, out_dir: str | Path | None = None, run_id: str = "run", max_cards: int = MAX_CARDS
) -> ReportResult:
    """Render the report (see the module doc); returns where it is. Logs the index path."""
    directory = Path(out_dir) if out_dir else default_report_dir(run_id)
    directory.mkdir(parents=True, exist_ok=True)
    meta = dict(evaluation.get("meta") or {})
    policies = _frame(evaluation.get("policies"))
    if policies.empty or "policy" not in policies.columns:
        raise ValueError("evaluation['policies'] needs one row per policy with a 'policy' column")
    for col in ("kgco2e", "deadline_met_share", "unallocated_gpus"):
        if col not in policies.columns:
            policies[col] = np.nan
    optimum = evaluation.get("optimum_kgco2e")
    optimum = None if optimum is None or (isinstance(optimum, float) and math.isnan(optimum)) else float(optimum)
    utilization = _frame(evaluation.get("utilization"))
    by_region = _frame(evaluation.get("by_region"))
    timeline = _frame(evaluation.get("timeline"))
    forecast = _forecast_frame(_frame(evaluation.get("forecast")))
    records = sorted((dict(r) for r in (evaluation.get("explanations") or [])), key=lambda r: str(r.get("job_id")))
    texts = dict(evaluation.get("texts") or {})
    names = policies["policy"].astype(str).tolist()
    baseline = _pick_baseline(names, policies, evaluation.get("baseline"))

    result = ReportResult(index=directory / "index.html", directory=directory)
    charts = directory / "charts"
    chart_carbon(policies, optimum, charts / "carbon_per_policy.png")
    chart_deadlines(policies, charts / "deadline_satisfaction.png")
    chart_unallocated(policies, utilization, charts / "unallocated_gpus.png")
    chart_timeline(timeline, forecast, charts / "plan_timeline.png", evaluation.get("timeline_policy"))
    result.charts = [
        "charts/carbon_per_policy.png",
        "charts/deadline_satisfaction.png",
        "charts/unallocated_gpus.png",
        "charts/plan_timeline.png",
    ]
    savings = pd.DataFrame()
    if not by_region.empty and baseline is not None:
        savings = chart_savings(by_region, baseline, charts / "savings_per_region.png")
        result.charts.append("charts/savings_per_region.png")

    template = TemplateExplainer()
    shown = records[:max_cards]
    result.n_cards = len(shown)
    result.n_cards_left_out = max(0, len(records) - len(shown))
    ends = {}
    if not timeline.empty and {"job_id", "end_time"} <= set(timeline.columns):
        ends = dict(zip(timeline["job_id"].astype(str), pd.to_datetime(timeline["end_time"], utc=True)))
    card_html = []
    for record in shown:
        job = str(record.get("job_id"))
        rel = f"cards/{safe_run_id(job)}.png"
        chart_card(record, forecast, directory / rel, end_time=ends.get(job))
        result.cards.append(rel)
        text = texts.get(job) or template.explain(record)
        card_html.append(
            f'<div class="card" id="{html.escape(safe_run_id(job))}"><h3>{html.escape(job)}</h3>'
            f'<pre>{html.escape(text)}</pre><img src="{html.escape(rel)}" alt="forecast and windows of '
            f'{html.escape(job)}"></div>'
        )

    table = policies.copy()
    if optimum is not None and "kgco2e" in table.columns:
        table["above_optimum_pct"] = 100.0 * (table["kgco2e"].astype(float) / optimum - 1.0) if optimum > 0 else np.nan
    parts = [
        '<!DOCTYPE html><html><head><meta charset="utf-8">',
        f"<title>Evaluation {html.escape(str(run_id))}</title><style>{CSS}</style></head><body>",
        f"<h1>Carbon-aware planner: evaluation {html.escape(str(run_id))}</h1>",
        _table(
            pd.DataFrame(
                {
                    "setting": list(meta),
                    "value": [canonical_json(v) if isinstance(v, (dict, list)) else str(v) for v in meta.values()],
                }
            )
        ),
        "<h2>Carbon per policy</h2>",
        "<p>Total expected emissions of the jobs each policy ran"
        + (
            f"; the dashed line is the offline optimum (linear program), a lower bound: {optimum:,.2f} kgCO2e."
            if optimum is not None
            else "; the optimum was not computed."
        )
        + "</p>",
        _table(table),
        '<img src="charts/carbon_per_policy.png" alt="carbon per policy">',
        "<h2>Deadline satisfaction</h2>",
        '<img src="charts/deadline_satisfaction.png" alt="deadlines">',
        "<h2>Unallocated GPUs</h2>",
        '<img src="charts/unallocated_gpus.png" alt="unallocated GPUs">',
        "<h2>Plan timeline against the forecast</h2>",
        "<p>The P10-P90 band is drawn where the forecast has quantiles (a point forecast shows the P50 line only).</p>",
        '<img src="charts/plan_timeline.png" alt="timeline">',
    ]
    if not savings.empty:
        parts += [
            f"<h2>Savings per region (against {html.escape(str(baseline))})</h2>",
            '<img src="charts/savings_per_region.png" alt="savings per region">',
            _table(savings),
        ]
    parts.append(f"<h2>Explanation cards ({len(shown)} of {len(records)} jobs)</h2>")
    if result.n_cards_left_out:
        parts.append(
            f"<p>Cards are capped at {max_cards}: {result.n_cards_left_out} more jobs are left out "
            "(all explanation records are in data.json).</p>"
        )
    parts += card_html
    parts.append("</body></html>")
    result.index.write_text("\n".join(parts) + "\n", encoding="utf-8")
    data = {
        "run_id": run_id,
        "meta": meta,
        "baseline": baseline,
        "optimum_kgco2e": optimum,
        "policies": to_jsonable(policies.to_dict(orient="records")),
        "savings_per_region": to_jsonable(savings.to_dict(orient="records")) if not savings.empty else [],
        "explanations": to_jsonable(records),
        "cards": {"shown": len(shown), "left_out": result.n_cards_left_out, "cap": max_cards},
    }
    (directory / "data.json").write_text(json.dumps(to_jsonable(data), sort_keys=True, indent=2) + "\n")
    log.info("evaluation report written: %s", result.index)
    return result


# ------------------------------------------------------------------------------------------------ from the simulator


def forecast_band(sc, start=None, hours: int | None = None, history_days: int = 7) -> pd.DataFrame:
    """The scenario's forecast over the period as a rolling day-ahead series (issued daily at 00:00 UTC, 24 h
    each) with a P10-P90 band: P50 plus the 10th/90th percentile of the same forecast's day-ahead errors
    (actual - forecast) per zone over the `history_days` days before the period (no look-ahead). Columns region,
    zone, target_time, p10, p50, p90, actual."""
    start = utc(start if start is not None else sc.start).floor("D")
    hours = int(hours if hours is not None else sc.hours)
    zones = list(sc.forecasts.zones)
    zone_region = {}
    for region, zone in zip(sc.fleet.cluster_regions, sc.fleet.cluster_zones):
        zone_region.setdefault(zone, region)
    residuals = []
    for d in range(history_days, 0, -1):
        day = start - pd.Timedelta(days=d)
        try:
            f, _, _ = sc.forecasts.at(day, 24)
            residuals.append(sc.grid.window(day, 24, zones) - f)
        except (ValueError, KeyError, IndexError):
            continue
    if residuals:
        res = np.concatenate(residuals, axis=0)
        q10, q90 = np.nanpercentile(res, 10, axis=0), np.nanpercentile(res, 90, axis=0)
    else:
        q10 = q90 = np.full(len(zones), np.nan)
    frames = []
    n_days = int(math.ceil(hours / 24.0))
    for d in range(n_days):
        day = start + pd.Timedelta(days=d)
        f, _, _ = sc.forecasts.at(day, 24)
        actual = sc.grid.window(day, 24, zones)
        times = pd.date_range(day, periods=24, freq="h")
        for zi, zone in enumerate(zones):
            frames.append(
                pd.DataFrame(
                    {
                        "region": zone_region.get(zone, zone),
                        "zone": zone,
                        "target_time": times,
                        "p50": f[:, zi],
                        "p10": f[:, zi] + q10[zi],
                        "p90": f[:, zi] + q90[zi],
                        "actual": actual[:, zi],
                    }
                )
            )
    if not frames:
        return pd.DataFrame(columns=["region", "zone", "target_time", "p10", "p50", "p90", "actual"])
    return pd.concat(frames, ignore_index=True)


def explained_run(sc, policy: str = DEFAULT_POLICY, seed: int = 0) -> list[dict]:
    """The explanation record of the decision that started each job, from a replay of `sc` with explanations
    on (the same loop as `scheduling.evaluation.simulator.simulate`, which does not keep them)."""
    hp = HourlyPlanner(
        sc.fleet,
        table=sc.table,
        policy=make_policy(policy, seed=seed),
        forecasts=sc.forecasts,
        workload=sc.workload,
        explain=True,
        tentative=False,
        seed=seed,
    )
    t0 = abs_hours(sc.start)
    t_arr, t_max = t0 + sc.hours, t0 + sc.hours + sc.tail_hours
    ids = sc.table.jobs["job_id"].astype(str).to_numpy()
    records: dict[str, dict] = {}
    for t in range(t0, t_max):
        hp.release_finished(t)
        pend = hp.pending(t)
        if len(pend):
            out = hp.plan_outcome(pd.Timestamp(t * 3_600_000_000_000, tz="UTC"), pend)
            started = {ids[int(out.global_index[jj])] for jj in np.flatnonzero(out.placed & (out.s == 0))}
            for e in out.explanations:
                if str(e.get("job_id")) in started:
                    records[str(e["job_id"])] = e
        if t >= t_arr and hp.started.all():
            break
    return [records[k] for k in sorted(records)]


def evaluation_from_simulation(
    sc,
    results: dict,
    optimum: dict | None = None,
    explanations=None,
    timeline_policy: str | None = None,
    texts: dict | None = None,
) -> dict:
    """The `write_report` input from a scenario (`scheduling.evaluation.scenario.build_scenario`), its `SimResult`s per
    policy and the optimum (`solve_optimum`)."""
    names = list(results)
    timeline_policy = timeline_policy or ("priority" if "priority" in results else names[0])
    cluster_region = dict(zip(sc.fleet.names, sc.fleet.cluster_regions))
    rows, util, by_region = [], [], []
    cap = sc.fleet.capacity_milli
    times = pd.date_range(sc.start, periods=sc.hours, freq="h")
    for name, res in results.items():
        m = res.metrics
        rows.append(
            {
                "policy": name,
                "kgco2e": m["kgco2e"],
                "deadline_met_share": m["deadline_satisfaction"],
                "unallocated_gpus": m["unallocated_gpus"],
                "energy_kwh": m.get("energy_kwh"),
                "mean_delay_h": m.get("mean_delay_h"),
                "jobs_started": m.get("jobs_started"),
            }
        )
        alloc = np.asarray(res.hourly_alloc)
        util.append(
            pd.DataFrame(
                {
                    "time": times[: len(alloc)],
                    "policy": name,
                    "unallocated_gpus": (cap.sum() - alloc.sum(axis=1)) / 1000.0,
                }
            )
        )
        for region, kg in (m.get("by_region_kgco2e") or {}).items():
            if region != "none":
                by_region.append({"policy": name, "region": region, "kgco2e": kg})
    rec = results[timeline_policy].records
    rec = rec[rec["started"]].copy()
    timeline = pd.DataFrame(
        {
            "job_id": rec["job_id"].astype(str),
            "region": rec["cluster"].map(cluster_region),
            "cluster": rec["cluster"],
            "start_time": pd.to_datetime(rec["start_time"], utc=True),
            "end_time": pd.to_datetime(rec["start_time"], utc=True) + pd.to_timedelta(rec["duration_h"], unit="h"),
        }
    )
    cfg = dict(sc.config)
    meta = {
        k: cfg.get(k)
        for k in (
            "start",
            "days",
            "n_jobs",
            "regions",
            "load_target",
            "seed",
            "packing",
            "forecasts_requested",
            "grid_source",
            "power_options",
        )
    }
    meta["forecast_used"] = sc.forecasts.name
    meta["fleet_gpus"] = sc.fleet.total_gpus
    meta["band"] = "P10-P90 = day-ahead P50 + 10th/90th percentile of its errors over the 7 days before the period"
    return {
        "meta": meta,
        "policies": pd.DataFrame(rows),
        "optimum_kgco2e": None if optimum is None else optimum.get("kgco2e"),
        "utilization": pd.concat(util, ignore_index=True) if util else None,
        "by_region": pd.DataFrame(by_region),
        "baseline": "performance-first" if "performance-first" in results else None,
        "timeline": timeline,
        "timeline_policy": timeline_policy,
        "forecast": forecast_band(sc, hours=_span_hours(sc, timeline)),
        "explanations": list(explanations or []),
        "texts": texts or {},
    }


def _span_hours(sc, timeline: pd.DataFrame) -> int:
    """Hours from the period start to the last planned end (at least the period, at most period + tail)."""
    hours = sc.hours
    if len(timeline):
        last = pd.to_datetime(timeline["end_time"], utc=True).max()
        hours = max(hours, int(math.ceil((last - utc(sc.start)) / pd.Timedelta(hours=1))))
    return int(min(hours, sc.hours + sc.tail_hours))


def default_run_id(start, days, n_jobs, regions, load) -> str:
    reg = regions if isinstance(regions, (int, np.integer)) else "-".join(str(r) for r in regions)
    return safe_run_id(f"{utc(start):%Y-%m-%d}_{days}d_{n_jobs}jobs_r{reg}_load{load}")


LOADS = (0.5, 0.8)


def validate_evaluation_params(params: dict) -> dict:
    """The evaluate DAG's Params checked (ValueError naming the bad value): policies (list of the planner's
    policy names), period_start (date), days (1-31), jobs (>= 1), regions (a count or a list of fleet region
    names), load (0.5 or 0.8), max_cards (0-500)."""
    policies = params.get("policies") or []
    if isinstance(policies, str) or not isinstance(policies, (list, tuple)) or not policies:
        raise ValueError(f"policies {policies!r} must be a non-empty list of {list(POLICY_NAMES)}")
    bad = [p for p in policies if p not in POLICY_NAMES]
    if bad:
        raise ValueError(f"policies {bad} unknown; choose from {list(POLICY_NAMES)}")
    if not [p for p in policies if p != "optimum"]:
        raise ValueError("policies: name at least one online policy besides 'optimum'")
    text = str(params.get("period_start") or "")
    try:
        start = pd.Timestamp(text)
        if start is pd.NaT or len(text) < 10:
            raise ValueError
    except (ValueError, TypeError):
        raise ValueError(f"period_start {text!r} is not a date (YYYY-MM-DD)") from None
    checks = {"days": (1, 31), "jobs": (1, 100000), "max_cards": (0, 500)}
    values = {}
    for key, (lo, hi) in checks.items():
        v = params.get(key, MAX_CARDS if key == "max_cards" else None)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
            raise ValueError(f"{key} {v!r} must be an integer in [{lo}, {hi}]")
        values[key] = int(v)
    known = list(yaml.safe_load(DEFAULT_FLEET_PATH.read_text())["regions"])
    regions = params.get("regions", 6)
    if isinstance(regions, bool):
        raise ValueError(f"regions {regions!r} must be a count or a list of region names")
    if isinstance(regions, (int, np.integer)):
        if not 1 <= int(regions) <= len(known):
            raise ValueError(f"regions {regions!r} must be between 1 and {len(known)}")
        regions = int(regions)
    elif isinstance(regions, (list, tuple)) and regions:
        bad = [r for r in regions if r not in known]
        if bad:
            raise ValueError(f"regions {bad} not in the fleet; choose from {known}")
        regions = list(regions)
    else:
        raise ValueError(f"regions {regions!r} must be a count or a non-empty list of region names")
    load = params.get("load", 0.5)
    if isinstance(load, bool) or not isinstance(load, (int, float)) or float(load) not in LOADS:
        raise ValueError(f"load {load!r} must be one of {list(LOADS)}")
    return {
        "policies": list(dict.fromkeys(policies)),
        "start": start.strftime("%Y-%m-%d"),
        "days": values["days"],
        "n_jobs": values["jobs"],
        "regions": regions,
        "load": float(load),
        "max_cards": values["max_cards"],
    }


def run_evaluation(
    *,
    start,
    days: int,
    n_jobs: int,
    regions,
    load: float,
    policies,
    run_id: str | None = None,
    out_dir=None,
    max_cards: int = MAX_CARDS,
    seed: int = 0,
    lp_time_limit_s: float = 300.0,
    db_path=None,
    data_dir=None,
    explainer=None,
) -> dict:
    """Simulate `policies` (online ones; "optimum" adds the LP bound) on one scenario and write the report.
    Returns {index, directory, run_id, metrics (per policy), optimum_kgco2e, cards, seconds}."""
    t0 = time.perf_counter()
    policies = list(dict.fromkeys(policies))
    online = [p for p in policies if p != "optimum"]
    if not online:
        raise ValueError("policies: at least one online policy besides 'optimum' is needed")
    run_id = run_id or default_run_id(start, days, n_jobs, regions, load)
    sc = build_scenario(
        start=start, days=days, n_jobs=n_jobs, regions=regions, load=load, seed=seed, db_path=db_path, data_dir=data_dir
    )
    results = {p: simulate(sc, p, seed=seed) for p in online}
    optimum = solve_optimum(sc, lp_time_limit_s) if "optimum" in policies else None
    card_policy = "priority" if "priority" in online else online[0]
    explanations = getattr(results[card_policy], "explanations", None) or explained_run(sc, card_policy, seed)
    explainer = explainer or make_explainer()
    shown = sorted(explanations, key=lambda r: str(r.get("job_id")))[:max_cards]
    texts = {str(r.get("job_id")): explainer.explain(r) for r in shown}
    evaluation = evaluation_from_simulation(sc, results, optimum, explanations, card_policy, texts)
    evaluation["meta"]["policies"] = policies
    evaluation["meta"]["cards_policy"] = card_policy
    rr = write_report(evaluation, out_dir or default_report_dir(run_id), run_id=run_id, max_cards=max_cards)
    return {
        "run_id": run_id,
        "index": str(rr.index),
        "directory": str(rr.directory),
        "metrics": {
            p: {k: r.metrics[k] for k in ("kgco2e", "deadline_satisfaction", "unallocated_gpus")}
            for p, r in results.items()
        },
        "optimum_kgco2e": None if optimum is None else optimum.get("kgco2e"),
        "cards": rr.n_cards,
        "cards_left_out": rr.n_cards_left_out,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m scheduling.evaluation.report --start 2021-07-01 --days 2 --jobs 60 --regions 3 --load 0.5
    --policies priority,greedy-carbon,performance-first,optimum [--max-cards 50] [--run-id ID] [--json]`."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduling.evaluation.report",
        description="Simulate policies on one scenario and write the HTML report.",
    )
    parser.add_argument("--start", required=True)
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--regions", default="6", help="a count or comma-separated region names")
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--policies", default="priority,greedy-carbon,performance-first,round-robin,optimum")
    parser.add_argument("--max-cards", type=int, default=MAX_CARDS)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    regions = int(args.regions) if args.regions.isdigit() else [r for r in args.regions.split(",") if r]
    out = run_evaluation(
        start=args.start,
        days=args.days,
        n_jobs=args.jobs,
        regions=regions,
        load=args.load,
        policies=[p for p in args.policies.split(",") if p],
        run_id=args.run_id,
        out_dir=args.out_dir,
        max_cards=args.max_cards,
    )
    print(json.dumps(out, sort_keys=True) if args.json else f"report: {out['index']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
