"""transform: the dbt project (transforms/) rendered with Cosmos, one task group per layer.

Runs when any ingest DAG updates a raw Asset; emits `warehouse://marts` when the marts are rebuilt. Every dbt task
is in the one-slot `warehouse` pool (single DuckDB writer) and takes the warehouse file lock. Configuration and the
reasons behind it: transforms/cosmos_config.py.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from common.assets import MARTS, RAW_CLUSTER, RAW_ENERGY, RAW_GRID, RAW_INTERFERENCE
from cosmos import DbtTaskGroup
from cosmos.operators.local import DbtTestLocalOperator
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

    test_raw_sources = DbtTestLocalOperator(
        task_id="test_raw_sources",
        project_dir=str(cc.PROJECT_DIR),
        profile_config=cc.profile_config(),
        select=["source:raw"],
        dbt_executable_path=str(cc.LOCKED_DBT),
        invocation_mode=cc.InvocationMode.SUBPROCESS,
        env=cc.warehouse_env(),
        **{k: v for k, v in cc.operator_args().items() if k != "emit_datasets"},
    )

    groups = [
        DbtTaskGroup(
            group_id=layer,
            project_config=cc.project_config(),
            profile_config=cc.profile_config(),
            execution_config=cc.execution_config(),
            render_config=cc.render_config(layer, mode),
            operator_args=cc.operator_args(),
        )
        for layer in cc.LAYERS
    ]

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

    test_raw_sources >> groups[0]
    for upstream, downstream in zip(groups, groups[1:]):
        upstream >> downstream
    groups[-1] >> publish_marts()
