"""Airflow Assets that connect the DAGs (DESIGN.md, data flow).

The ingest DAGs emit the raw assets when they have loaded a group of sources into raw.*; the transform DAG
(dags/transform.py) is scheduled on any of them and emits MARTS when the dbt marts are rebuilt; forecasting and
planning consume MARTS. Import from here, never re-declare the URIs.
"""

from __future__ import annotations

from airflow.sdk import Asset

RAW_CLUSTER = Asset("warehouse://raw/cluster", group="warehouse")  # openb traces, PAI specs, Philly durations
RAW_ENERGY = Asset("warehouse://raw/energy", group="warehouse")  # Zeus, ML.ENERGY, AcmeTrace
RAW_INTERFERENCE = Asset("warehouse://raw/interference", group="warehouse")  # Gavel throughputs
RAW_GRID = Asset("warehouse://raw/grid", group="warehouse")  # grid files and live feeds
MARTS = Asset("warehouse://marts", group="warehouse")  # marts.* rebuilt by dbt

RAW_ASSETS = (RAW_CLUSTER, RAW_ENERGY, RAW_INTERFERENCE, RAW_GRID)

__all__ = ["RAW_CLUSTER", "RAW_ENERGY", "RAW_INTERFERENCE", "RAW_GRID", "MARTS", "RAW_ASSETS"]

# Planning (dags/plan_hourly.py): reads forecasts and marts, writes plan.* and var/schedules/<plan time>/.
FORECASTS = Asset("warehouse://forecast", group="warehouse")  # forecast.forecasts issued by forecasting
PLAN = Asset("warehouse://plan", group="warehouse")  # plan.* + schedule files of the hourly plan
# model.registry versions of the predictor and power model (dags/predictor.py): the hourly plan reads the latest good
# one at its planning time. Lineage only: plan_hourly stays on its hourly schedule.
MODELS = Asset("warehouse://model", group="warehouse")
__all__ += ["FORECASTS", "PLAN", "MODELS"]
# The job queue (dags/submit_jobs.py): queue.jobs, written by the intake; the hourly plan reads it.
QUEUE = Asset("warehouse://queue", group="warehouse")
__all__ += ["QUEUE"]
# What the executors report (raw.job_events), loaded by plan_hourly's sync task; the ledger marts are built from it.
JOB_EVENTS = Asset("warehouse://raw/jobs", group="warehouse")
__all__ += ["JOB_EVENTS"]
