"""plan_hourly: one hour of the operating loop, sync -> plan -> dispatch.

Planning time T = the run's data interval end (scheduled runs), or the `as_of` Param (replay any hour, e.g. inside
2021), never the wall clock. `validate_params` checks the Params and fails at once naming a bad value. Then, in the
one-slot `warehouse` pool: `sync` moves staged submissions into the queue, passes cancellations to the executors
and loads each executor's events of [T-1h, T) into raw.job_events (the queue's states follow them); `plan` plans the
queued jobs around what the executors report running, with the chosen policy and the latest forecasts issued at
or before T, and writes plan.* plus `var/schedules/<plan time>/`; `dispatch` hands the jobs that start at T to
their cluster's executor (from the fleet file) exactly once. `dry_run` writes plan.explanations only and
dispatches nothing. Logic: scheduling/loop.py (through scheduling/tasks.py).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from dagutils.assets import FORECASTS, JOB_EVENTS, MARTS, MODELS, PLAN, QUEUE
from dagutils.params import DEFAULT_POLICY, FLEET_REGIONS, POLICIES, regions_param, time_param
from dagutils.schedules import time_schedule

with DAG(
    dag_id="plan_hourly",
    description="Hourly loop: executors' events in, queued jobs planned (regions, hours, nodes), starts dispatched",
    schedule=time_schedule("@hourly"),
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["plan", "scheduling"],
    doc_md=__doc__,
    params={
        "as_of": time_param("Planning time (ISO UTC, e.g. 2021-07-15T12:00Z); empty = data interval end."),
        "policy": Param(DEFAULT_POLICY, type="string", enum=list(POLICIES), description="Placement policy."),
        "regions": regions_param(FLEET_REGIONS, "Fleet regions to plan on; empty = every region with grid data."),
        "horizon_hours": Param(
            168, type="integer", minimum=24, maximum=168, description="Longest planning horizon (hours)."
        ),
        "deadline_reserve": Param(
            0.2,
            type="number",
            minimum=0,
            maximum=0.9,
            description="Share of a job's run time planned to spare before its deadline (runs outlast estimates).",
        ),
        "pause_for_carbon": Param(
            False,
            type="boolean",
            description="Also stop running checkpointing jobs through dirty stretches (off: only drained nodes' move).",
        ),
        "preempt_for_deadlines": Param(
            False,
            type="boolean",
            description="Also stop a running checkpointing job (at a checkpoint) to start a job due now, where the "
            "stopped job still keeps its deadline.",
        ),
        "dry_run": Param(False, type="boolean", description="Write plan.explanations only (no plan rows, no files)."),
    },
):

    @task
    def validate_params(params=None) -> dict:
        """Fail fast, before any work, on a bad policy, planning time, region or horizon."""
        from scheduling.tasks import resolve_plan_run

        ctx = get_current_context()
        dag_run = ctx.get("dag_run")
        return resolve_plan_run(
            dict(params), ctx.get("data_interval_end"), ctx.get("logical_date"), getattr(dag_run, "run_after", None)
        )

    @task(pool="warehouse", inlets=[QUEUE], outlets=[JOB_EVENTS])
    def sync(choice: dict) -> dict:
        from scheduling import tasks

        return tasks.sync(choice)

    @task(pool="warehouse", inlets=[FORECASTS, MARTS, MODELS, QUEUE], outlets=[PLAN])
    def plan(choice: dict) -> dict:
        from scheduling import tasks

        summary = tasks.plan(choice)
        print(f"plan {summary['plan_id']}: schedule dir {summary['schedule_dir'] or '(dry run: none)'}")
        return summary

    @task(pool="warehouse")
    def dispatch(choice: dict) -> dict:
        from scheduling import tasks

        return tasks.dispatch(choice)

    choice = validate_params()
    synced = sync(choice)
    planned = plan(choice)
    synced >> planned >> dispatch(choice)
