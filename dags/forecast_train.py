"""Airflow DAG forecast_train: fit, validate and register every forecaster (naive, LightGBM, mix, ensemble,
Prophet, TFT) within a time budget, daily.

Training cut-off = the run's data interval end, or the `train_end` Param; each version lands in model.registry
with its validation metrics. Runs in the `warehouse` pool. Logic: forecasting/service.py.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from dagutils.assets import MARTS
from dagutils.params import GRID_REGIONS, regions_param, targets_param, time_param
from dagutils.schedules import time_schedule

with DAG(
    dag_id="forecast_train",
    schedule=time_schedule("@daily"),
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["forecast", "training"],
    doc_md=__doc__,
    params={
        "train_end": time_param("Training cut-off (ISO date); empty = the data interval end."),
        "regions": regions_param(GRID_REGIONS),
        "targets": targets_param("Targets to train."),
        "models": Param([], type="array", items={"type": "string"}, description="Models; empty = all."),
        "budget_s": Param(840, type="integer", minimum=30, maximum=7200, description="Wall-clock budget (s)."),
        "tiny": Param(False, type="boolean", description="Tiny settings (tests, demos)."),
    },
):

    @task
    def validate_params(params=None) -> dict:
        from forecasting.tasks import validate

        return validate(dict(params), get_current_context().get("data_interval_end"))

    @task(pool="warehouse", inlets=[MARTS], execution_timeout=pendulum.duration(hours=2))
    def train(choice: dict) -> list[dict]:
        from forecasting.tasks import train as fit

        return fit(choice)

    train(validate_params())
