"""transform: the dbt project (transforms/) run with Cosmos, one task group per layer: staging as one `dbt build`
task, intermediate and marts rendered one task per model, then `test_marts` (the tests between marts).

Runs when any ingest DAG updates a raw Asset; emits `warehouse://marts` when the marts are rebuilt. Every dbt task
is in the one-slot `warehouse` pool (single DuckDB writer) and takes the warehouse file lock. Configuration and the
reasons behind it: transforms/cosmos_config.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, TaskGroup, task
from cosmos import DbtTaskGroup
from cosmos.operators.local import DbtBuildLocalOperator, DbtTestLocalOperator

from dagutils.assets import MARTS, RAW_CLUSTER, RAW_ENERGY, RAW_GRID, RAW_INTERFERENCE
from transforms import cosmos_config as cc

with DAG(
    dag_id="transform",
    description="dbt (Cosmos): raw.* -> staging -> intermediate -> marts",
    schedule=(RAW_CLUSTER | RAW_ENERGY | RAW_INTERFERENCE | RAW_GRID),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"pool": cc.POOL, "retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["dbt", "warehouse"],
    doc_md=__doc__,
):
    mode = cc.load_mode()

    source_test_args = {**cc.layer_build_args("staging"), "select": ["source:raw"], "dbt_cmd_flags": None}
    test_raw_sources = DbtTestLocalOperator(task_id="test_raw_sources", **source_test_args)

    groups = []
    for layer in cc.LAYERS:
        if layer in cc.SINGLE_TASK_LAYERS:  # one `dbt build` of the whole layer (why: cosmos_config)
            with TaskGroup(group_id=layer) as group:
                DbtBuildLocalOperator(task_id="build", **cc.layer_build_args(layer))
        else:  # one Cosmos task per model (its data and unit tests included)
            group = DbtTaskGroup(
                group_id=layer,
                project_config=cc.project_config(),
                profile_config=cc.profile_config(),
                execution_config=cc.execution_config(),
                render_config=cc.render_config(layer, mode),
                operator_args=cc.operator_args(),
            )
        groups.append(group)

    @task(outlets=[MARTS], pool=cc.POOL)
    def publish_marts(*, outlet_events=None) -> dict:
        """Check that every mart has rows, then emit `warehouse://marts` with the row counts."""
        from warehouse.db import reader

        with reader() as con:
            counts = {m: con.execute(f"SELECT count(*) FROM marts.{m}").fetchone()[0] for m in cc.MARTS}
        empty = [m for m, n in counts.items() if not n]
        if empty:
            raise ValueError(f"marts without rows after dbt build: {empty}")
        if outlet_events is not None:
            outlet_events[MARTS].extra = {"row_counts": counts}
        return counts

    test_marts = DbtTestLocalOperator(task_id="test_marts", **cc.marts_test_args())

    test_raw_sources >> groups[0]
    for upstream, downstream in zip(groups, groups[1:]):
        upstream >> downstream
    groups[-1] >> test_marts >> publish_marts()
