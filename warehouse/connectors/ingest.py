"""Live feeds into the warehouse: the function an ingest DAG (or the CLI) calls for one interval."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from common.timeutil import iso_z
from warehouse.connectors.feeds import FeedConfig, FeedFailure, LiveFeeds
from warehouse.connectors.http import ConnectorError, HttpClient
from warehouse.connectors.schema import normalize_interval
from warehouse.db import LoadResult, load_batch, writer

log = logging.getLogger("warehouse.connectors")


class LiveIngestError(ConnectorError):
    """Some regions could not be served by any feed (what could be fetched was loaded)."""

    def __init__(self, failures: list[FeedFailure], results: list[LoadResult]):
        self.failures, self.results = failures, results
        super().__init__("live ingest incomplete: " + " | ".join(str(f) for f in failures))


@dataclass
class LiveIngestReport:
    start: str
    end: str
    results: list[LoadResult] = field(default_factory=list)
    failures: list[FeedFailure] = field(default_factory=list)  # extra/forecast feeds that failed (not fatal)


def ingest_live(
    regions: Iterable[str] | None,
    start,
    end,
    *,
    db_path: Path | str | None = None,
    config: FeedConfig | None = None,
    client: HttpClient | None = None,
    extras: bool = True,
    forecasts: bool = True,
) -> LiveIngestReport:
    """Fetch every region over [start, end) (all configured regions when None) and load the batches.

    Network first, then one short write transaction per batch under the warehouse's writer lock. A region that
    neither its primary nor its fallback can serve does not stop the others: their batches are loaded, then
    LiveIngestError lists the failures (re-running the interval is idempotent).
    """
    feeds = LiveFeeds(config, client)
    start, end = normalize_interval(start, end)
    chosen = list(regions) if regions else list(feeds.config.regions)
    failures: list[FeedFailure] = []
    batches = feeds.batches(chosen, start, end, extras=extras, forecasts=forecasts, on_error="skip", failures=failures)
    fatal = [f for f in failures if f.kind == "region"]
    report = LiveIngestReport(iso_z(start), iso_z(end), failures=[f for f in failures if f.kind != "region"])
    if batches:
        with writer(db_path) as con:
            for batch in batches:
                report.results.append(load_batch(con, batch))
    if fatal:
        raise LiveIngestError(fatal, report.results)
    return report
