"""Builds the file-ingest DAGs: one validate task, one load task per source group (pool `warehouse`), then one
task emitting the Asset events of the groups that loaded (`dagutils.publish`: one transform run per ingest run)."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Asset, Param, task
from airflow.sdk.exceptions import AirflowSkipException

from dagutils.publish import publish_loaded
from warehouse.orchestration import ingest_group, sources_in_group, validate_data_dir, validate_source_names

START = pendulum.datetime(2021, 1, 1, tz="UTC")


def file_ingest_dag(dag_id: str, groups: dict[str, Asset], doc: str, schedule=None) -> DAG:
    """A manually triggered DAG loading the file sources of `groups`, each updating its Asset."""
    choices = [name for group in groups for name in sources_in_group(group)]
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=START,
        catchup=False,
        tags=["ingest", *groups],
        doc_md=doc,
        params={
            "sources": Param(
                [],
                type="array",
                items={"type": "string", "enum": choices},
                description=f"Sources to load (any of {choices}); empty = all.",
            ),
            "data_dir": Param("", type="string", description="Folder holding the source files; empty = DATA_DIR."),
        },
    ) as dag:

        @task
        def validate_params(params=None) -> dict:
            """Fail fast, before any work, on a bad source name or data folder."""
            names = params["sources"] or choices
            for group in groups:
                validate_source_names(group, [n for n in names if n in sources_in_group(group)])
            unknown = sorted(set(names) - set(choices))
            if unknown:
                raise ValueError(f"unknown source(s) {unknown}; choose from {choices}")
            return {"sources": names, "data_dir": str(validate_data_dir(params["data_dir"]) or "")}

        choice = validate_params()
        loads = []
        for group in groups:

            @task(task_id=f"load_{group}", pool="warehouse")
            def load(choice: dict, group: str = group) -> list[dict]:
                names = [n for n in choice["sources"] if n in sources_in_group(group)]
                if not names:  # skip: publish_assets then emits no event for this group (no transform for nothing)
                    raise AirflowSkipException(f"no {group} source chosen")
                return ingest_group(group, names, choice["data_dir"] or None)

            loads.append(load(choice))
        loads >> publish_loaded(f"{dag_id}_loaded", {f"load_{group}": asset for group, asset in groups.items()})
    return dag
