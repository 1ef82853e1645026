"""`slurm`: runs dispatched jobs on a real Slurm cluster (slurmctld reached through its command-line clients).

Slurm is the state: nothing is stored beside it. A submission's job name says which planned job it is
(`slurm_job.JobKey`), so `lookup`, `sync`, `cancel` and `running` read everything back from `squeue --json` (live
and recently ended jobs; it ignores filters, so this module filters) and the jobcomp/filetxt file (every ended
job, also after squeue forgot it).

Clock: plans are in plan time, Slurm runs on the wall clock; `PlanClock` maps one onto the other (settings
`plan_origin`, `wall_origin`, `seconds_per_hour`; none: identity) and every time Slurm reports comes back through
the inverse, so events are in plan time.

* `dispatch`: one `sbatch` per job (options and script: `slurm_job.submission`). A planned job that already has a
  pending Slurm job for the same attempt (an earlier plan's, or a submission whose answer was lost) is moved, not
  submitted again: ``scontrol update`` of its StartTime, name, time limit and comment when it stays on its node,
  else it is cancelled and submitted anew. A running one is left alone and refused for the new plan. So there are
  never two Slurm jobs for one planned job. A job Slurm refuses gets its error; a Slurm that cannot be reached
  raises `SlurmUnavailable` (the whole chunk fails; the dispatch log asks `lookup` before trying again).
* `sync(now, since)`: ``dispatched`` at the plan time, ``started`` at Slurm's start time, then ``finished``
  (COMPLETED), ``cancelled`` (CANCELLED; no ``started`` when it never ran) or ``failed`` (any other end state:
  FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, DEADLINE, ...) at Slurm's end time.
* `running(now)`: the jobs Slurm runs (``confirmed``) or holds pending past their begin time (not confirmed), with
  their node, the plan's GPU indexes and the plan's end (the next full hour once a run outlives it). The planned
  indexes, not Slurm's: Slurm picks the devices itself (CUDA_VISIBLE_DEVICES), and 22.05 does not keep `gpu` and
  `shard` allocations apart (a gpu:1 job and a shard job can get the same device), so its indexes can overlap where
  the planner's bookkeeping cannot; the GPU-milli per node are the same either way. Where the planned indexes
  collide (a run that outlived its plan, an outage), `fit_devices` moves the report to free ones.
* `cancel`: ``scancel`` of the planned job's live Slurm jobs.
* `preempt(job_id, at, plan_id=, save_h=)`: the job's running Slurm job is marked preempted in its name
  (`slurm_job.Preemption`: time and deciding plan, the idempotency key; the jobcomp file keeps it) and cancelled:
  Slurm sends its batch script SIGTERM and kills it KillWait seconds later, so a job script writes its checkpoint
  on SIGTERM within KillWait (set it above the checkpoint time). `sync` reports the end of a marked job as
  ``preempted``. The job's next dispatch is a new Slurm job (on this cluster or another: never two at once), whose
  script gets ``CHECKPOINT_WORK_DONE`` (the plan's share of the job done) and reads its checkpoint back; its name
  says ``resumed``, and `sync` reports its start so.
* `set_power_limit(job_id, watts, at, plan_id=)`: one ``scontrol update`` of the job's running Slurm job (one RPC,
  so both or neither): its comment's ``power_limit_w`` becomes the limit in force (whole watts), and the change
  (watts, plan time, deciding plan) is appended to its name (`slurm_job.PowerChange`), which the jobcomp file keeps
  after the job ends. So `power_change_ref` (the idempotency key is the deciding plan) and the ``power_changed``
  events of `sync` (at each change's plan time, before the run's end) are reads of Slurm alone, also after squeue
  forgot the job; `running` reports the last change by `now` as the limit in force. On the node, the watcher the
  power-limit prolog starts (deploy/slurm/power-limit-watcher.sh) polls the comment and runs ``nvidia-smi -i
  <SLURM_JOB_GPUS> -pl <W>`` when it changes.
* `imports` / `adopt` / `drop_import`: users' held jobs marked for carbon-aware planning (`slurm_intake`) go to the
  queue, and are then released to start at their latest timely start, renamed to the key of attempt 0 under the
  adopting hour's plan (``cp|<plan>|<job>|0|<cluster>``: the user's own submission, never a dispatch). `dispatch`
  moves such a job onto a plan like a pending job of an earlier plan (renamed to the plan's key); `drop_import`
  cancels it when it goes elsewhere or the queue cancelled it, never once it runs. When Slurm starts it itself (no
  plan did by then), `sync` reports ``started`` and its end for attempt 0 (no ``dispatched``), so the queue follows
  it, and `running` reports it, so the planner keeps its GPUs bound and plans it nowhere else.

Settings: ``conf`` (SLURM_CONF; default Slurm's own), ``partition`` (also: only that partition's jobs are this
executor's, so that one Slurm can serve a cluster per partition), ``output`` (``--output`` pattern),
``jobcomp`` (the jobcomp file; default JobCompLoc from ``scontrol show config``), ``token_env`` (a variable
holding a Slurm JWT, passed to the clients as SLURM_JWT), ``timeout_s`` (30),
``time_limit_factor`` (1.5: ``--time`` is the planned run time times this), the clock settings above, ``name``.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pandas as pd

from common.timeutil import HOUR, utc
from scheduling.executors.base import (
    EVENT_COLUMNS,
    RECORD_COLUMNS,
    RUNNING_COLUMNS,
    DuplicateDispatchError,
    Executor,
    check_window,
    in_window,
    plan_time_of,
    sort_events,
    typed_frame,
)
from scheduling.executors.clock import PlanClock
from scheduling.executors.items import check_items
from scheduling.executors.slurm_cli import (
    DEFAULT_TIMEOUT_S,
    SlurmCli,
    SlurmRefused,
    SlurmUnavailable,
    discover_nodes,
    drained_nodes,
    epoch,
    gres_count,
)
from scheduling.executors.slurm_intake import (
    gpus_of,
    is_held,
    is_marked,
    latest_wall_start,
    planner_id,
    submission_of,
)
from scheduling.executors.slurm_job import (
    MAX_NAME,
    JobKey,
    PowerChange,
    Preemption,
    parse_comment,
    submission,
    with_power_limit,
)
from scheduling.output.schedules import node_hostname

LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
STARTED = ("CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
ALTERABLE = ("CONFIGURING", "RUNNING", "SUSPENDED")  # started and not ending: a power change still matters
END_EVENT = {"COMPLETED": "finished", "CANCELLED": "cancelled"}  # every other end state: failed
_IDX = re.compile(r"IDX:([0-9,\-]+)")


def _devices(gres_detail) -> str | None:
    """GPU indexes of squeue's gres_detail (``gpu:2(IDX:0-1)``, ``shard:5(IDX:0)``) as ``0,1``."""
    found: list[int] = []
    for entry in gres_detail or []:
        for match in _IDX.findall(str(entry)):
            for part in match.split(","):
                lo, _, hi = part.partition("-")
                found += range(int(lo), int(hi or lo) + 1)
    return ",".join(str(i) for i in sorted(set(found))) or None


def fit_devices(rows: list[dict], gpus_per_node: dict[str, int]) -> list[dict]:
    """`rows` with GPU indexes that never hold more than a whole GPU: a job keeps its planned devices where they fit
    beside the jobs before it (running ones first), else takes the least-used ones that fit; a job that fits nowhere
    on its node (Slurm ran more there than the plan allowed) loses its node, so the planner counts its GPUs against
    the cluster without binding devices."""
    used: dict[tuple[str, int], int] = {}
    out = []
    for row in sorted(rows, key=lambda r: (not r["confirmed"], str(r["start_time"]), r["job_id"])):
        host = node_hostname(row["node"], row["cluster"]) if row["node"] else None
        count, milli = int(row["gpu_count"] or 0), int(row["gpu_milli"] or 0)
        total = gpus_per_node.get(host or "", 0)
        if not count or not total:
            out.append(row)
            continue
        free = {g: 1000 - used.get((host, g), 0) for g in range(total)}
        planned = [int(x) for x in str(row["gpu_devices"] or "").split(",") if x.strip().isdigit()]
        if not (len(planned) == count and all(free.get(g, -1) >= milli for g in planned)):
            fits = sorted((g for g in free if free[g] >= milli), key=lambda g: (-used.get((host, g), 0), g))
            planned = sorted(fits[:count]) if len(fits) >= count else []
        if planned:
            for g in planned:
                used[(host, g)] = used.get((host, g), 0) + milli
            row = {**row, "gpu_devices": ",".join(map(str, planned))}
        else:
            row = {**row, "node": None, "gpu_devices": None}
        out.append(row)
    return out


def _limit_at(key: JobKey, note: dict[str, str], at: pd.Timestamp) -> float:
    """The power limit in force at `at` (plan time): the last change by then, else the comment's (the dispatch's)."""
    made = [c.watts for c in key.power if c.at <= at]
    if made:
        return made[-1]
    return float(note["power_limit_w"]) if "power_limit_w" in note else math.nan


def _time_limit(job: dict, opts: dict[str, str]) -> int:
    """The planned time limit (minutes), cut to what the Slurm job's own deadline leaves after the begin time:
    Slurm ends a job that outlives its deadline (DEADLINE) however long its limit."""
    minutes = int(opts["time"])
    deadline = epoch(job.get("deadline"))
    if deadline is None:
        return minutes
    room = (deadline - utc(opts["begin"])).total_seconds() // 60
    return int(max(1, min(minutes, room)))


class SlurmExecutor(Executor):
    """Submits to, and reads back from, one Slurm cluster (see the module doc)."""

    kind = "slurm"
    job_files: tuple[str, ...] = ()  # it submits from the plan rows
    changes_power_limits = True
    preempts = True
    SETTINGS = (
        "name",
        "conf",
        "partition",
        "output",
        "jobcomp",
        "token_env",
        "timeout_s",
        "time_limit_factor",
        "plan_origin",
        "wall_origin",
        "seconds_per_hour",
    )

    def __init__(
        self,
        *,
        db_path=None,
        name: str | None = None,
        conf: str | None = None,
        partition: str | None = None,
        output: str | None = None,
        jobcomp: str | None = None,
        token_env: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        time_limit_factor: float = 1.5,
        plan_origin=None,
        wall_origin=None,
        seconds_per_hour=None,
    ):
        super().__init__(name)
        self.db_path = db_path  # unused: Slurm is the state
        self.cli = SlurmCli(conf=conf, timeout_s=timeout_s, jobcomp=jobcomp, token_env=token_env)
        self.clock = PlanClock.from_settings(plan_origin, wall_origin, seconds_per_hour)
        self.partition = partition
        self.output = output
        self.time_limit_factor = float(time_limit_factor)
        if not self.time_limit_factor >= 1.0:
            raise ValueError(f"executor {self.name!r}: 'time_limit_factor' must be >= 1, got {time_limit_factor!r}")

    # ------------------------------------------------------------------------------------------- reading Slurm

    def _mine(self, partition) -> bool:
        """A job in this executor's partition (every job when it has none: one cluster per Slurm)."""
        return not self.partition or partition == self.partition

    def _live(self, jobs: list[dict] | None = None) -> list[tuple[JobKey, dict]]:
        """This executor's jobs in squeue (live and recently ended), by key."""
        jobs = self.cli.jobs() if jobs is None else jobs
        return [
            (key, job)
            for job in jobs
            if (key := JobKey.parse(job.get("name"))) is not None and self._mine(job.get("partition"))
        ]

    def _marked(self, jobs: list[dict] | None = None) -> list[dict]:
        """Users' jobs asking for carbon-aware planning (`slurm_intake`), in this executor's partition when it
        has one."""
        jobs = self.cli.jobs() if jobs is None else jobs
        return [j for j in jobs if is_marked(j) and self._mine(j.get("partition"))]

    def _all_jobs(self, jobs: list[dict] | None = None) -> dict[str, tuple[JobKey, dict]]:
        """Slurm job id -> (key, a normalised record) from squeue (`jobs`: as read already) and the jobcomp file
        (which wins once ended)."""
        out: dict[str, tuple[JobKey, dict]] = {}
        for key, job in self._live(jobs):
            out[str(job["job_id"])] = (
                key,
                {
                    "state": str(job.get("job_state")),
                    "start": epoch(job.get("start_time")),
                    "end": epoch(job.get("end_time")),
                    "node": job.get("nodes") or None,
                },
            )
        for rec in self.cli.finished():
            key = JobKey.parse(rec.get("Name"))
            if key is None or not self._mine(rec.get("Partition")):
                continue
            out[str(rec["JobId"])] = (
                key,
                {
                    "state": rec.get("JobState", "").split()[0],
                    "start": epoch(rec.get("StartTime")),
                    "end": epoch(rec.get("EndTime")),
                    "node": rec.get("NodeList") if rec.get("NodeList") not in (None, "", "(null)", "None") else None,
                },
            )
        return out

    def shards_per_gpu(self) -> dict[str, int]:
        """Node name -> shards per GPU, as the cluster configures them (0: no shards)."""
        return {n["name"]: n["shards_per_gpu"] for n in discover_nodes(self.cli)}

    def nodes(self) -> list[dict]:
        """The cluster's nodes, GPUs, CPUs and memory (`slurm_cli.discover_nodes`): a fleet's declared nodes."""
        return discover_nodes(self.cli)

    def drained_nodes(self, now) -> dict[str, str]:
        """The nodes Slurm drains (`slurm_cli.drained_nodes`): the plan starts nothing there. When the hour's last
        call found slurmctld unreachable, SlurmUnavailable at once (asking again would wait its timeout twice)."""
        if self.cli.unreachable:
            raise SlurmUnavailable("slurmctld was unreachable at the last call; no drained nodes known")
        return drained_nodes(self.cli)

    # ------------------------------------------------------------------------------------------- intake

    def imports(self, now) -> list[dict]:
        """The held, marked jobs as queue submissions (`slurm_intake.submission_of`)."""
        held = [j for j in self._marked() if is_held(j)]
        if not held:
            return []
        shards = self.shards_per_gpu()
        most = max(shards.values(), default=0)
        out = []
        for job in sorted(held, key=lambda j: int(j["job_id"])):
            script = self.cli.batch_script(str(job["job_id"]))
            out.append(submission_of(job, script, shards.get(job.get("nodes") or "", most), self.clock))
        return out

    def adopt(self, latest_starts: dict, now, *, plan_id: str | None = None, cluster: str | None = None) -> None:
        """Release each accepted held job with its StartTime at its latest timely start (`latest_wall_start`),
        named with the key of attempt 0 under `plan_id` in `cluster` (one update, so a job is never released
        unnamed; one renamed but still held is offered again by `imports`)."""
        for job in self._marked():
            pid = planner_id(job)
            if pid not in latest_starts or not is_held(job):
                continue
            start = latest_wall_start(job, latest_starts[pid], self.clock)
            fields = {"StartTime": start.strftime("%Y-%m-%dT%H:%M:%S")}
            if plan_id and cluster:
                fields["JobName"] = JobKey(plan_id, pid, 0, cluster).name()
            self.cli.update(str(job["job_id"]), **fields)
            self.cli.release(str(job["job_id"]))

    def drop_import(self, job_id: str, now) -> bool:
        """``scancel`` of the user's own live submission of `job_id` (never a job this executor submitted); one
        that Slurm has started is never cancelled (SlurmRefused: the job keeps running, and its work)."""
        found = [j for j in self._marked() if planner_id(j) == str(job_id) and str(j.get("job_state")) in LIVE]
        running = [j for j in found if str(j.get("job_state")) in STARTED]
        if running:
            ref = running[0]["job_id"]
            raise SlurmRefused(f"{job_id} runs as Slurm job {ref} since its latest start; not withdrawn")
        for job in found:
            self.cli.cancel(str(job["job_id"]))
        return bool(found)

    # ------------------------------------------------------------------------------------------- dispatch

    def dispatch(self, plan_id: str, items: pd.DataFrame) -> pd.DataFrame:
        plan_time_of(plan_id)
        items = check_items(items)
        jobs = self.cli.jobs()
        live = [(k, j) for k, j in self._live(jobs) if str(j.get("job_state")) in LIVE]
        imported = {planner_id(j): j for j in self._marked(jobs) if str(j.get("job_state")) in LIVE}
        shards = None
        records = []
        for row in items.to_dict(orient="records"):
            job = str(row["job_id"])
            resumed = float(row.get("work_done") or 0.0) > 0  # goes on from the job's checkpoint
            key = JobKey(plan_id, job, int(row["attempt"]), str(row["cluster"]), resumed=resumed)
            mine = [(k, j) for k, j in live if k.job_id == job and k.attempt == key.attempt]
            if job in imported:  # a user's own submission (`slurm_intake`): moved onto the plan like an earlier one
                mine.append((None, imported[job]))
            if any(k is not None and k.plan_id == plan_id for k, _ in mine):
                raise DuplicateDispatchError(f"executor {self.name!r}, plan {plan_id}: job {job!r} is in Slurm already")
            if shards is None and 0 < int(row["gpu_milli"] or 0) < 1000:
                shards = self.shards_per_gpu()
            host = node_hostname(row.get("node"), row.get("cluster"))
            try:
                args, script = submission(
                    row,
                    key,
                    self.clock,
                    shards_per_gpu=(shards or {}).get(host or "", max((shards or {}).values(), default=0)),
                    partition=self.partition,
                    output=self.output,
                    time_limit_factor=self.time_limit_factor,
                )
                ref = self._move(mine, key, args, host) if mine else None
                if ref is None:
                    ref = self.cli.sbatch(args, script)
                records.append({"job_id": job, "executor_ref": ref, "error": None})
            except (ValueError, SlurmRefused) as exc:
                records.append({"job_id": job, "executor_ref": None, "error": str(exc)})
        return pd.DataFrame(records, columns=list(RECORD_COLUMNS))

    def _move(self, mine: list[tuple[JobKey, dict]], key: JobKey, args: list[str], host: str | None) -> str | None:
        """Re-point the planned job's pending Slurm job at this plan (its ref), or cancel it (None: submit anew)."""
        opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        running = [(k, j) for k, j in mine if str(j.get("job_state")) != "PENDING"]
        if running and running[0][0] is None:  # a user's job Slurm started at its latest start: the plan takes it
            ref = str(running[0][1]["job_id"])
            adopted = JobKey.parse(running[0][1].get("name"))  # its power changes so far stay in its name
            self.cli.update(ref, JobName=replace(key, power=adopted.power if adopted else ()).name())
            self.cli.update(ref, Comment=opts["comment"])
            return ref
        if running:
            raise SlurmRefused(f"already running as Slurm job {running[0][1]['job_id']}; not submitted twice")
        (_, job), *extra = mine
        for _, other in extra:  # never two: keep one
            self.cli.cancel(str(other["job_id"]))
        if str(job.get("tres_per_node") or "").removeprefix("gres:") == opts.get("gres", ""):
            ref = str(job["job_id"])
            fields = {"StartTime": opts["begin"], "TimeLimit": _time_limit(job, opts), "JobName": key.name()}
            if host:
                fields["ReqNodeList"] = host
            self.cli.update(ref, **fields)
            self.cli.update(ref, Comment=opts["comment"])
            return ref
        self.cli.cancel(str(job["job_id"]))  # other resources: a new submission
        return None

    def lookup(self, plan_id: str, job_id: str) -> str | None:
        found = [
            ref
            for ref, (k, _) in self._all_jobs().items()
            if k.plan_id == plan_id and k.job_id == str(job_id) and k.attempt > 0  # attempt 0: a user's own job
        ]
        return max(found, key=int) if found else None

    # ------------------------------------------------------------------------------------------- events

    def sync(self, now, since=None) -> pd.DataFrame:
        since, now = check_window(since, now)
        events = []
        for ref, (key, rec) in sorted(self._all_jobs().items(), key=lambda kv: int(kv[0])):
            tenant, queue_id = key.tenant_and_queue_id
            base = {
                "tenant": tenant,
                "job_id": queue_id,
                "planner_job_id": key.job_id,
                "executor": self.name,
                "executor_ref": ref,
                "plan_id": key.plan_id,
                "attempt": key.attempt,
                "cluster": key.cluster,
                "node": rec["node"],
            }
            state, start, end = rec["state"], rec["start"], rec["end"]
            ended = state not in LIVE
            ran = start is not None and (state in STARTED or (ended and not (state == "CANCELLED" and start == end)))
            if key.attempt == 0 and not ran:  # an adopted user job that no plan started: nothing happened yet
                continue
            if key.attempt > 0:
                events.append({**base, "event": "dispatched", "event_time": plan_time_of(key.plan_id)})
            if ran:
                event = "resumed" if key.resumed else "started"
                events.append({**base, "event": event, "event_time": self.clock.to_plan(start)})
            end_at = self.clock.to_plan(end) if ended and end is not None else None
            limit = math.nan
            for change in key.power:  # made while it ran: each in force from its time on
                if end_at is None or change.at < end_at:
                    limit = change.watts
                    events.append({**base, "event": "power_changed", "event_time": change.at, "power_limit_w": limit})
            if end_at is not None:
                how = "preempted" if key.preempted is not None and ran else END_EVENT.get(state, "failed")
                events.append({**base, "event": how, "event_time": end_at})
        frame = typed_frame(events, EVENT_COLUMNS)
        return sort_events(frame[in_window(frame["event_time"], since, now)])

    def running(self, now) -> pd.DataFrame:
        now = utc(now)
        rows = []
        shards = None  # read from the cluster once, for the first adopted job Slurm started itself
        for key, job in self._live():
            state = str(job.get("job_state"))
            if state not in LIVE:
                continue
            if key.attempt == 0:  # an adopted user job: running only once Slurm started it
                if state in STARTED:
                    shards = self.shards_per_gpu() if shards is None else shards
                    rows.append(self._running_import(key, job, now, shards))
                continue
            note = parse_comment(job.get("comment"))
            confirmed = state in STARTED
            wall_start = epoch(job.get("start_time") if confirmed else job.get("eligible_time"))
            start = self.clock.to_plan(wall_start) if wall_start is not None else utc(note["planned_start"])
            if start > now:
                continue
            end = utc(note["planned_end"]) if "planned_end" in note else now + HOUR
            if end <= now:
                end = now.floor("h") + HOUR
            tenant, queue_id = key.tenant_and_queue_id
            count = gres_count(job.get("tres_per_node"), "gpu") or int(note.get("gpu_count", 0))
            rows.append(
                {
                    "job_id": key.job_id,
                    "tenant": tenant,
                    "queue_job_id": queue_id,
                    "plan_id": key.plan_id,
                    "attempt": key.attempt,
                    "executor": self.name,
                    "executor_ref": str(job["job_id"]),
                    "cluster": key.cluster,
                    "node": note.get("node"),
                    "gpu_devices": note.get("gpu_devices") or _devices(job.get("gres_detail")),
                    "gpu_count": count,
                    "gpu_milli": int(note.get("gpu_milli", 1000 if count else 0)),
                    "power_limit_w": _limit_at(key, note, now),
                    "start_time": start,
                    "end_time": end,
                    "confirmed": confirmed,
                }
            )
        if rows:
            rows = fit_devices(rows, {n["name"]: n["gpus"] for n in self.nodes()})
        return typed_frame(rows, RUNNING_COLUMNS).sort_values("job_id", kind="mergesort").reset_index(drop=True)

    def _running_import(self, key: JobKey, job: dict, now: pd.Timestamp, shards: dict[str, int]) -> dict:
        """The RUNNING_COLUMNS row of an adopted job Slurm started itself: Slurm's node and devices, its GPUs from
        ``--gres`` (`shards`: the nodes' shards per GPU), running until its time limit (the next hour once that
        passed)."""
        wall_start = epoch(job.get("start_time"))
        start = self.clock.to_plan(wall_start)
        end = self.clock.to_plan(wall_start + pd.Timedelta(minutes=int(job.get("time_limit") or 0)))
        if end <= now:
            end = now.floor("h") + HOUR
        host = str(job.get("nodes") or "")
        count, milli = gpus_of(job, shards.get(host, 0))
        tenant, queue_id = key.tenant_and_queue_id
        return {
            "job_id": key.job_id,
            "tenant": tenant,
            "queue_job_id": queue_id,
            "plan_id": key.plan_id,
            "attempt": 0,
            "executor": self.name,
            "executor_ref": str(job["job_id"]),
            "cluster": key.cluster,
            "node": f"{key.cluster}/{host}" if host else None,
            "gpu_devices": _devices(job.get("gres_detail")),
            "gpu_count": count,
            "gpu_milli": milli,
            "power_limit_w": _limit_at(key, parse_comment(job.get("comment")), now),
            "start_time": start,
            "end_time": end,
            "confirmed": True,
        }

    # ------------------------------------------------------------------------------------------- power limits

    def set_power_limit(self, job_id: str, watts: float, at, *, plan_id: str, time_factor: float = 1.0) -> str | None:
        """Make `watts` the limit in force of the job's running Slurm job from `at` (plan time) and record the change
        in its name (see the module doc). The same (plan_id, job_id) again returns the first change's ref and
        updates nothing; None when no Slurm job of `job_id` runs at `at`. `time_factor` is unused: the GPUs decide
        the speed."""
        at = utc(at)
        if not (math.isfinite(float(watts)) and float(watts) > 0):
            raise ValueError(f"job {job_id}: power limit must be a positive number of watts, got {watts!r}")
        jobs = self.cli.jobs()
        ref = self._power_change_ref(plan_id, job_id, jobs)
        if ref is not None:
            return ref
        found = self._running_at(job_id, at, jobs)
        if found is None:
            return None
        key, job = found
        if key.power and key.power[-1].at > at:
            raise ValueError(f"job {job_id}: a power change at {at} comes before the last one ({key.power[-1].at})")
        name = key.with_change(PowerChange(float(watts), at, plan_id)).name()
        if len(name) > MAX_NAME:
            raise ValueError(
                f"job {job_id} (Slurm job {job['job_id']}): {len(key.power)} power changes fill its job name "
                f"({len(name)} > {MAX_NAME} characters, Slurm's limit); this change is not made"
            )
        ref = str(job["job_id"])
        self.cli.update(ref, Comment=with_power_limit(job.get("comment"), watts), JobName=name)
        return f"{ref}/power-limit/{plan_id}"

    def _running_at(self, job_id: str, at: pd.Timestamp, jobs: list[dict]) -> tuple[JobKey, dict] | None:
        """(key, squeue record) of the newest Slurm job of `job_id` that runs and had started by `at` (plan time)."""
        live = []
        for key, job in self._live(jobs):
            start = epoch(job.get("start_time"))
            if key.job_id != str(job_id) or str(job.get("job_state")) not in ALTERABLE or start is None:
                continue
            if self.clock.to_plan(start) <= at:
                live.append((key, job))
        return max(live, key=lambda kj: int(kj[1]["job_id"])) if live else None

    def power_change_ref(self, plan_id: str, job_id: str) -> str | None:
        return self._power_change_ref(plan_id, job_id)

    def _power_change_ref(self, plan_id: str, job_id: str, jobs: list[dict] | None = None) -> str | None:
        for ref, (key, _) in self._all_jobs(jobs).items():
            if key.job_id == str(job_id) and any(c.plan_id == plan_id for c in key.power):
                return f"{ref}/power-limit/{plan_id}"
        return None

    # ------------------------------------------------------------------------------------------- preemption

    def preempt(self, job_id: str, at, *, plan_id: str, save_h: float) -> str | None:
        """Stop the job's running Slurm job at a checkpoint (see the module doc): mark it, then cancel it. The same
        (plan_id, job_id) again returns the first preemption's ref (and cancels the job if it still runs); None
        when no Slurm job of `job_id` runs at `at`. `save_h` is the job script's business (SIGTERM, KillWait)."""
        at = utc(at)
        jobs = self.cli.jobs()
        for ref, (key, rec) in self._all_jobs(jobs).items():
            if key.job_id == str(job_id) and key.preempted is not None and key.preempted.plan_id == plan_id:
                if rec["state"] in LIVE:
                    self.cli.cancel(ref)
                return f"{ref}/preempted/{plan_id}"
        found = self._running_at(job_id, at, jobs)
        if found is None:
            return None
        key, job = found
        ref = str(job["job_id"])
        self.cli.update(ref, JobName=key.with_preemption(Preemption(at, plan_id)).name())
        self.cli.cancel(ref)
        return f"{ref}/preempted/{plan_id}"

    def preemption_ref(self, plan_id: str, job_id: str) -> str | None:
        for ref, (key, _) in self._all_jobs().items():
            if key.job_id == str(job_id) and key.preempted is not None and key.preempted.plan_id == plan_id:
                return f"{ref}/preempted/{plan_id}"
        return None

    # ------------------------------------------------------------------------------------------- cancel

    def cancel(self, job_id: str, now) -> bool:
        live = [j for k, j in self._live() if k.job_id == str(job_id) and str(j.get("job_state")) in LIVE]
        for job in live:
            self.cli.cancel(str(job["job_id"]))
        return bool(live)
