"""evaluate: replay a historical period with several placement policies and write the evaluation report.

Manual trigger. Params choose the policies (add `optimum` for the LP bound), the period (start date, days), the
number of jobs, the regions (a count of fleet regions or their names) and the target load. The simulator
(scheduling/evaluation/simulator.py) plans every hour from the forecast known then and charges the actual
intensity; the report (scheduling/evaluation/report.py) is HTML with PNG charts -- carbon per policy against the
optimum, deadline satisfaction, unallocated GPUs, the plan's timeline against the forecast band, savings per
region -- and an explanation card per job (at most `max_cards`). It is written to
var/reports/evaluate/<run id>/index.html; the path is in the task log and the task's return value. Reads the
warehouse only (no pool needed). Logic: scheduling/tasks.py (resolve_evaluation_run, evaluate).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from dagutils.assets import FORECASTS, MARTS
from dagutils.params import POLICIES
from dagutils.params import SIMULATOR_REGIONS as REGIONS

with DAG(
    dag_id="evaluate",
    description="Simulate placement policies over a historical period; HTML report with charts and cards",
    schedule=None,
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["plan", "evaluation"],
    doc_md=__doc__,
    params={
        "policies": Param(
            ["rolling-lp", "priority", "greedy-carbon", "carbon-time", "performance-first", "round-robin", "optimum"],
            type="array",
            minItems=1,
            items={"type": "string", "enum": list(POLICIES)},
            description="Policies to simulate; `optimum` adds the LP bound.",
        ),
        "period_start": Param("2021-07-01", type="string", format="date", description="First day (UTC)."),
        "days": Param(3, type="integer", minimum=1, maximum=31, description="Length of the arrival period."),
        "jobs": Param(200, type="integer", minimum=1, description="Number of jobs arriving over the period."),
        "regions": Param(
            6,
            type=["integer", "array"],
            minimum=1,
            maximum=len(REGIONS),
            items={"type": "string", "enum": REGIONS},
            description="A count (the first N regions of the reference fleet) or a list of region names.",
        ),
        "load": Param(0.5, type="number", enum=[0.5, 0.8], description="Target average GPU load of the fleet."),
        "max_cards": Param(50, type="integer", minimum=0, maximum=500, description="Explanation cards at most."),
    },
):

    @task
    def validate_params(params=None) -> dict:
        """Fail fast, before any work, on a bad policy, date, size, region or load."""
        from scheduling.tasks import resolve_evaluation_run

        return resolve_evaluation_run(params)

    @task(inlets=[FORECASTS, MARTS])
    def simulate_and_report(choice: dict) -> dict:
        from scheduling.tasks import evaluate

        out = evaluate(choice, get_current_context()["dag_run"].run_id)
        print(f"evaluation report: {out['index']}")
        return out

    simulate_and_report(validate_params())
