"""The standard comparison: every (target, model) backtest over its regions, the published baselines per horizon
bucket, and the markdown results document (`python -m forecasting results`)."""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd

from common.timeutil import utc
from forecasting.base import HORIZON_BUCKETS, TARGET_COLUMNS
from forecasting.data import OPERATOR_SERIES
from forecasting.evaluation.backtest import CONTEXT_DAYS, load_inputs, run_backtest, window_end
from forecasting.evaluation.metrics import bucket_label, error_pct_of_mean, mape
from forecasting.evaluation.plots import write_plot
from forecasting.models.registry import applicable, make_model

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
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # in a worker process of build_results
    warnings.filterwarnings("ignore")
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
    results = run_backtest(
        model,
        target,
        regions,
        data,
        published,
        start=spec["start"],
        end=spec["end"],
        horizon=spec["horizon"],
        fit=False,
        context_days=spec.get("context_days", CONTEXT_DAYS),
    )
    pred_cpu, pred_wall = time.process_time() - c0, time.perf_counter() - w0
    out = {
        "target": target,
        "model": name,
        "fit_cpu_s": round(fit_cpu, 1),
        "fit_wall_s": round(fit_wall, 1),
        "predict_cpu_s": round(pred_cpu, 1),
        "predict_wall_s": round(pred_wall, 1),
        "regions": {},
    }
    for res in results:
        res.model = name
        out["regions"][res.region] = res.metrics
        if spec.get("plot") and len(res.forecasts):
            out["regions"][res.region]["plot"] = str(write_plot(res, published, Path(spec["plot_dir"])))
    return out


def build_results(
    models,
    targets,
    regions,
    start,
    end,
    horizon=96,
    jobs=1,
    source="auto",
    plot_models=(),
    plot_dir="var/reports/forecast",
    progress=None,
) -> dict:
    """Run every (target, model) backtest (in `jobs` processes) and collect metrics and baselines."""
    say = progress or (lambda msg: None)
    specs = [
        {
            "target": t,
            "model": m,
            "regions": list(regions),
            "start": start,
            "end": end,
            "horizon": horizon,
            "source": source,
            "plot": m in plot_models,
            "plot_dir": plot_dir,
        }
        for t in targets
        for m in models
        if applicable(m, t)
    ]
    runs = []
    if jobs > 1:
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
    env = {"cpu_count": os.cpu_count(), "python": platform.python_version()}
    for mod in ("numpy", "pandas", "lightgbm", "sklearn"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return {
        "start": start,
        "end": end,
        "train_end": start,
        "horizon": horizon,
        "regions": list(regions),
        "targets": list(targets),
        "models": list(models),
        "runs": runs,
        "baselines": baselines,
        "environment": env,
    }


def _fmt(x, nd=2) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def render_markdown(results: dict, command: str = "") -> str:
    """The results document: headline day-ahead table per target, then model × region × bucket with coverage."""
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
        lines += [
            "| model | " + " | ".join(regions) + " | mean | better than published |",
            "|---" * (len(regions) + 3) + "|",
        ]
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
            lines.append(
                f"| {run['model']} | " + " | ".join(cells) + f" | {_fmt(np.mean(ok)) if ok else '–'} | "
                f"{wins} of {comparable} |"
            )
        lines.append("")
        if target != "carbon_intensity":
            lines += [
                "Published solar/wind: the grid operator's day-ahead forecast for CISO (CAISO OASIS), DE and SE "
                "(ENTSO-E); the PJM, ERCO and ISNE columns of the DACF files are DACF's own ANN, shown for "
                "reference and not counted.",
                "",
            ]
        # Detailed table.
        lines += [f"### {target}: {label} by horizon bucket, P10–P90 coverage %", ""]
        header = ["region", "model", *buckets, "day-ahead", "cov 1-24", "cov all", *[f"cov {b}" for b in buckets]]
        lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for r in regions:
            b = base.get(r)
            if b is not None:
                who = b["publisher"] + ("" if b["is_reference"] else " (ANN, not counted)")
                lines.append(
                    f"| {r} | published: {who} | {_fmt(b['1-6'])} | {_fmt(b['7-24'])} | – | – | "
                    f"{_fmt(b['day_ahead'])} | – | – |" + " – |" * len(buckets)
                )
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
                if (
                    run["model"] == "ensemble"
                    and b is not None
                    and b["is_reference"]
                    and da is not None
                    and da >= b["day_ahead"]
                ):
                    losses.append(f"{target} {r}: ensemble {_fmt(da)} vs {b['publisher']} {_fmt(b['day_ahead'])}")
        lines.append("")
    lines += ["## Where the ensemble loses to the published forecast", ""]
    lines += [f"- {x}" for x in losses] or ["- nowhere"]
    lines += [
        "",
        "## Training and forecasting time",
        "",
        "| target | model | fit CPU s (all regions) | fit wall s | backtest CPU s | backtest wall s |",
        "|---|---|---|---|---|---|",
    ]
    total = 0.0
    for run in results["runs"]:
        if "error" in run:
            continue
        total += run["fit_cpu_s"]
        lines.append(
            f"| {run['target']} | {run['model']} | {run['fit_cpu_s']} | {run['fit_wall_s']} | "
            f"{run['predict_cpu_s']} | {run['predict_wall_s']} |"
        )
    lines += [
        "",
        f"Total fit CPU time, every model and target, all regions: {total:.0f} s (single-threaded; "
        "wall time is higher when the machine is shared).",
        "",
        f"Environment: {json.dumps(results.get('environment', {}))}",
        "",
    ]
    return "\n".join(lines)
