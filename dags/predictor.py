"""Airflow DAG predictor: weekly (and on demand) training of the dual-network performance/interference predictor
and the GPU power model (CA-RM); each run registers a model version with its metrics in model.registry (a failed
training as status 'failed'). The hourly plan (scheduling/plan_service.py) loads the latest good version whose
cut-off (`as_of`) is at or before its planning time, through scheduling.predictor_service.resolve_registered, and
records the versions in every explanation record; without one it falls back, flagged. Logic:
scheduling/predictor_service.py.
"""
from __future__ import annotations

import pendulum
from airflow.sdk import DAG, get_current_context, task

from dagutils.assets import MARTS, MODELS
from dagutils.params import time_param

with DAG(
    dag_id="predictor",
    schedule="@weekly",
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["predictor", "training"],
    doc_md=__doc__,
    params={
        "as_of": time_param("Version time recorded with the models; empty = the data interval end."),
    },
):

    @task
    def validate_params(params=None) -> str:
        from common.timeutil import parse_time

        return parse_time(params["as_of"] or get_current_context()["data_interval_end"], "as_of").isoformat()

    @task(pool="warehouse", inlets=[MARTS], outlets=[MODELS])
    def train_and_register(as_of: str) -> dict:
        from scheduling.predictor_service import train_and_register as train

        return train(as_of=as_of)

    train_and_register(validate_params())
