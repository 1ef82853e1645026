"""One task that emits the Asset events of an ingest run, after every load task.

Why one task: the transform DAG is scheduled on any raw Asset; two load tasks each with an outlet emit their
events minutes apart and start two transform runs for one ingest run. A single task adding all events through an
`AssetAlias` emits them at once, so the scheduler sees them together and starts one run. An Asset is emitted only
when a load task mapped to it loaded something (a skipped load pushes no result).
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias, TriggerRule, task


def publish_loaded(alias: str, loads: dict[str, Asset]):
    """A `publish_assets` task (runs whether the loads loaded or skipped) that emits, through the AssetAlias
    `alias`, one event per Asset of `loads` (load task id -> Asset) whose task returned a result."""
    outlet = AssetAlias(alias)

    @task(task_id="publish_assets", outlets=[outlet], trigger_rule=TriggerRule.NONE_FAILED)
    def publish_assets(*, outlet_events=None, ti=None) -> list[str]:
        loaded: dict[str, tuple[Asset, list[str]]] = {}
        for task_id, asset in loads.items():
            if ti.xcom_pull(task_ids=task_id) is None:  # skipped: nothing loaded, no event
                continue
            loaded.setdefault(asset.uri, (asset, []))[1].append(task_id)
        for asset, task_ids in loaded.values():
            outlet_events[outlet].add(asset, extra={"loaded_by": task_ids})
        return sorted(loaded)

    return publish_assets()
