"""One planned job as a Slurm submission: its name, comment, sbatch options and batch script.

The job name carries the identity Slurm keeps after the job ends (the jobcomp file has the name, not the comment):
``cp|<plan_id>|<tenant/job_id>|<attempt>|<cluster>``, and once a later plan changes the running job's power limit,
a sixth field with every change so far (`PowerChange`: ``<watts>@<plan time>@<deciding plan_id>``, comma-joined),
so that the changes outlive the job too. The comment carries what `running` needs while the job lives
(``plan= job= attempt= cluster= node= gpu_devices= gpu_count= gpu_milli= power_limit_w= planned_start=
planned_end=``, plan time; ``power_limit_w`` is the limit in force, rounded to whole watts), and the node side reads
it: the power-limit prolog at the start and its watcher while the job runs (deploy/slurm/).

Options: ``--begin`` at the planned start on the wall clock (fail-open: Slurm starts the job then, planner or not;
never a hold), ``--time`` the planned run time x `time_limit_factor`, ``--deadline`` the job's deadline when it
lies after that end (a replayed plan's deadline is mapped like every time, so it is never in the past),
``--nodelist``, ``--gres=gpu:N`` for whole GPUs or ``--gres=shard:N`` for a share, N = ceil(share x the node's
shards per GPU, read from the cluster), ``--cpus-per-task``, ``--mem``, ``--comment``.

Script: the job's `script` (a Slurm batch script body) when it has one; else its `command` through ``srun``: a
shell string (the queue stores commands as JSON text) runs as ``srun /bin/bash -c '<string>'`` and a list of
arguments as ``srun arg1 arg2 ...``, each word quoted, so that Slurm never gets the command line as one word.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field, replace

import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.executors.clock import PlanClock
from scheduling.executors.items import split_job_id
from scheduling.output.schedules import command_args, node_hostname, srun_line

PREFIX = "cp"
SEP = "|"
MAX_NAME = 1024  # the longest job name slurmctld takes (longer: "Pathname ... too long")
_PLAN_ID = re.compile(r"^[^\s|,=]+$")  # what a plan id may hold inside a job name (jobcomp splits on blanks, "=")


@dataclass(frozen=True)
class PowerChange:
    """One change of a running job's GPU power limit: `watts` per GPU from `at` (plan time), decided by `plan_id`."""

    watts: float
    at: pd.Timestamp
    plan_id: str

    def text(self) -> str:
        if not _PLAN_ID.match(self.plan_id):
            raise ValueError(f"plan id {self.plan_id!r} cannot go into a Slurm job name (blank, '|', ',' or '=')")
        watts = repr(float(self.watts))  # the plan's watts as they are: the events report them unrounded
        return f"{watts.removesuffix('.0')}@{iso_z(self.at)}@{self.plan_id}"

    @classmethod
    def parse(cls, text: str) -> PowerChange:
        watts, at, plan_id = text.split("@", 2)
        return cls(float(watts), utc(at), plan_id)


@dataclass(frozen=True)
class Preemption:
    """The job was stopped at a checkpoint at `at` (plan time), as plan `plan_id` decided."""

    at: pd.Timestamp
    plan_id: str

    def text(self) -> str:
        if not _PLAN_ID.match(self.plan_id):
            raise ValueError(f"plan id {self.plan_id!r} cannot go into a Slurm job name (blank, '|', ',' or '=')")
        return f"preempted@{iso_z(self.at)}@{self.plan_id}"

    @classmethod
    def parse(cls, text: str) -> Preemption:
        word, at, plan_id = text.split("@", 2)
        if word != "preempted":
            raise ValueError(f"not a preemption: {text!r}")
        return cls(utc(at), plan_id)


@dataclass(frozen=True)
class JobKey:
    """Who a Slurm job is to the planner, and the power-limit changes made to it while it ran and its preemption
    (not its identity)."""

    plan_id: str
    job_id: str  # planner id, tenant/job_id
    attempt: int
    cluster: str
    power: tuple[PowerChange, ...] = field(default=(), compare=False)
    preempted: Preemption | None = field(default=None, compare=False)
    resumed: bool = field(default=False, compare=False)  # the run goes on from the job's checkpoint

    def name(self) -> str:
        parts = [PREFIX, self.plan_id, self.job_id, str(self.attempt), self.cluster]
        flags = (["resumed"] if self.resumed else []) + ([self.preempted.text()] if self.preempted else [])
        if self.power or flags:
            parts.append(",".join(c.text() for c in self.power))
        if flags:
            parts.append(",".join(flags))
        return SEP.join(parts)

    def with_change(self, change: PowerChange) -> JobKey:
        return replace(self, power=(*self.power, change))

    def with_preemption(self, preemption: Preemption) -> JobKey:
        return replace(self, preempted=preemption)

    @classmethod
    def parse(cls, name: str | None) -> JobKey | None:
        """The key of a job name this executor gave, else None (other users' jobs). A power history or preemption
        that does not parse raises ValueError naming the job name (a hand-edited name is reported, never read as no
        change)."""
        parts = str(name or "").split(SEP)
        if len(parts) not in (5, 6, 7) or parts[0] != PREFIX or not parts[3].isdigit():
            return None
        flags = parts[6].split(",") if len(parts) == 7 else []
        try:
            power = tuple(PowerChange.parse(t) for t in parts[5].split(",")) if len(parts) > 5 and parts[5] else ()
            preempted = next((Preemption.parse(f) for f in flags if f != "resumed"), None)
        except ValueError as exc:
            raise ValueError(f"Slurm job name {name!r}: bad power-limit history or preemption ({exc})") from None
        return cls(parts[1], parts[2], int(parts[3]), parts[4], power, preempted, "resumed" in flags)

    @property
    def tenant_and_queue_id(self) -> tuple[str | None, str]:
        return split_job_id(self.job_id)


def parse_comment(text: str | None) -> dict[str, str]:
    return dict(part.split("=", 1) for part in str(text or "").split() if "=" in part)


_LIMIT_WORD = re.compile(r"(?<!\S)power_limit_w=\S*")


def with_power_limit(comment: str | None, watts: float) -> str:
    """`comment` with its ``power_limit_w`` word set to `watts` (whole watts, what nvidia-smi takes), every other
    word as it was (a user's own comment keeps its fields); appended when it has none."""
    word = f"power_limit_w={int(round(float(watts)))}"
    text = str(comment or "").strip()
    if _LIMIT_WORD.search(text):
        return _LIMIT_WORD.sub(word, text, count=1)
    return f"{text} {word}".strip()


def _value(row: dict, key: str):
    v = row.get(key)
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _slurm_time(ts: pd.Timestamp) -> str:
    return utc(ts).strftime("%Y-%m-%dT%H:%M:%S")


def command_line(command: str | None) -> str | None:
    """The srun line of a job's command (JSON text as the queue stores it, or a plain shell string): a shell string
    runs through bash, so scripts written for Slurm's own shell behave as in a batch script."""
    args = command_args(command)
    if args is not None and args[:2] == ["/bin/sh", "-c"] and len(args) == 3:
        return f"srun /bin/bash -c {shlex.quote(args[2])}"
    return srun_line(command)


def shards_for(gpu_milli: int, gpu_count: int, shards_per_gpu: int) -> int:
    return max(1, int(math.ceil(gpu_milli * max(1, gpu_count) * shards_per_gpu / 1000.0)))


def submission(
    row: dict,
    key: JobKey,
    clock: PlanClock,
    *,
    shards_per_gpu: int | None,
    partition: str | None = None,
    output: str | None = None,
    time_limit_factor: float = 1.5,
) -> tuple[list[str], str]:
    """(sbatch options, batch script) of one dispatch item; ValueError when it cannot be expressed."""
    start, end = utc(row["start_time"]), utc(row["end_time"])
    begin = clock.to_wall(start)
    limit_s = clock.wall_seconds(end - start) * time_limit_factor
    minutes = max(1, int(math.ceil(limit_s / 60.0)))
    count = int(_value(row, "gpu_count") or 0)
    milli = int(_value(row, "gpu_milli") or (1000 if count else 0))
    host = node_hostname(_value(row, "node"), row.get("cluster"))
    power = _value(row, "power_limit_w")
    work_done = float(_value(row, "work_done") or 0.0)
    comment = {
        "plan": key.plan_id,
        "job": key.job_id,
        "attempt": key.attempt,
        "cluster": key.cluster,
        "node": _value(row, "node"),
        "gpu_devices": _value(row, "gpu_devices"),
        "gpu_count": count,
        "gpu_milli": milli,
        "power_limit_w": None if power is None else int(round(float(power))),
        "planned_start": iso_z(start),
        "planned_end": iso_z(end),
        "work_done": round(work_done, 6) if work_done > 0 else None,
    }
    args = [
        f"--job-name={key.name()}",
        f"--begin={_slurm_time(begin)}",
        f"--time={minutes}",
        "--nodes=1",
        "--comment=" + " ".join(f"{k}={v}" for k, v in comment.items() if v is not None),
    ]
    deadline = _value(row, "deadline")
    if deadline is not None:
        wall_deadline = clock.to_wall(deadline)
        if wall_deadline >= begin + pd.Timedelta(minutes=minutes):
            args.append(f"--deadline={_slurm_time(wall_deadline)}")
    if partition:
        args.append(f"--partition={partition}")
    if host:
        args.append(f"--nodelist={host}")
    if count:
        if milli >= 1000:
            args.append(f"--gres=gpu:{count}")
        elif not shards_per_gpu:
            raise ValueError(
                f"a {milli} milli-GPU share needs shards, and Slurm reports none on node {host!r} (configure "
                "GresTypes=gpu,shard, see docs/operating.md; 22.05 also reads 0 after a slurmctld restart until the "
                "shard jobs running then end)"
            )
        else:
            args.append(f"--gres=shard:{shards_for(milli, count, shards_per_gpu)}")
    if _value(row, "cpu_milli") is not None:
        args.append(f"--cpus-per-task={max(1, int(math.ceil(int(_value(row, 'cpu_milli')) / 1000)))}")
    if _value(row, "memory_mib") is not None:
        args.append(f"--mem={int(_value(row, 'memory_mib'))}M")
    if output:
        args.append(f"--output={output}")
    return args, script(row, key, start, end, power)


def script(row: dict, key: JobKey, start, end, power) -> str:
    body = _value(row, "script")
    run = command_line(_value(row, "command"))
    if body is None and run is None:
        raise ValueError("the job has neither a script nor a command")
    env = [
        f"export PLAN_ID={shlex.quote(key.plan_id)}",
        f"export PLANNER_JOB_ID={shlex.quote(key.job_id)}",
        f"export PLANNED_START={iso_z(start)}",
        f"export PLANNED_END={iso_z(end)}",
    ]
    if power is not None:
        env.append(f"export GPU_POWER_LIMIT_W={int(round(float(power)))}")
    work_done = float(_value(row, "work_done") or 0.0)
    if work_done > 0:  # it resumes from the job's checkpoint (the contract: docs/operating.md, Slurm, preemption)
        env.append(f"export CHECKPOINT_WORK_DONE={round(work_done, 6)}")
    if body is not None:
        lines = str(body).splitlines()
        shebang = lines[0] if lines and lines[0].startswith("#!") else "#!/bin/bash"
        rest = lines[1:] if lines and lines[0].startswith("#!") else lines
        # #SBATCH lines must come before the first command: keep the body's own directives first
        directives = [ln for ln in rest if ln.startswith("#SBATCH")]
        others = [ln for ln in rest if not ln.startswith("#SBATCH")]
        return "\n".join([shebang, *directives, *env, *others]) + "\n"
    return "\n".join(["#!/bin/bash", *env, run]) + "\n"
