"""Task callables for the ingest DAGs: the DAG files only wire these to Airflow.

Each callable takes plain values (validated Params) and returns a JSON-able summary that the DAG logs and
pushes to XCom, so a run's log says exactly what was loaded.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from common.timeutil import utc
from warehouse.connectors.ingest import ingest_live as fetch_and_load
from warehouse.ingest import ingest, summarize
from warehouse.loaders import all_sources

log = logging.getLogger(__name__)


def sources_in_group(group: str) -> list[str]:
    return [name for name, source in all_sources().items() if source.group == group]


def validate_source_names(group: str, names: list[str] | None) -> list[str]:
    """The named sources, all of `group` when empty; a clear error for a name outside the group."""
    available = sources_in_group(group)
    if not names:
        return available
    unknown = sorted(set(names) - set(available))
    if unknown:
        raise ValueError(f"unknown {group} source(s) {unknown}; choose from {available}")
    return list(names)


def validate_data_dir(data_dir: str | None) -> Path | None:
    if not data_dir:
        return None
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir {path} is not a directory")
    return path


def ingest_group(group: str, names: list[str] | None = None, data_dir: str | None = None) -> list[dict]:
    """Load the chosen sources of one group; returns the per-table summary."""
    chosen = validate_source_names(group, names)
    summary = summarize(ingest(chosen, data_dir=validate_data_dir(data_dir), progress=False))
    for row in summary:
        log.info(
            "%s: %s rows in %s batches (%s unchanged), %s rejected to quarantine",
            row["table"],
            row["rows"],
            row["batches"],
            row["unchanged"],
            row["rejected"],
        )
    return summary


def ingest_live(regions: list[str] | None, start: str, end: str) -> list[dict]:
    """Fetch the live grid feeds for [start, end) (the DAG run's data interval) and load them idempotently.

    Regions: the given ones, else LIVE_GRID_REGIONS (comma-separated, or `all` for every region in
    warehouse/connectors/feeds.yaml). With neither, nothing is fetched: live feeds need API keys and network, so
    they are opt-in. Each region uses its primary feed and falls back to the secondary; rows name their feed.
    """
    if not regions:
        configured = os.environ.get("LIVE_GRID_REGIONS", "").strip()
        if not configured:
            log.warning("no live grid regions enabled (set LIVE_GRID_REGIONS or the `regions` Param); skipping")
            return []
        regions = None if configured.lower() == "all" else [r.strip() for r in configured.split(",") if r.strip()]
    report = fetch_and_load(regions, start, end)
    for failure in report.failures:
        log.warning("live feed problem (not fatal): %s", failure)
    return summarize(report.results)


def validate_live_window(start, end) -> tuple[str, str]:
    """[start, end) as ISO UTC strings; a clear error when unparsable or reversed. A point window (manual runs)
    becomes the hour ending at it."""
    try:
        start_ts, end_ts = pd.Timestamp(start), pd.Timestamp(end)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"live window start/end must be ISO timestamps, got {start!r}, {end!r}: {exc}") from None
    start_ts, end_ts = utc(start_ts), utc(end_ts)
    if end_ts == start_ts:  # a manual run's data interval is a point: take the hour before it
        start_ts = end_ts - pd.Timedelta(hours=1)
    if end_ts < start_ts:
        raise ValueError(f"live window end {end_ts} must be after start {start_ts}")
    return start_ts.isoformat(), end_ts.isoformat()
