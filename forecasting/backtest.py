"""Rolling-origin backtests.

Forecasts are issued daily at 00:00 UTC (`issue_hour`) from `start` to `end` (inclusive dates) for horizons
1…`horizon`. Each call to `Forecaster.predict` receives only a window of the data masked as known at its issue time
(`forecasting.data.mask_known`: observed values strictly before issued_at; weather forecasts, calendar and the
operators' already-published day-ahead forecasts for the hours after). Actuals are joined afterwards; target hours
after `end` are not scored.

"Day-ahead" follows DACF: a forecast issued at 00:00 UTC of day D for the 24 hours of day D, i.e. horizons 1–24 of
the daily 00:00 issue, so every hour of the test window is scored exactly once (DACF's published MAPEs are over all
hours of Jul–Dec 2021 in the same way).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forecasting.base import TARGET_COLUMNS, Forecaster
from forecasting.data import (
    OPERATOR_SERIES,
    attach_published,
    grid_hourly,
    issue_times,
    load_published_forecasts,
    mask_known,
)
from forecasting.metrics import DAY_AHEAD, error_pct_of_mean, mape, point_metric_name, summarize
from forecasting.models.registry import applicable, make_model
from forecasting.store import write_forecasts

HOUR = pd.Timedelta(hours=1)
# Days of data before each issue handed to predict (the ensemble's weights are re-fitted on its last 28 days; the
# mix composite looks back further). One default for every entry point: the CLI and the results job used 70, the
# functions 35, so the same backtest gave other forecasts from Python than from the command line.
CONTEXT_DAYS = 70
# Weather features look up to a day past the target hour (its daily mean, t + 1, t + 2): give predict that much.
LOOKAHEAD_H = 24
STANDARD = {
    "train_end": "2021-07-01",  # exclusive: train on data up to 2021-06-30 23:00
    "start": "2021-07-01",
    "end": "2021-12-31",
    "regions": ("CISO", "PJM", "ERCO", "ISNE", "SE", "DE"),
}
# The published figures (DACF paper, Table 4; SOURCE.md), reproduced from the files by `published_baseline`.
PUBLISHED_DACF_MAPE = {"CISO": 7.41, "PJM": 3.30, "ERCO": 8.05, "ISNE": 4.44, "SE": 6.47, "DE": 9.08}
PUBLISHED_OPERATOR_ERROR = {("CISO", "solar"): 14.4, ("CISO", "wind"): 21.5, ("DE", "solar"): 7.0, ("DE", "wind"): 10.2,
                            ("SE", "wind"): 6.6}


def utc(value) -> pd.Timestamp:
    t = pd.Timestamp(value)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def window_end(end) -> pd.Timestamp:
    """The exclusive end of the scored window: the hour after `end`'s last hour (dates are inclusive)."""
    t = utc(end)
    return t.floor("D") + pd.Timedelta(days=1) if t == t.floor("D") else t


def rolling_forecasts(
    model: Forecaster,
    data: pd.DataFrame,
    start,
    end,
    horizon: int = 96,
    issue_hour: int = 0,
    context_days: int = CONTEXT_DAYS,
    regions=None,
) -> pd.DataFrame:
    """Forecast frames of every daily issue in [start, end], concatenated."""
    if regions is not None:
        data = data[data["region"].isin(list(regions))]
    data = data.sort_values(["region", "hour_utc"]).reset_index(drop=True)
    hours = data["hour_utc"]
    out = []
    for issued_at in issue_times(start, end, issue_hour):
        lo = issued_at - pd.Timedelta(days=context_days)
        hi = issued_at + (horizon + LOOKAHEAD_H) * HOUR  # known-future inputs a little beyond the horizon
        window = data[(hours >= lo) & (hours < hi)]
        if window.empty:
            continue
        pred = model.predict(issued_at, horizon, mask_known(window, issued_at))
        if pred is not None and len(pred):
            out.append(pred)
    if not out:
        return pd.DataFrame(columns=["region", "issued_at", "target_time", "horizon_h", "p10", "p50", "p90", "model"])
    frame = pd.concat(out, ignore_index=True)
    frame["target_time"] = pd.to_datetime(frame["target_time"], utc=True)
    frame["issued_at"] = pd.to_datetime(frame["issued_at"], utc=True)
    return frame


def score(forecasts: pd.DataFrame, data: pd.DataFrame, target: str, end=None) -> pd.DataFrame:
    """Join the actual of `target` to each forecast row; rows after `end` (inclusive date) are dropped."""
    col = TARGET_COLUMNS.get(target, target)
    actual = data[["region", "hour_utc", col]].rename(columns={"hour_utc": "target_time", col: "actual"})
    actual["target_time"] = pd.to_datetime(actual["target_time"], utc=True)
    scored = forecasts.merge(actual, on=["region", "target_time"], how="left")
    if end is not None:
        scored = scored[scored["target_time"] < window_end(end)]
    return scored


def published_baseline(published: pd.DataFrame, data: pd.DataFrame, target: str, region: str, start, end,
                       operator_only: bool = True) -> dict | None:
    """The published day-ahead forecast's error over the test window: DACF's CI MAPE, or the operator's solar/wind
    error as % of mean output (only for the series that are the operator's own, unless operator_only=False)."""
    col = TARGET_COLUMNS.get(target, target)
    if target == "carbon_intensity":
        pub_target, publisher = "carbon_intensity_direct", "DACF"
    else:
        pub_target = col
        if operator_only and (region, col) not in OPERATOR_SERIES:
            return None
        publisher = None
    pub = published[(published["region"] == region) & (published["target"] == pub_target)]
    pub = pub[(pub["hour_utc"] >= utc(start)) & (pub["hour_utc"] < window_end(end))]
    if pub.empty:
        return None
    publisher = publisher or str(pub["publisher"].iloc[0])
    actual = data[(data["region"] == region)][["hour_utc", col]]
    merged = pub.merge(actual, on="hour_utc", how="inner")
    fn = mape if target == "carbon_intensity" else error_pct_of_mean
    return {"value": round(fn(merged[col], merged["value"]), 3), "publisher": publisher, "n": int(len(merged))}


@dataclass
class BacktestResult:
    region: str
    target: str
    model: str
    metrics: dict
    baseline: dict | None
    forecasts: pd.DataFrame
    fit_seconds: float
    predict_seconds: float
    issued: pd.DataFrame | None = None  # every row issued for the region, unscored (all horizons; for --store)

    def to_json(self) -> dict:
        name = point_metric_name(self.target)
        out = {
            "region": self.region,
            "target": self.target,
            "model": self.model,
            name: self.metrics.get(name),
            "coverage_p10_p90": self.metrics.get("coverage_p10_p90"),
            f"day_ahead_{name}": self.metrics.get(f"day_ahead_{name}"),
            "day_ahead_coverage_p10_p90": self.metrics.get("day_ahead_coverage_p10_p90"),
            "by_horizon": self.metrics.get("by_horizon"),
        }
        if self.target == "carbon_intensity":
            out["baseline_dacf_mape"] = self.baseline["value"] if self.baseline else None
        else:
            out["baseline_operator_error_pct_of_mean"] = self.baseline["value"] if self.baseline else None
            out["baseline_publisher"] = self.baseline["publisher"] if self.baseline else None
        out["fit_seconds"] = round(self.fit_seconds, 2)
        out["predict_seconds"] = round(self.predict_seconds, 2)
        return out


def load_inputs(regions, source: str = "auto", data_dir=None, db_path=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid frame (with the operators' published forecasts attached) and the long published frame."""
    data = grid_hourly(regions, source=source, db_path=db_path, data_dir=data_dir)
    published = load_published_forecasts(regions, source=source, db_path=db_path, data_dir=data_dir)
    return attach_published(data, published), published


def run_backtest(
    model: Forecaster,
    target: str,
    regions,
    data: pd.DataFrame,
    published: pd.DataFrame | None = None,
    start=STANDARD["start"],
    end=STANDARD["end"],
    horizon: int = 24,
    train_end=None,
    fit: bool = True,
    context_days: int = CONTEXT_DAYS,
) -> list[BacktestResult]:
    """Fit `model` on data before `train_end` (default: `start`), forecast daily over [start, end], score per region."""
    regions = list(regions)
    data = data[data["region"].isin(regions)]
    train_end = utc(train_end or start)
    fit_s = 0.0
    if fit:
        t0 = time.perf_counter()
        model.fit(data[data["hour_utc"] < train_end], target)
        fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    forecasts = rolling_forecasts(model, data, start, end, horizon, context_days=context_days)
    pred_s = time.perf_counter() - t0
    scored = score(forecasts, data, target, end)
    results = []
    for region in regions:
        part = scored[scored["region"] == region]
        metrics = summarize(part, target) if len(part) else {}
        baseline = published_baseline(published, data, target, region, start, end) if published is not None else None
        results.append(BacktestResult(region, target, getattr(model, "name", type(model).__name__), metrics, baseline,
                                      part, fit_s, pred_s, forecasts[forecasts["region"] == region]))
    return results


def store_forecasts(results: list[BacktestResult], model: str, version: str, db_path=None) -> int:
    """Write the backtest's issued forecasts (every issue, every horizon) into forecast.forecasts as `model` with
    model_version `version`, so that the planner's simulator can replay them as the forecasts known at each hour
    (`scheduling.planner.forecasts.WarehouseForecast`). Returns the number of rows written."""
    parts = [r.issued.assign(target=r.target) for r in results if r.issued is not None and len(r.issued)]
    if not parts:
        return 0
    rows = pd.concat(parts, ignore_index=True)
    rows = rows.assign(model=model, model_version=version, is_fallback=False, fallback_reason=None)
    return write_forecasts(rows, db_path=db_path)


def day_ahead(scored: pd.DataFrame) -> pd.DataFrame:
    return scored[(scored["horizon_h"] >= DAY_AHEAD[0]) & (scored["horizon_h"] <= DAY_AHEAD[1])]


# ------------------------------------------------------------------------------------------------ results table

SOLAR_REGIONS = ("CISO", "PJM", "ERCO", "ISNE", "DE")  # SE has no solar in the files


def target_regions(target: str, regions) -> list[str]:
    regions = list(regions)
    return [r for r in regions if r in SOLAR_REGIONS] if target == "solar" else regions


def baseline_by_bucket(published: pd.DataFrame, data: pd.DataFrame, target: str, regions, start, end) -> dict:
    """Published day-ahead error per region: day-ahead (all hours) and the 1–6 / 7–24 buckets of the 00:00 issue
    (UTC hours 00–05 and 06–23). Operator series are marked; the other solar/wind series are DACF's own ANN."""
    col = TARGET_COLUMNS.get(target, target)
    pub_target = "carbon_intensity_direct" if target == "carbon_intensity" else col
    fn = mape if target == "carbon_intensity" else error_pct_of_mean
    out = {}
    for region in regions:
        pub = published[(published["region"] == region) & (published["target"] == pub_target)]
        pub = pub[(pub["hour_utc"] >= utc(start)) & (pub["hour_utc"] < window_end(end))]
        if pub.empty:
            continue
        merged = pub.merge(data[data["region"] == region][["hour_utc", col]], on="hour_utc")
        hour = merged["hour_utc"].dt.hour
        operator = target == "carbon_intensity" or (region, col) in OPERATOR_SERIES
        out[region] = {
            "publisher": str(pub["publisher"].iloc[0]),
            "is_operator": bool(operator and target != "carbon_intensity"),
            "is_reference": bool(operator),
            "day_ahead": round(fn(merged[col], merged["value"]), 3),
            "1-6": round(fn(merged.loc[hour < 6, col], merged.loc[hour < 6, "value"]), 3),
            "7-24": round(fn(merged.loc[hour >= 6, col], merged.loc[hour >= 6, "value"]), 3),
        }
    return out


def results_job(spec: dict) -> dict:
    """One (target, model) backtest over its regions: metrics per region, timings (wall and CPU)."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import warnings

    warnings.filterwarnings("ignore")
    from forecasting.__main__ import write_plot

    target, name = spec["target"], spec["model"]
    regions = target_regions(target, spec["regions"])
    data, published = load_inputs(regions, source=spec.get("source", "auto"))
    kwargs = {"horizon": spec["horizon"]} if name in ("lgbm", "mix", "ensemble") else {}
    model = make_model(name, target, **kwargs)
    train_end = utc(spec.get("train_end") or spec["start"])
    c0, w0 = time.process_time(), time.perf_counter()
    model.fit(data[data["hour_utc"] < train_end], target)
    fit_cpu, fit_wall = time.process_time() - c0, time.perf_counter() - w0
    c0, w0 = time.process_time(), time.perf_counter()
    results = run_backtest(model, target, regions, data, published, start=spec["start"], end=spec["end"],
                           horizon=spec["horizon"], fit=False, context_days=spec.get("context_days", CONTEXT_DAYS))
    pred_cpu, pred_wall = time.process_time() - c0, time.perf_counter() - w0
    out = {"target": target, "model": name, "fit_cpu_s": round(fit_cpu, 1), "fit_wall_s": round(fit_wall, 1),
           "predict_cpu_s": round(pred_cpu, 1), "predict_wall_s": round(pred_wall, 1), "regions": {}}
    for res in results:
        res.model = name
        out["regions"][res.region] = res.metrics
        if spec.get("plot") and len(res.forecasts):
            from pathlib import Path

            out["regions"][res.region]["plot"] = str(write_plot(res, published, Path(spec["plot_dir"])))
    return out


def build_results(models, targets, regions, start, end, horizon=96, jobs=1, source="auto", plot_models=(),
                  plot_dir="var/reports/forecast", progress=None) -> dict:
    """Run every (target, model) backtest (in `jobs` processes) and collect metrics and baselines."""
    say = progress or (lambda msg: None)
    specs = [
        {"target": t, "model": m, "regions": list(regions), "start": start, "end": end, "horizon": horizon,
         "source": source, "plot": m in plot_models, "plot_dir": plot_dir}
        for t in targets for m in models
        if applicable(m, t)
    ]
    runs = []
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(results_job, s): s for s in specs}
            for fut in as_completed(futures):
                s = futures[fut]
                try:
                    runs.append(fut.result())
                    say(f"{s['target']}/{s['model']}: done")
                except Exception as exc:  # noqa: BLE001 - one failing model must not lose the others
                    runs.append({"target": s["target"], "model": s["model"], "error": f"{type(exc).__name__}: {exc}"})
                    say(f"{s['target']}/{s['model']}: FAILED {exc}")
    else:
        for s in specs:
            try:
                runs.append(results_job(s))
                say(f"{s['target']}/{s['model']}: done")
            except Exception as exc:  # noqa: BLE001
                runs.append({"target": s["target"], "model": s["model"], "error": f"{type(exc).__name__}: {exc}"})
                say(f"{s['target']}/{s['model']}: FAILED {exc}")
    data, published = load_inputs(list(regions), source=source)
    baselines = {t: baseline_by_bucket(published, data, t, target_regions(t, regions), start, end) for t in targets}
    order = {(t, m): i for i, (t, m) in enumerate((s["target"], s["model"]) for s in specs)}
    runs.sort(key=lambda r: order.get((r["target"], r["model"]), 0))
    import os as _os
    import platform

    env = {"cpu_count": _os.cpu_count(), "python": platform.python_version()}
    for mod in ("numpy", "pandas", "lightgbm", "sklearn"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return {"start": start, "end": end, "train_end": start, "horizon": horizon, "regions": list(regions),
            "targets": list(targets), "models": list(models), "runs": runs, "baselines": baselines,
            "environment": env}


def _fmt(x, nd=2) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def render_markdown(results: dict, command: str = "") -> str:
    """The results document: headline day-ahead table per target, then model × region × bucket with coverage."""
    from forecasting.metrics import HORIZON_BUCKETS, bucket_label

    lines = ["# Forecast results: the standard comparison", ""]
    lines += [
        f"Trained on data before {results['train_end']} (UTC), tested {results['start']} … {results['end']}: "
        f"forecasts issued daily at 00:00 UTC for horizons 1–{results['horizon']} h, each from data known before "
        "its issue time (weather forecasts and already-published operator forecasts allowed). Day-ahead = "
        "horizons 1–24 of the 00:00 issue (the 24 hours of that UTC day), as DACF. Carbon intensity: MAPE (%) of "
        "direct, production-based CI (DE recomputed from the mix). Solar/wind: MAE as % of mean actual output. "
        "Coverage: share of actuals inside P10–P90 (target 80 ± 5 %). **Bold** = better than the published "
        "forecast.",
        "",
    ]
    if command:
        lines += [f"Regenerate: `{command}`", ""]
    buckets = [bucket_label(lo, hi) for lo, hi in HORIZON_BUCKETS]
    losses = []
    for target in results["targets"]:
        runs = [r for r in results["runs"] if r["target"] == target and applicable(r["model"], target)]
        base = results["baselines"].get(target, {})
        name = "mape" if target == "carbon_intensity" else "error_pct_of_mean"
        label = "MAPE %" if target == "carbon_intensity" else "error % of mean output"
        regions = target_regions(target, results["regions"])
        lines += [f"## {target}: day-ahead {label}", ""]
        lines += ["| model | " + " | ".join(regions) + " | mean | better than published |",
                  "|---" * (len(regions) + 3) + "|"]
        pub_label = "DACF (published)" if target == "carbon_intensity" else "published day-ahead"
        pub_vals = [base.get(r, {}).get("day_ahead") for r in regions]
        cells = []
        for r, v in zip(regions, pub_vals):
            b = base.get(r)
            tag = "" if b is None else ("" if b["is_reference"] else " (DACF ANN)")
            cells.append(_fmt(v) + tag)
        ref = [v for r, v in zip(regions, pub_vals) if v is not None and base[r]["is_reference"]]
        lines.append(f"| {pub_label} | " + " | ".join(cells) + f" | {_fmt(np.mean(ref)) if ref else '–'} | |")
        for run in runs:
            if "error" in run:
                lines.append(f"| {run['model']} | failed: {run['error']} |")
                continue
            vals, cells, wins, comparable = [], [], 0, 0
            for r in regions:
                v = run["regions"].get(r, {}).get(f"day_ahead_{name}")
                vals.append(v)
                b = base.get(r)
                better = b is not None and b["is_reference"] and v is not None and v < b["day_ahead"]
                if b is not None and b["is_reference"] and v is not None:
                    comparable += 1
                    wins += better
                cells.append(f"**{_fmt(v)}**" if better else _fmt(v))
            ok = [v for v in vals if v is not None]
            lines.append(f"| {run['model']} | " + " | ".join(cells) + f" | {_fmt(np.mean(ok)) if ok else '–'} | "
                         f"{wins} of {comparable} |")
        lines.append("")
        if target != "carbon_intensity":
            lines += ["Published solar/wind: the grid operator's day-ahead forecast for CISO (CAISO OASIS), DE and SE "
                      "(ENTSO-E); the PJM, ERCO and ISNE columns of the DACF files are DACF's own ANN, shown for "
                      "reference and not counted.", ""]
        # Detailed table.
        lines += [f"### {target}: {label} by horizon bucket, P10–P90 coverage %", ""]
        header = ["region", "model", *buckets, "day-ahead", "cov 1-24", "cov all", *[f"cov {b}" for b in buckets]]
        lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for r in regions:
            b = base.get(r)
            if b is not None:
                who = b["publisher"] + ("" if b["is_reference"] else " (ANN, not counted)")
                lines.append(f"| {r} | published: {who} | {_fmt(b['1-6'])} | {_fmt(b['7-24'])} | – | – | "
                             f"{_fmt(b['day_ahead'])} | – | – |" + " – |" * len(buckets))
            for run in runs:
                if "error" in run or r not in run["regions"]:
                    continue
                m = run["regions"][r]
                by = m.get("by_horizon", {})
                row = [r, run["model"]]
                row += [_fmt(by.get(bk, {}).get(name)) for bk in buckets]
                da = m.get(f"day_ahead_{name}")
                better = b is not None and b["is_reference"] and da is not None and da < b["day_ahead"]
                row.append(f"**{_fmt(da)}**" if better else _fmt(da))
                row += [_fmt(m.get("day_ahead_coverage_p10_p90"), 1), _fmt(m.get("coverage_p10_p90"), 1)]
                row += [_fmt(by.get(bk, {}).get("coverage_p10_p90"), 1) for bk in buckets]
                lines.append("| " + " | ".join(row) + " |")
                if run["model"] == "ensemble" and b is not None and b["is_reference"] and da is not None \
                        and da >= b["day_ahead"]:
                    losses.append(f"{target} {r}: ensemble {_fmt(da)} vs {b['publisher']} {_fmt(b['day_ahead'])}")
        lines.append("")
    lines += ["## Where the ensemble loses to the published forecast", ""]
    lines += [f"- {x}" for x in losses] or ["- nowhere"]
    lines += ["", "## Training and forecasting time", "",
              "| target | model | fit CPU s (all regions) | fit wall s | backtest CPU s | backtest wall s |",
              "|---|---|---|---|---|---|"]
    total = 0.0
    for run in results["runs"]:
        if "error" in run:
            continue
        total += run["fit_cpu_s"]
        lines.append(f"| {run['target']} | {run['model']} | {run['fit_cpu_s']} | {run['fit_wall_s']} | "
                     f"{run['predict_cpu_s']} | {run['predict_wall_s']} |")
    lines += ["", f"Total fit CPU time, every model and target, all regions: {total:.0f} s (single-threaded; "
              "wall time is higher when the machine is shared).", "",
              f"Environment: {json.dumps(results.get('environment', {}))}", ""]
    return "\n".join(lines)
