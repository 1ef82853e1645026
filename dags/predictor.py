"""Airflow DAG predictor: weekly (and on demand) training of the dual-network performance/interference predictor
and the GPU power model (CA-RM); each run registers a model version with its metrics in model.registry (a failed
training as status 'failed'). The hourly plan loads the latest good version whose cut-off (`as_of`) is at or
before its planning time (scheduling.models.registered.resolve_registered) and records the versions in every
explanation record; without one it falls back, flagged. Logic: scheduling/tasks.py (train_models).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, get_current_context, task

from dagutils.assets import MARTS, MODELS
from dagutils.params import time_param
from dagutils.schedules import time_schedule

with DAG(
    dag_id="predictor",
    schedule=time_schedule("@weekly"),
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
        from scheduling.tasks import resolve_model_run

        return resolve_model_run(params["as_of"], get_current_context().get("data_interval_end"))

    @task(pool="warehouse", inlets=[MARTS], outlets=[MODELS])
    def train_and_register(as_of: str) -> dict:
        from scheduling.tasks import train_models

        return train_models(as_of=as_of)

    train_and_register(validate_params())
