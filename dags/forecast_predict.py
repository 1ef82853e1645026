"""Airflow DAG forecast_predict: issue 96-hour forecasts (P10/P50/P90) for every region, hourly.

Issue time = the run's data interval end, or the `as_of` Param (replay, e.g. inside 2021); never the wall clock.
Uses the newest good model versions; a failing model falls back to its last good forecast or the seasonal naive,
and the rows say so (is_fallback, fallback_reason). Writes forecast.forecasts in the `warehouse` pool and emits
`warehouse://forecast`. Logic: forecasting/service.py.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from dagutils.assets import FORECASTS, MARTS
from dagutils.params import GRID_REGIONS, regions_param, targets_param, time_param
from dagutils.schedules import time_schedule

with DAG(
    dag_id="forecast_predict",
    schedule=time_schedule("@hourly"),
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["forecast"],
    doc_md=__doc__,
    params={
        "as_of": time_param("Issue time (ISO UTC); empty = the data interval end."),
        "regions": regions_param(GRID_REGIONS),
        "targets": targets_param("What to forecast."),
        "models": Param([], type="array", items={"type": "string"}, description="Models; empty = all good ones."),
        "horizon": Param(96, type="integer", minimum=1, maximum=96, description="Hours ahead."),
        "tiny": Param(False, type="boolean", description="Train tiny models first when none is registered."),
    },
):

    @task
    def validate_params(params=None) -> dict:
        from forecasting.tasks import validate

        return validate(dict(params), get_current_context().get("data_interval_end"))

    @task(pool="warehouse", inlets=[MARTS], outlets=[FORECASTS])
    def predict(choice: dict) -> dict:
        from forecasting.tasks import predict as issue

        return issue(choice)

    predict(validate_params())
