"""ledger: the carbon ledger, every day: what the fleet really emitted against running every job at once.

Daily; the period is the submission days of [start, end): empty Params = the day ending at the run's data interval
end (a manual run: set `start`/`end`, ISO dates). `validate_params` checks them and fails at once naming a bad
value. In the one-slot `warehouse` pool, `build_ledger` runs dbt on the models the ledger reads, rebuilt from the
loop's events and assignments (stg_jobs__events+, stg_jobs__assignments+: marts.job_runs, marts.carbon_ledger,
marts.carbon_ledger_daily). `report` sums the period (realized and run-now kgCO2e, the saving, deadlines met; per
tenant, region and day) and writes the HTML ledger under var/reports/ledger/<period>/; it returns the totals and the
report's path. Logic: scheduling/tasks.py and scheduling/output/ledger.py.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, get_current_context, task

from dagutils.assets import JOB_EVENTS, MARTS, PLAN
from dagutils.params import time_param
from dagutils.schedules import time_schedule

with DAG(
    dag_id="ledger",
    description="Daily carbon ledger: the ledger marts rebuilt from the loop's events, realized vs run-now kgCO2e",
    schedule=time_schedule("@daily"),
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["ledger", "scheduling"],
    doc_md=__doc__,
    params={
        "start": time_param("First submission day (ISO, e.g. 2021-07-15); empty = the day before `end`."),
        "end": time_param("End of the period, exclusive (ISO, e.g. 2021-07-16); empty = data interval end."),
    },
):

    @task
    def validate_params(params=None) -> dict:
        """Fail fast, before any work, on a bad start or end."""
        from scheduling.tasks import resolve_ledger_run

        ctx = get_current_context()
        dag_run = ctx.get("dag_run")
        return resolve_ledger_run(
            dict(params), ctx.get("data_interval_end"), ctx.get("logical_date"), getattr(dag_run, "run_after", None)
        )

    @task(pool="warehouse", inlets=[JOB_EVENTS, PLAN], outlets=[MARTS])
    def build_ledger() -> dict:
        from scheduling import tasks

        return tasks.build_ledger()

    @task(inlets=[MARTS])
    def report(choice: dict) -> dict:
        from scheduling import tasks

        out = tasks.ledger_report(choice)
        print(f"ledger {choice['start']} .. {choice['end']}: {out['totals']}; report {out['report']}")
        return out

    choice = validate_params()
    choice >> build_ledger() >> report(choice)
