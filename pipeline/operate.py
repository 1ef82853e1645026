"""The operating-loop stage of `python -m pipeline run`: a day of trace jobs through the queue, the hourly loop on
the embedded replay executor, and the carbon ledger of what ran.

The jobs are the demo jobs of `scheduling.queue.trace` for the UTC day of `as_of`, submitted through the same
intake as an operator's file, beside three inference services (`DEMO_SERVICES`), on the configured fleet whose sampled
clusters are re-sized so that the day's jobs fill `load` of their GPU-hours (GPU-milli basis, at their estimated run
times; the declared H100 clusters stay as they are: `demo_fleet`; the load they really placed is reported beside the
ledger); the replay executor runs them with run-time spread `sigma` and `failure_rate`; the loop runs `hours`
planning hours from that day's midnight, issuing forecasts every `forecast_every_h` hours (each hour plans on the
latest issue at or before it; the forecasters are loaded once, so an issue reuses their member forecasts of
earlier days, as a backtest does); the ledger marts are then rebuilt with dbt and summed over the day's jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from common.timeutil import HOUR, utc
from forecasting import service as forecast_service
from scheduling import loop
from scheduling.evaluation.same_jobs import simulate_same_jobs
from scheduling.executors.replay import DEFAULT_FAILURE_RATE, DEFAULT_SIGMA, ReplayExecutor
from scheduling.output.ledger import Ledger, ledger, write_ledger_report
from scheduling.planning.forecasts import PREFERRED_MODELS
from scheduling.queue.intake import IntakeReport, submit_mappings
from scheduling.queue.service_intake import EXAMPLE_SERVICES, submit_service_file
from scheduling.queue.trace import job_gpu_hours, trace_jobs
from scheduling.service_hours import service_replicas
from scheduling.tasks import build_ledger

# the simulator's policies on the same jobs: the loop's policy and the baseline without carbon awareness
BASELINE_POLICY = "performance-first"
# the share of the demo fleet's GPU-hours the day's jobs ask for: a busy fleet, where deadlines are at stake
DEFAULT_DEMO_LOAD = 0.8
# three inference services beside the jobs, on the reference fleet's H100 clusters
DEMO_SERVICES = EXAMPLE_SERVICES


@dataclass
class LoopDemo:
    intake: IntakeReport
    hours: list[loop.HourResult]
    forecast_issues: int
    ledger: Ledger
    report: Path
    simulated: list[dict]
    load: dict


def demo_fleet(fleet, day, n_jobs: int, load: float | None):
    """(fleet, jobs): `fleet` re-sized so that the `n_jobs` trace jobs of `day` ask for `load` of its GPU-hours of
    one day (unchanged when `load` is None), and the jobs drawn for it."""
    jobs = trace_jobs(day, n_jobs, fleet)
    if load is None:
        return fleet, jobs
    if not 0 < load <= 1:
        raise ValueError(f"load must be in (0, 1], got {load!r}")
    sized = fleet.scaled(job_gpu_hours(jobs) / (24.0 * load), seed=0, keep_declared=True)
    return sized, trace_jobs(day, n_jobs, sized)


def placed_load(executor: ReplayExecutor, fleet, day) -> dict:
    """The GPU-hours the day's runs really held (every attempt, at its true run time) over the fleet's GPU-hours of
    the day, GPU-milli basis."""
    runs = executor.runs()
    runs = runs[(runs["plan_id"].notna()) & (runs["dispatched_at"] >= day)]
    ended = (
        runs["cancelled_at"].where(runs["cancelled_at"] < runs["true_end"], runs["true_end"]).fillna(runs["true_end"])
    )
    hours = (ended - runs["start_time"]).dt.total_seconds().clip(lower=0) / 3600.0
    gpu_h = float((hours * runs["gpu_count"].astype(float) * runs["gpu_milli"].astype(float) / 1000.0).sum())
    return {"fleet_gpus": int(fleet.total_gpus), "load": round(gpu_h / (fleet.total_gpus * 24.0), 3)}


def run_demo_loop(
    as_of,
    *,
    n_jobs: int = 320,
    hours: int = 48,
    forecast_every_h: int = 6,
    policy: str | None = None,
    forecast_models=None,
    progress=None,
    load: float | None = DEFAULT_DEMO_LOAD,
    sigma: float = DEFAULT_SIGMA,
    failure_rate: float = DEFAULT_FAILURE_RATE,
    services: str | Path | None = DEMO_SERVICES,
) -> LoopDemo:
    """Submit `n_jobs` trace jobs of the day of `as_of`, run the loop `hours` hours from its midnight on the demo
    fleet (`demo_fleet`, `load`) and the replay executor (`sigma`, `failure_rate`), build the ledger marts and
    write the ledger report; `services`: a services file submitted at the day's midnight beside the jobs (None:
    none); `forecast_models`: the forecasters issued every `forecast_every_h` hours (default the
    service's set); `progress(message)` hears about each step."""
    if hours < 1 or forecast_every_h < 1:
        raise ValueError("hours and forecast_every_h must be ≥ 1")
    say = progress or (lambda _msg: None)
    day = utc(as_of).floor("D")
    settings = {"policy": policy} if policy else {}
    fleet, jobs = demo_fleet(loop.context(day, **settings).fleet, day, n_jobs, load)
    executor = ReplayExecutor(sigma=sigma, failure_rate=failure_rate)
    ctx = loop.context(day, fleet=fleet, executors=dict.fromkeys(fleet.names, executor), **settings)
    say(f"fleet: {fleet.total_gpus} GPUs in {len(fleet)} clusters (sized for load {load}); replay sigma {sigma}")
    intake = submit_mappings(jobs, source=f"pipeline:trace-{day:%Y%m%d}", as_of=day + pd.Timedelta(days=1))
    say(f"intake: {intake.counts}")
    if services is not None:
        served = submit_service_file(services, as_of=day, fleet=ctx.fleet)
        say(f"services ({services}): {served.counts}")
    settings = {**settings, "fleet": ctx.fleet, "executors": ctx.executors}
    results: list[loop.HourResult] = []
    issues = 0
    loaded: dict = {}  # the forecasters, loaded once for all the issues
    for first in range(0, hours, forecast_every_h):
        start = day + first * HOUR
        forecast_service.predict(start, horizon=96, models=forecast_models, loaded=loaded)
        issues += 1
        chunk = loop.run_hours(start, min(forecast_every_h, hours - first), **settings)
        results.extend(chunk)
        say(
            f"{start:%Y-%m-%d %H:%M}Z +{len(chunk)} h: "
            f"{sum(r.dispatch.get('sent', 0) for r in chunk)} dispatched, "
            f"{sum(r.sync.get('events', 0) for r in chunk)} events"
        )
    build_ledger()
    book = ledger(day, day + pd.Timedelta(days=1))
    report = write_ledger_report(book)
    say("simulator: the same jobs with exact run times")
    finished = book.jobs.loc[book.jobs["outcome"] == "finished", "job_id"]
    # the capacity the services held in the loop is held in the simulator too: both plan the jobs on the same GPUs
    held = service_replicas() if services is not None else None
    simulated = simulate_same_jobs(day, n_jobs, ctx.fleet, [ctx.policy, BASELINE_POLICY], job_ids=finished, held=held)
    return LoopDemo(intake, results, issues, book, report, simulated, placed_load(executor, fleet, day))


def planning_forecast_models(available) -> list[str] | None:
    """The one forecaster of `available` the plans read (the planner's preference order), so the loop issues only
    that one; None (the service's set) when none of them is available."""
    have = set(available)
    return next(([m] for m in PREFERRED_MODELS if m in have), None)
