"""submit_jobs: put jobs into the queue (queue.jobs) from a form or a job file.

Manual trigger. Either fill in the form for ONE job (each field typed, with its bounds; an empty field is not
given and takes the contract's default, docs/data-contracts.md "Job queue"), or set `file` to a YAML/JSON/CSV job
file readable by the worker. The first task checks the Params (the form's job is parsed and checked against the
fleet) and fails at once naming the bad field and value; the second runs the intake in the one-slot `warehouse`
pool: accepted jobs land `queued`, the same job again is a no-op, a changed job needs `replace` (allowed while it is
queued). A file's rejected jobs go to quarantine.rejected_rows and fail the task after the good ones landed.
`as_of` is the submission time of jobs without `submitted_at` (empty = the run's data interval end / logical date).
Logic: scheduling/tasks.py and scheduling/queue/. Emits `warehouse://queue`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from dagutils.assets import QUEUE
from dagutils.params import FLEET_GPU_MODELS, FLEET_REGIONS, regions_param, time_param
from scheduling.queue import spec

DOC = spec.FIELD_DOCS
DNS_LABEL = r"^$|^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"

with DAG(
    dag_id="submit_jobs",
    description="Submit jobs to the queue (queue.jobs): one job from the form, or a job file",
    schedule=None,
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    tags=["queue", "scheduling"],
    doc_md=__doc__,
    params={
        "file": Param("", type="string", description="A YAML/JSON/CSV job file on the worker; empty = the form."),
        "as_of": time_param("Submission time of jobs without submitted_at (ISO UTC); empty = data interval end."),
        "replace": Param(False, type="boolean", description="Replace a stored job whose spec differs (queued only)."),
        "tenant": Param(
            "", type="string", maxLength=spec.MAX_TENANT_CHARS, pattern=DNS_LABEL, description=DOC["tenant"]
        ),
        "job_id": Param("", type="string", maxLength=spec.MAX_JOB_ID_CHARS, description=DOC["job_id"]),
        "submitted_at": time_param(DOC["submitted_at"]),
        "gpus": Param(1, type="integer", minimum=1, maximum=spec.MAX_GPUS, description=DOC["gpus"]),
        "gpu_milli": Param(1000, type="integer", minimum=1, maximum=1000, description=DOC["gpu_milli"]),
        "gpu_models": Param(
            [], type="array", items={"type": "string", "enum": FLEET_GPU_MODELS}, description=DOC["gpu_models"]
        ),
        "cpu_milli": Param(4000, type="integer", minimum=1, maximum=spec.MAX_CPU_MILLI, description=DOC["cpu_milli"]),
        "memory_mib": Param(
            16384, type="integer", minimum=1, maximum=spec.MAX_MEMORY_MIB, description=DOC["memory_mib"]
        ),
        "workload_class": Param(
            "", type="string", enum=["", *spec.WORKLOAD_CLASSES], description=DOC["workload_class"]
        ),
        "job_type": Param("", type="string", maxLength=spec.MAX_JOB_TYPE_CHARS, description=DOC["job_type"]),
        "est_duration_h": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            maximum=spec.MAX_DURATION_H,
            description=DOC["est_duration_h"],
        ),
        "deadline": time_param(DOC["deadline"]),
        "flexibility": Param(
            None, type=["null", "number"], minimum=0, maximum=spec.MAX_FLEXIBILITY, description=DOC["flexibility"]
        ),
        "checkpoint_interval_min": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=spec.MAX_CHECKPOINT_INTERVAL_MIN,
            description=DOC["checkpoint_interval_min"],
        ),
        "checkpoint_overhead_min": Param(
            None,
            type=["null", "number"],
            minimum=0,
            maximum=spec.MAX_CHECKPOINT_OVERHEAD_MIN,
            description=DOC["checkpoint_overhead_min"],
        ),
        "max_preemptions": Param(
            None, type=["null", "integer"], minimum=0, maximum=spec.MAX_PREEMPTIONS, description=DOC["max_preemptions"]
        ),
        "home_region": Param("", type="string", enum=["", *FLEET_REGIONS], description=DOC["home_region"]),
        "input_gb": Param(0.0, type="number", minimum=0, maximum=spec.MAX_INPUT_GB, description=DOC["input_gb"]),
        "allowed_regions": regions_param(FLEET_REGIONS, DOC["allowed_regions"]),
        "priority_class": Param(
            spec.DEFAULT_PRIORITY_CLASS,
            type="string",
            maxLength=63,
            pattern=DNS_LABEL,
            description=DOC["priority_class"],
        ),
        "max_retries": Param(0, type="integer", minimum=0, maximum=spec.MAX_RETRIES, description=DOC["max_retries"]),
        "image": Param("", type="string", maxLength=spec.MAX_IMAGE_CHARS, description=DOC["image"]),
        "command": Param([], type="array", items={"type": "string"}, description=DOC["command"]),
        "script": Param("", type="string", maxLength=spec.MAX_TEXT_CHARS, description=DOC["script"]),
    },
):

    @task
    def validate_params(params=None) -> dict:
        """Fail fast, before any write, on a bad field of the form's job (checked against the fleet) or a file that
        cannot be read."""
        from scheduling.tasks import resolve_submission

        ctx = get_current_context()
        dag_run = ctx.get("dag_run")
        return resolve_submission(
            dict(params), ctx.get("data_interval_end"), ctx.get("logical_date"), getattr(dag_run, "run_after", None)
        )

    @task(pool="warehouse", outlets=[QUEUE])
    def submit(choice: dict) -> dict:
        from scheduling import tasks

        report = tasks.submit_jobs(choice)
        print(f"intake {report['batch_id']}: {report['counts']}")
        return report

    submit(validate_params())
