"""The operating-loop stage of `python -m pipeline run`: a day of trace jobs through the queue, the hourly loop on
the embedded replay executor, and the carbon ledger of what ran.

The jobs are the demo jobs of `scheduling.queue.trace` for the UTC day of `as_of`, submitted through the same
intake as an operator's file; the loop runs `hours` planning hours from that day's midnight, issuing forecasts every
`forecast_every_h` hours (each hour plans on the latest issue at or before it; the forecasters are loaded once, so
an issue reuses their member forecasts of earlier days, as a backtest does); the ledger marts are then rebuilt with
dbt and summed over the day's jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from common.timeutil import HOUR, utc
from forecasting import service as forecast_service
from scheduling import loop
from scheduling.evaluation.same_jobs import simulate_same_jobs
from scheduling.output.ledger import Ledger, ledger, write_ledger_report
from scheduling.planning.forecasts import PREFERRED_MODELS
from scheduling.queue.intake import IntakeReport, submit_mappings
from scheduling.queue.trace import trace_jobs
from scheduling.tasks import build_ledger

# the simulator's policies on the same jobs: the loop's policy and the baseline without carbon awareness
BASELINE_POLICY = "performance-first"


@dataclass
class LoopDemo:
    intake: IntakeReport
    hours: list[loop.HourResult]
    forecast_issues: int
    ledger: Ledger
    report: Path
    simulated: list[dict]


def run_demo_loop(
    as_of,
    *,
    n_jobs: int = 320,
    hours: int = 48,
    forecast_every_h: int = 6,
    policy: str | None = None,
    forecast_models=None,
    progress=None,
) -> LoopDemo:
    """Submit `n_jobs` trace jobs of the day of `as_of`, run the loop `hours` hours from its midnight, build the
    ledger marts and write the ledger report; `forecast_models`: the forecasters issued every `forecast_every_h`
    hours (default the service's set); `progress(message)` hears about each step."""
    if hours < 1 or forecast_every_h < 1:
        raise ValueError("hours and forecast_every_h must be ≥ 1")
    say = progress or (lambda _msg: None)
    day = utc(as_of).floor("D")
    settings = {"policy": policy} if policy else {}
    ctx = loop.context(day, **settings)
    intake = submit_mappings(
        trace_jobs(day, n_jobs, ctx.fleet), source=f"pipeline:trace-{day:%Y%m%d}", as_of=day + pd.Timedelta(days=1)
    )
    say(f"intake: {intake.counts}")
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
    simulated = simulate_same_jobs(day, n_jobs, ctx.fleet, [ctx.policy, BASELINE_POLICY], job_ids=finished)
    return LoopDemo(intake, results, issues, book, report, simulated)


def planning_forecast_models(available) -> list[str] | None:
    """The one forecaster of `available` the plans read (the planner's preference order), so the loop issues only
    that one; None (the service's set) when none of them is available."""
    have = set(available)
    return next(([m] for m in PREFERRED_MODELS if m in have), None)
