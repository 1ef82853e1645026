"""Airflow DAG: ingest grid data into raw.grid_*.

Hourly: the live feeds (Electricity Maps, WattTime, UK Carbon Intensity, EIA-930; primary with fallback per
region, see warehouse/connectors/feeds.yaml) for the run's data interval. Manual trigger: additionally the grid
files (EnsembleCI regions, DACF published forecasts, GB) chosen by Params. Updates `warehouse://raw/grid`.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import Param, TriggerRule, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from dagutils.assets import RAW_GRID
from dagutils.publish import publish_loaded
from dagutils.schedules import time_schedule
from warehouse.orchestration import (
    ingest_group,
    ingest_live,
    sources_in_group,
    validate_data_dir,
    validate_live_window,
    validate_source_names,
)


@dag(
    dag_id="ingest_grid",
    schedule=time_schedule("@hourly"),
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ingest", "grid"],
    doc_md=__doc__,
    params={
        "load_files": Param(True, type="boolean", description="Manual runs: also load the grid files."),
        "sources": Param(
            [],
            type="array",
            items={"type": "string", "enum": sources_in_group("grid")},
            description="File sources to load; empty = all grid files.",
        ),
        "data_dir": Param("", type="string", description="Folder holding the source files; empty = DATA_DIR."),
        "regions": Param(
            [],
            type="array",
            items={"type": "string", "pattern": "^[A-Z][A-Z0-9_-]{1,15}$"},
            description="Live-feed regions; empty = those enabled in feeds.yaml.",
        ),
        "start": Param("", type="string", description="Live window start (ISO UTC); empty = data interval start."),
        "end": Param("", type="string", description="Live window end (ISO UTC); empty = data interval end."),
    },
)
def ingest_grid():
    @task
    def validate_params(params=None) -> dict:
        context = get_current_context()
        # A run triggered with no logical date has no data interval: its window ends at the run's own time.
        end = params["end"] or context.get("data_interval_end") or context["dag_run"].run_after
        start, end = validate_live_window(params["start"] or context.get("data_interval_start") or end, end)
        manual = context["dag_run"].run_type == "manual"
        return {
            "files": validate_source_names("grid", params["sources"]) if manual and params["load_files"] else [],
            "data_dir": str(validate_data_dir(params["data_dir"]) or ""),
            "regions": params["regions"],
            "start": start,
            "end": end,
        }

    # A task with nothing to load skips instead of succeeding: publish_assets then emits no `warehouse://raw/grid`
    # event for it; an event would start a full transform run for data that did not change (every hour, when no live
    # region is enabled). One event per run, from publish_assets, whether the files, the feeds or both loaded.
    @task(pool="warehouse")
    def load_files(choice: dict) -> list[dict]:
        if not choice["files"]:
            raise AirflowSkipException("no grid files chosen (scheduled run, or load_files=false)")
        return ingest_group("grid", choice["files"], choice["data_dir"] or None)

    # none_failed: runs after load_files whether it loaded or skipped.
    @task(pool="warehouse", trigger_rule=TriggerRule.NONE_FAILED)
    def fetch_live(choice: dict) -> list[dict]:
        if not (choice["regions"] or os.environ.get("LIVE_GRID_REGIONS", "").strip()):
            raise AirflowSkipException("no live grid regions enabled (LIVE_GRID_REGIONS or the `regions` Param)")
        return ingest_live(choice["regions"], choice["start"], choice["end"])

    choice = validate_params()
    (
        load_files(choice)
        >> fetch_live(choice)
        >> publish_loaded("ingest_grid_loaded", {"load_files": RAW_GRID, "fetch_live": RAW_GRID})
    )


ingest_grid()
