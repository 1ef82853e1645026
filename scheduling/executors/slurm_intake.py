"""Jobs users leave in Slurm for the planner: the convention, and each such job as a queue submission.

A user submits the job held, marked in its comment, with a deadline (docs/operating.md, "Slurm intake"):

    sbatch --hold --deadline=2021-07-16T06:00 --time=120 --gres=gpu:1 \\
           --comment="carbon-aware job_type='ResNet-50 (batch size 64)'" train.sh

* **Marked**: the comment's first word is ``carbon-aware``; the words after it are ``field=value`` pairs of the job
  spec (``job_type``, ``workload_class``, ``est_duration_h``, ``allowed_regions=a|b``, ``home_region``,
  ``tenant``, ...), shell-quoted where a value has spaces.
* **The job in the queue**: tenant = the comment's, else the Slurm user; job_id = ``<ClusterName>-<Slurm job id>``;
  submitted_at, deadline = Slurm's (plan time); GPUs from ``--gres`` (``gpu:N`` whole GPUs, ``shard:S`` a share of
  one: S / the node's shards per GPU); CPUs and memory as requested; est_duration_h the time limit unless the
  comment says; the batch script without its hold directives, run in the submission's directory (``--chdir``).
* **Adopted** once the queue accepted it: released with its StartTime at its latest timely start, so Slurm starts it
  then even if the planner stops (never an indefinite hold), and renamed ``cp|<adopting plan>|<tenant/job_id>|0|
  <cluster>`` (attempt 0: the user's own submission), which jobcomp keeps after it ends; a plan that starts it
  earlier moves that time.
"""

from __future__ import annotations

import re
import shlex

import pandas as pd

from common.timeutil import iso_z
from scheduling.executors.clock import PlanClock
from scheduling.executors.slurm_cli import epoch, gres_count
from scheduling.executors.slurm_job import JobKey

MARK = "carbon-aware"
HELD = ("JobHeldUser", "JobHeldAdmin")
# spec fields a comment may not set: the job's identity and resources come from Slurm itself
FIXED = ("job_id", "submitted_at", "gpus", "gpu_milli", "cpu_milli", "memory_mib", "deadline", "script", "command")
_HOLD = re.compile(r"^#SBATCH\s+(--hold|-H)\b")
_DNS = re.compile(r"[^a-z0-9-]+")


def comment_words(comment: str | None) -> list[str]:
    try:
        return shlex.split(str(comment or ""))
    except ValueError:  # unbalanced quotes: the words as typed, so the intake names the bad field
        return str(comment or "").split()


def is_marked(job: dict) -> bool:
    """A job of a user (not one the executor submitted) that asks for carbon-aware planning: named by the user, or
    adopted (named with the key of attempt 0)."""
    words = comment_words(job.get("comment"))
    key = JobKey.parse(job.get("name"))
    return bool(words) and words[0] == MARK and (key is None or key.attempt == 0)


def is_held(job: dict) -> bool:
    return str(job.get("job_state")) == "PENDING" and str(job.get("state_reason")) in HELD


def tenant_of(job: dict) -> str:
    fields = comment_fields(job)
    if fields.get("tenant"):
        return fields["tenant"]
    return _DNS.sub("-", str(job.get("user_name") or "slurm").lower()).strip("-")[:63] or "slurm"


def planner_id(job: dict) -> str:
    """The queue's tenant/job_id of a marked Slurm job."""
    return f"{tenant_of(job)}/{job.get('cluster') or 'slurm'}-{job['job_id']}"


def comment_fields(job: dict) -> dict[str, str]:
    words = comment_words(job.get("comment"))[1:]
    return dict(word.split("=", 1) for word in words if "=" in word)


def gpus_of(job: dict, shards_per_gpu: int) -> tuple[int, int]:
    """(gpus, gpu_milli) of the job's ``--gres`` (0 GPUs when it asks for none: the intake refuses that)."""
    gres = str(job.get("tres_per_node") or "").removeprefix("gres:")
    whole = gres_count(gres, "gpu")
    if whole:
        return whole, 1000
    shards = gres_count(gres, "shard")
    if shards and shards_per_gpu:
        return 1, max(1, min(1000, round(shards * 1000 / shards_per_gpu)))
    return 0, 1000


def script_of(text: str, job: dict) -> str:
    """The batch script as the queue keeps it: without hold directives, in the submission's directory."""
    lines = [ln for ln in str(text).splitlines() if not _HOLD.match(ln)]
    cwd = job.get("current_working_directory")
    if cwd:
        at = 1 if lines and lines[0].startswith("#!") else 0
        lines.insert(at, f"#SBATCH --chdir={cwd}")
    return "\n".join(lines) + "\n"


def submission_of(job: dict, script: str, shards_per_gpu: int, clock: PlanClock) -> dict:
    """The queue submission (user fields) of one marked Slurm job; the intake checks it like any other."""
    gpus, milli = gpus_of(job, shards_per_gpu)
    cpus = int(job.get("cpus") or 1)
    memory = int(job.get("memory_per_node") or 0) or int(job.get("memory_per_cpu") or 0) * cpus
    minutes = int(job.get("time_limit") or 0)
    out = {k: v for k, v in comment_fields(job).items() if k not in FIXED}
    out.update(
        tenant=tenant_of(job),
        job_id=planner_id(job).split("/", 1)[1],
        submitted_at=iso_z(clock.to_plan(epoch(job.get("submit_time")))),
        gpus=gpus,
        gpu_milli=milli,
        cpu_milli=cpus * 1000,
        memory_mib=memory or None,
        script=script_of(script, job),
    )
    out.setdefault("job_type", str(job.get("name") or ""))
    if minutes and "est_duration_h" not in out:
        out["est_duration_h"] = round(clock.plan_hours(minutes * 60.0), 6)
    deadline = epoch(job.get("deadline"))
    if deadline is not None:
        out["deadline"] = iso_z(clock.to_plan(deadline))
    return out


def latest_wall_start(job: dict, planned_latest, clock: PlanClock):
    """When Slurm should start an adopted job if no plan moves it: the planner's latest timely start, never after
    Slurm's own (its deadline less the time limit, after which Slurm would remove the job)."""
    start = clock.to_wall(planned_latest)
    deadline, minutes = epoch(job.get("deadline")), int(job.get("time_limit") or 0)
    if deadline is not None and minutes:
        start = min(start, deadline - pd.Timedelta(minutes=minutes))
    return start
