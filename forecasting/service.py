"""Training and issuing forecasts: the work behind `python -m forecasting train|predict` and the forecast DAGs.

`train` fits each (model, target) on the history before the validation window (the last `val_days` before the
cut-off), scores its day-ahead forecasts over that window (and the seasonal naive's on the same hours), refits it on
the whole history when `refit` and the budget share allow, and registers the version with those metrics; `trained_at`
is the data cut-off, never the wall clock. The TFT is fitted once and picks its best epoch on the same window, so it
never trains on the hours it is scored on. The wall-clock `budget_s` is shared by weight over the jobs still to run,
cheap models first and the TFT (which stops itself) last; an unknown model, or a job that cannot start within the
budget, is skipped.

`predict` issues forecasts at an explicit `as_of` (rounded up to the hour) with the newest good version of each model
trained before it, from data masked as known at `as_of`. Rows it cannot give (no version, a failure, regions or
hours left out) come from that model's last earlier non-fallback forecast, else the seasonal naive, flagged
`is_fallback` with a `fallback_reason`. Rows are stored by delete-insert per (issued_at, region, target, model), so
issuing twice gives identical rows.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import multiprocessing
import os
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from common.timeutil import HOUR, utc
from forecasting.base import TARGET_COLUMNS
from forecasting.data import attach_published, grid_hourly, issue_hour, load_published_forecasts, mask_known
from forecasting.evaluation.metrics import error_pct_of_mean, mape, point_metric_name, summarize
from forecasting.models.naive import SeasonalNaive
from forecasting.models.registry import MODEL_NAMES, ModelUnavailable, applicable, make_model
from forecasting.store import FORECAST_COLUMNS, forecast_frame, last_good_forecast, write_forecasts
from warehouse.model_registry import latest_good, register_model

DEFAULT_REGIONS = ("CISO", "PJM", "ERCO", "ISNE", "SE", "DE")
# Cheap models first, the TFT (which stops itself on its budget share) last so that it gets what is left.
# Each lane's wall-clock budget: 14 min, leaving a minute of the 15-minute target for loading and registering.
DEFAULT_BUDGET_S = 840.0
DEFAULT_TRAIN_MODELS = ("naive-24", "prophet", "lgbm", "mix", "ensemble", "tft")
# Relative shares of the training budget.
BUDGET_WEIGHT = {
    "tft": 6.0,
    "lgbm": 2.0,
    "mix": 2.0,
    "ensemble": 3.0,
    "prophet": 0.5,
    "naive-24": 0.2,
    "naive-168": 0.2,
}
CHEAP_REFIT_S = 30.0  # with refit="auto", a fit this cheap (CPU s) is always repeated on the whole history
PREDICT_CONTEXT_DAYS = 60  # history handed to predict (the longest look-back is the TFT's 336 h)
FALLBACK_NAIVE = "naive-24"

log = logging.getLogger(__name__)


def cutoff_from(train_end) -> pd.Timestamp:
    """`--train-end 2021-06-30` (a date) includes that whole day: the cut-off is 2021-07-01T00:00Z. A timestamp with a
    time is the exclusive cut-off itself."""
    text = str(train_end)
    ts = utc(train_end)
    if len(text) <= 10 and ts == ts.floor("D"):
        return ts + pd.Timedelta(days=1)
    return ts.ceil("h")


# ------------------------------------------------------------------------------------------------ data


def load_frame(regions, start=None, end=None, source: str = "auto", db_path=None) -> pd.DataFrame:
    """grid_hourly for `regions` in [start, end), with the operators' published forecasts attached when available."""
    frame = grid_hourly(list(regions), start=start, end=end, source=source, db_path=db_path)
    try:
        published = load_published_forecasts(list(regions), start=start, end=end, source=source, db_path=db_path)
        frame = attach_published(frame, published)
    except Exception as exc:  # noqa: BLE001 - published forecasts are optional inputs
        log.info("published forecasts not attached: %s", exc)
    return frame


# ------------------------------------------------------------------------------------------------ validation


def _naive_day_ahead(data: pd.DataFrame, column: str, scored: pd.DataFrame) -> pd.Series:
    """Seasonal-naive (same hour, last known day) point forecast for the scored rows (day-ahead issues at 00:00)."""
    series = data.drop_duplicates(["region", "hour_utc"]).set_index(["region", "hour_utc"])[column]
    h = scored["horizon_h"].to_numpy()
    back = 24 * np.ceil(h / 24).astype(int)
    src = pd.to_datetime(scored["target_time"], utc=True) - pd.to_timedelta(back, unit="h")
    keys = pd.MultiIndex.from_arrays([scored["region"].to_numpy(), src])
    return pd.Series(series.reindex(keys).to_numpy(), index=scored.index)


def validate(model, data: pd.DataFrame, target: str, start: pd.Timestamp, end: pd.Timestamp, horizon: int = 24) -> dict:
    """Day-ahead scores of a fitted model over issues at 00:00 UTC in [start, end)."""
    column = TARGET_COLUMNS[target]
    frames = []
    for issued in pd.date_range(start.ceil("D"), end - HOUR, freq="D"):
        window = data[
            (data["hour_utc"] >= issued - pd.Timedelta(days=PREDICT_CONTEXT_DAYS))
            & (data["hour_utc"] < issued + horizon * HOUR)
        ]
        out = model.predict(issued, horizon, mask_known(window, issued))
        if out is not None and len(out):
            frames.append(out)
    if not frames:
        return {"error": "no validation forecasts"}
    scored = pd.concat(frames, ignore_index=True)
    scored["target_time"] = pd.to_datetime(scored["target_time"], utc=True)
    actual = data[["region", "hour_utc", column]].rename(columns={"hour_utc": "target_time", column: "actual"})
    scored = scored.merge(actual, on=["region", "target_time"], how="left")
    scored = scored[scored["target_time"] < end]
    metrics = summarize(scored, target)
    metrics.pop("by_horizon", None)
    name = point_metric_name(target)
    metrics["by_region"] = {
        region: summarize(part, target)[name] for region, part in scored.groupby("region", sort=True)
    }
    naive = _naive_day_ahead(data, column, scored)
    if name == "mape":
        metrics["naive24_mape"] = round(mape(scored["actual"], naive), 3)
    else:
        metrics[f"naive24_{name}"] = round(error_pct_of_mean(scored["actual"], naive), 3)
    metrics["window"] = [start.isoformat(), end.isoformat()]
    return metrics


# ------------------------------------------------------------------------------------------------ train


@dataclass
class TrainResult:
    model: str
    target: str
    status: str  # good | failed | skipped
    version: str | None = None
    trained_at: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    metrics: dict = field(default_factory=dict)
    message: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _budget_share(name: str, remaining_jobs: list[str], remaining_s: float) -> float:
    weights = [BUDGET_WEIGHT.get(n, 0.5) for n in remaining_jobs]
    return remaining_s * BUDGET_WEIGHT.get(name, 0.5) / max(sum(weights), 1e-9)


def _fit(model, history: pd.DataFrame, target: str, budget_s: float | None):
    if budget_s is not None and "budget_s" in inspect.signature(model.fit).parameters:
        return model.fit(history, target, budget_s=budget_s)
    return model.fit(history, target)


def train(
    models=None,
    targets=("carbon_intensity",),
    regions=DEFAULT_REGIONS,
    train_end="2021-06-30",
    budget_s: float = DEFAULT_BUDGET_S,
    tiny: bool = False,
    val_days: int = 14,
    data: pd.DataFrame | None = None,
    source: str = "auto",
    db_path=None,
    progress=None,
    refit: str = "auto",
    min_tft_s: float = 60.0,
    workers: int = 1,
) -> list[TrainResult]:
    """Fit, validate and register each (model, target). Returns one TrainResult per job (see module docstring).

    `workers=2` trains the TFT in a second (single-threaded) process beside the other models, each lane with the
    whole wall-clock budget (two cores train both lanes at once)."""
    import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it

    if refit not in ("auto", "always", "never"):
        raise ValueError("refit must be auto, always or never")
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    models = list(models or DEFAULT_TRAIN_MODELS)
    targets = list(targets)
    regions = list(regions)
    cutoff = cutoff_from(train_end)
    val_start = cutoff - pd.Timedelta(days=val_days)
    say = progress or (lambda msg: None)
    started = time.monotonic()
    if data is None:
        data = load_frame(regions, end=cutoff, source=source, db_path=db_path)
    data = data[data["region"].isin(regions) & (data["hour_utc"] < cutoff)]
    if data.empty:
        raise ValueError(f"no grid data before {cutoff.isoformat()} for regions {regions}")
    lane, pool = None, None
    if workers >= 2 and "tft" in models and len(models) > 1:
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        lane = pool.submit(
            _train_lane,
            dict(
                models=["tft"],
                targets=targets,
                regions=regions,
                train_end=train_end,
                budget_s=budget_s - (time.monotonic() - started) if budget_s else budget_s,
                tiny=tiny,
                val_days=val_days,
                data=data,
                source=source,
                db_path=db_path,
                refit=refit,
                min_tft_s=min_tft_s,
            ),
        )
        models = [m for m in models if m != "tft"]
        say("tft: training in a second process")
    jobs = [(m, t) for t in targets for m in models if applicable(m, t)]  # the mix composite: carbon intensity only
    results: list[TrainResult] = []
    # (model, target, first hour not seen) of every fit so far: the ensembles take their members from here
    fitted_so_far: list[tuple] = []
    for i, (name, target) in enumerate(jobs):
        elapsed = time.monotonic() - started
        remaining = budget_s - elapsed if budget_s else None
        share = _budget_share(name, [m for m, _ in jobs[i:]], remaining) if remaining is not None else None
        floor = min_tft_s if name == "tft" else 1.0
        if remaining is not None and remaining <= floor:
            results.append(
                TrainResult(
                    name,
                    target,
                    "skipped",
                    message=f"training budget of {budget_s:.0f} s spent ({remaining:.0f} s left)",
                )
            )
            say(f"{name}/{target}: skipped (budget spent)")
            continue
        t0 = time.monotonic()
        c0 = time.process_time()
        trained_at = cutoff
        try:
            try:
                model = make_model(name, target, tiny=tiny)
            except ModelUnavailable as exc:
                results.append(TrainResult(name, target, "skipped", message=str(exc)))
                say(f"{name}/{target}: skipped ({exc})")
                continue
            is_tft = name == "tft"
            if is_tft:
                # One fit: the TFT holds out the validation window itself (best-epoch selection), then is scored on it.
                model.settings.val_days = val_days
                # Leave room for scoring and registering after the fit.
                _fit(model, data, target, max(share - 30.0, 0.9 * share) if share is not None else None)
                metrics = validate(model, data, target, val_start, cutoff)
                final = model
            else:
                fit_budget = share / 2 if share is not None else None
                t_fit, c_fit = time.monotonic(), time.process_time()
                before_val = data[data["hour_utc"] < val_start]
                if hasattr(model, "offer_fitted"):
                    model.offer_fitted(fitted_so_far)
                _fit(model, before_val, target, fit_budget)
                if getattr(_inner(model), "reused_members_", None):
                    say(f"{name}/{target}: took {', '.join(_inner(model).reused_members_)} as fitted in this run")
                _remember_fit(fitted_so_far, jobs[i + 1 :], model, target, before_val)
                fit_s, fit_cpu_s = time.monotonic() - t_fit, time.process_time() - c_fit
                metrics = validate(model, data, target, val_start, cutoff)
                used = time.monotonic() - t0
                do_refit = refit == "always" or (
                    refit == "auto" and (share is None or used + fit_s <= share or fit_cpu_s <= CHEAP_REFIT_S)
                )
                if do_refit:
                    final = make_model(name, target, tiny=tiny)
                    if hasattr(final, "offer_fitted"):
                        final.offer_fitted(fitted_so_far)
                    _fit(final, data, target, fit_budget)
                    _remember_fit(fitted_so_far, jobs[i + 1 :], final, target, data)
                else:
                    # Register the validated fit itself: its cut-off is the start of the validation window.
                    final, trained_at = model, val_start
                    metrics["refit"] = False
                    say(
                        f"{name}/{target}: no refit on the last {val_days} days ({refit=}, "
                        f"{used:.0f} s used of a {share or 0:.0f} s share)"
                    )
            seconds = time.monotonic() - t0
            metrics["train_seconds"] = round(seconds, 2)
            metrics["train_cpu_seconds"] = round(time.process_time() - c0, 2)
            params = {"tiny": tiny, "regions": regions, "val_days": val_days}
            try:
                params["model"] = final.get_params()
            except Exception:  # noqa: BLE001
                pass
            record = register_model(final, name, target, trained_at, params=params, metrics=metrics, db_path=db_path)
            results.append(
                TrainResult(
                    name,
                    target,
                    "good",
                    record.version,
                    trained_at.isoformat(),
                    round(seconds, 2),
                    round(time.process_time() - c0, 2),
                    metrics,
                )
            )
            say(f"{name}/{target}: {record.version} in {seconds:.1f} s; validation {metrics_headline(metrics)}")
        except Exception as exc:  # noqa: BLE001 - a failing model must not stop the others
            seconds = time.monotonic() - t0
            message = f"{type(exc).__name__}: {exc}"
            log.debug("training %s/%s failed\n%s", name, target, traceback.format_exc())
            try:
                record = register_model(
                    None,
                    name,
                    target,
                    cutoff,
                    params={"tiny": tiny, "regions": regions},
                    metrics={"error": message},
                    status="failed",
                    db_path=db_path,
                )
                version = record.version
            except Exception:  # noqa: BLE001
                version = None
            results.append(
                TrainResult(
                    name,
                    target,
                    "failed",
                    version,
                    cutoff.isoformat(),
                    round(seconds, 2),
                    round(time.process_time() - c0, 2),
                    message=message,
                )
            )
            say(f"{name}/{target}: FAILED after {seconds:.1f} s: {message}")
    if lane is not None:
        try:
            for doc in lane.result():
                result = TrainResult(**doc)
                results.append(result)
                detail = (
                    f"; validation {metrics_headline(result.metrics)}" if result.metrics else f" ({result.message})"
                )
                say(
                    f"{result.model}/{result.target}: {result.status} {result.version or ''} in {result.seconds:.1f} s"
                    + detail
                )
        except Exception as exc:  # noqa: BLE001 - the second process died
            for target in targets:
                results.append(
                    TrainResult("tft", target, "failed", message=f"TFT process: {type(exc).__name__}: {exc}")
                )
        finally:
            pool.shutdown()
    return results


def _inner(model):
    """The ensemble inside an operator blend (solar, wind), else the model itself."""
    return getattr(model, "base", model)


def _fallback_frame(region: str, part: pd.DataFrame, model_version, fallback_reason) -> pd.DataFrame:
    """Fallback forecast rows of one region: the quantiles of `part` with where they came from and why."""
    return pd.DataFrame(
        {
            "region": region,
            "target_time": part["target_time"].to_numpy(),
            "p10": part["p10"].to_numpy(),
            "p50": part["p50"].to_numpy(),
            "p90": part["p90"].to_numpy(),
            "model_version": model_version,
            "fallback_reason": fallback_reason,
        }
    )


def _remember_fit(fitted_so_far: list, jobs_left, model, target: str, history: pd.DataFrame) -> None:
    """Keep a copy of a just-fitted model for the ensembles still to train (taken before validation: predicting
    fills forecast caches that a fresh fit would not have)."""
    if any(name == "ensemble" and t == target for name, t in jobs_left):
        fitted_so_far.append((copy.deepcopy(model), target, history["hour_utc"].max() + HOUR))


def quiet_library_logs() -> None:
    """Only errors from the libraries' loggers (cmdstanpy, Prophet, Lightning), which log every fit."""
    for name in ("cmdstanpy", "prophet", "lightning", "lightning.pytorch", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _train_lane(kwargs: dict) -> list[dict]:
    """The second process of `train(workers=2)`."""
    quiet_library_logs()
    return [r.to_dict() for r in train(**kwargs)]


def metrics_headline(metrics: dict) -> str:
    """The point metric and the naive-24 one on the same hours, for progress lines."""
    for key in ("mape", "error_pct_of_mean"):
        if metrics.get(key) is not None:
            naive = metrics.get(f"naive24_{key}")
            return f"{key} {metrics[key]:.2f} (naive-24 {naive})"
    return json.dumps(metrics)[:120]


# ------------------------------------------------------------------------------------------------ predict


@dataclass
class PredictResult:
    model: str
    target: str
    version: str | None
    rows: int
    fallback_rows: int
    regions: list[str]
    reasons: list[str]

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _seasonal_naive(data: pd.DataFrame, target: str, issued: pd.Timestamp, horizon: int, regions) -> pd.DataFrame:
    """The fallback's seasonal naive (period 24), fitted on the known history."""
    history = data[(data["hour_utc"] < issued) & data["region"].isin(list(regions))]
    model = SeasonalNaive(period=24, max_horizon=max(horizon, 24)).fit(history, target)
    out = model.predict(issued, horizon, data[data["region"].isin(list(regions))])
    if not len(out):
        return out
    out = out[out["p50"].notna()].copy()
    for col in ("p10", "p90"):  # no residual quantiles (short history): a point band
        out[col] = out[col].fillna(out["p50"])
    return out


def _check_output(out: pd.DataFrame, regions, issued: pd.Timestamp, horizon: int) -> tuple[pd.DataFrame, dict]:
    """Keep the complete, finite, on-grid rows; return them and {region: problem} for the rest."""
    problems: dict[str, str] = {}
    if out is None or len(out) == 0:
        return pd.DataFrame(), {r: "no rows" for r in regions}
    out = out.copy()
    out["target_time"] = pd.to_datetime(out["target_time"], utc=True)
    hours = pd.date_range(issued, periods=horizon, freq="h")
    good = []
    for region in regions:
        part = out[out["region"] == region]
        if part.empty:
            problems[region] = "no rows for region"
            continue
        part = part[part["target_time"].isin(hours)].drop_duplicates("target_time")
        finite = np.isfinite(part[["p10", "p50", "p90"]].to_numpy(dtype=float)).all(axis=1)
        bad = len(hours) - int(finite.sum())
        if bad:
            problems[region] = f"{bad} of {len(hours)} hours missing or not finite"
        good.append(part[finite])
    return (pd.concat(good, ignore_index=True) if good else pd.DataFrame()), problems


def _fallback_rows(
    model_name: str,
    target: str,
    reason: str,
    missing: dict[str, pd.DatetimeIndex],
    issued: pd.Timestamp,
    horizon: int,
    data: pd.DataFrame,
    db_path=None,
) -> pd.DataFrame:
    """Rows for `missing` {region: hours}: the last good earlier forecast, else the seasonal naive; flagged."""
    if not missing:
        return pd.DataFrame()
    regions = sorted(missing)
    end = issued + horizon * HOUR
    parts = []
    previous = last_good_forecast(
        model_name, target, regions, before=issued, target_from=issued, target_until=end, db_path=db_path
    )
    covered: dict[str, set] = {r: set() for r in regions}
    if len(previous):
        for region, part in previous.groupby("region"):
            part = part[part["target_time"].isin(missing[region])]
            if part.empty:
                continue
            src_issue = part["issued_at"].max()
            parts.append(
                _fallback_frame(
                    region,
                    part,
                    part["model_version"].to_numpy(),
                    [f"{reason}; last good forecast issued {pd.Timestamp(t).isoformat()}" for t in part["issued_at"]],
                )
            )
            covered[region] = set(part["target_time"])
            log.info("%s/%s %s: reused forecast issued up to %s", model_name, target, region, src_issue)
    rest = {
        r: missing[r].difference(pd.DatetimeIndex(sorted(covered[r])) if covered[r] else pd.DatetimeIndex([]))
        for r in regions
    }
    rest = {r: h for r, h in rest.items() if len(h)}
    if rest:
        try:
            naive = _seasonal_naive(data, target, issued, horizon, sorted(rest))
        except Exception as exc:  # noqa: BLE001
            naive = pd.DataFrame()
            log.warning("seasonal naive fallback failed: %s", exc)
        if len(naive):
            naive["target_time"] = pd.to_datetime(naive["target_time"], utc=True)
            for region, hours in rest.items():
                part = naive[(naive["region"] == region) & naive["target_time"].isin(hours)]
                if part.empty:
                    continue
                parts.append(
                    _fallback_frame(region, part, FALLBACK_NAIVE, f"{reason}; seasonal naive ({FALLBACK_NAIVE})")
                )
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    out["is_fallback"] = True
    return out


def _load(record, name: str, target: str, loaded: dict | None):
    """The forecaster of a registry record: from `loaded` when the caller keeps one (see `predict`), else loaded."""
    if loaded is None:
        return record.load()
    key = (name, target, record.version)
    if key not in loaded:
        loaded[key] = record.load()
    return loaded[key]


def predict(
    as_of,
    horizon: int = 96,
    regions=DEFAULT_REGIONS,
    targets=("carbon_intensity",),
    models=None,
    data: pd.DataFrame | None = None,
    source: str = "auto",
    db_path=None,
    write: bool = True,
    bootstrap_tiny: bool = False,
    loaded: dict | None = None,
) -> tuple[pd.DataFrame, list[PredictResult]]:
    """Issue forecasts at `as_of` (see module docstring). Returns the rows (as stored) and a summary per job.
    `loaded`: a dict the caller keeps between issues in one process (a replay loop), holding the forecasters loaded
    so far by (name, target, version); a reused one keeps its members' forecasts of earlier issue times (its
    `ForecastMemory`, as in a backtest), so the ensemble's rolling weights cost one new member forecast per issue
    instead of one per day of its window."""
    import torch  # noqa: PLC0415 - torch loads in seconds; only training/prediction paths need it

    torch.set_num_threads(1)
    if as_of is None:
        raise ValueError("predict needs an explicit as_of (the issue time); the wall clock is never used")
    if horizon < 1:
        raise ValueError("horizon must be ≥ 1")
    issued = issue_hour(as_of)
    regions = list(regions)
    targets = list(targets)
    if data is None:
        data = load_frame(
            regions,
            start=issued - pd.Timedelta(days=PREDICT_CONTEXT_DAYS),
            end=issued + horizon * HOUR,
            source=source,
            db_path=db_path,
        )
    data = data[
        data["region"].isin(regions)
        & (data["hour_utc"] >= issued - pd.Timedelta(days=PREDICT_CONTEXT_DAYS))
        & (data["hour_utc"] < issued + horizon * HOUR)
    ]
    if data.empty:
        raise ValueError(
            f"no grid data for {', '.join(regions)} in the {PREDICT_CONTEXT_DAYS} days before {issued.isoformat()}: "
            "the issue time is outside what the warehouse holds (see `python -m warehouse status`), or the regions "
            "have not been ingested"
        )
    data = mask_known(data.sort_values(["region", "hour_utc"]).reset_index(drop=True), issued)
    hours = pd.date_range(issued, periods=horizon, freq="h")
    all_rows, summary = [], []
    for target in targets:
        names = (
            list(models) if models else [n for n in MODEL_NAMES if latest_good(n, target, issued, db_path) is not None]
        )
        if not names:
            raise ValueError(
                f"no good model for {target} trained before {issued.isoformat()}; run `python -m forecasting train` "
                "first or name --models"
            )
        for name in names:
            record = latest_good(name, target, issued, db_path)
            if record is None and bootstrap_tiny:
                train(
                    [name],
                    [target],
                    regions,
                    issued.isoformat(),
                    budget_s=300,
                    tiny=True,
                    val_days=7,
                    source=source,
                    db_path=db_path,
                )
                record = latest_good(name, target, issued, db_path)
            good = pd.DataFrame()
            problems: dict[str, str] = {}
            reason = None
            try:
                if record is None:
                    raise LookupError(f"no good version of {name}/{target} trained before {issued.isoformat()}")
                forecaster = _load(record, name, target, loaded)
                out = forecaster.predict(issued, horizon, data)
                good, problems = _check_output(out, regions, issued, horizon)
            except Exception as exc:  # noqa: BLE001 - any failure falls back
                reason = f"{name} failed: {type(exc).__name__}: {exc}"
                problems = {r: reason for r in regions}
                good = pd.DataFrame()
            rows = []
            if len(good):
                good = good.assign(model_version=record.version, is_fallback=False, fallback_reason=None)
                rows.append(
                    good[
                        [
                            "region",
                            "target_time",
                            "p10",
                            "p50",
                            "p90",
                            "model_version",
                            "is_fallback",
                            "fallback_reason",
                        ]
                    ]
                )
            missing = {}
            for region in regions:
                have = set(good.loc[good["region"] == region, "target_time"]) if len(good) else set()
                gap = hours.difference(pd.DatetimeIndex(sorted(have)) if have else pd.DatetimeIndex([]))
                if len(gap):
                    missing[region] = gap
            reasons = sorted(set(problems.values()))
            if missing:
                region_reason = reason or f"{name} incomplete: " + "; ".join(
                    f"{r}: {problems.get(r, 'hours missing')}" for r in sorted(missing)
                )
                fb = _fallback_rows(name, target, region_reason, missing, issued, horizon, data, db_path)
                if len(fb):
                    rows.append(fb)
            frame = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
            if len(frame):
                frame["issued_at"] = issued
                frame["target"] = target
                frame["model"] = name
                frame = frame.sort_values(["region", "target_time"]).reset_index(drop=True)
                all_rows.append(frame)
            summary.append(
                PredictResult(
                    model=name,
                    target=target,
                    version=record.version if record else None,
                    rows=len(frame),
                    fallback_rows=int(frame["is_fallback"].sum()) if len(frame) else 0,
                    regions=sorted(frame["region"].unique().tolist()) if len(frame) else [],
                    reasons=reasons,
                )
            )
    out = pd.concat(all_rows, ignore_index=True) if all_rows else pd.DataFrame(columns=list(FORECAST_COLUMNS))
    out = forecast_frame(out) if len(out) else out
    if write and len(out):
        write_forecasts(out, db_path=db_path)
    return out, summary
