"""The operating loop, one planning hour T at a time (DESIGN.md, "Operating loop"):

1. **sync**: the rows SQL inserted into `queue.submissions` join the queue; operators' cancellations of dispatched
   jobs go to their executors; each executor's events of [T-1h, T) are loaded into `raw.job_events`, and the
   queue's states follow them (started -> running, finished, failed -> queued again while retries are left, else
   failed, cancelled). A job whose executor cannot confirm it (`unconfirmed`) stays dispatched and is reported.
2. **plan**: the queued and planned jobs submitted by T, on the configured fleet, around what the executors report
   running at T (never what earlier plans assumed); plan.* and the schedule files are written; jobs that start
   later become `planned`.
3. **dispatch**: jobs imported from an executor's own queue are adopted under the plan (released to start by their
   latest start; a run the executor then starts itself is the plan's attempt 0, which moves the queue like any
   run); the jobs that start at T go to their cluster's executor through the exactly-once dispatch log and become
   `dispatched` (an attempt more).

    run_hour("2021-07-15T12:00Z")                         # sync -> plan -> dispatch
    run_hours("2021-07-15T00:00Z", 48)                    # the hours in a row

T comes from the caller (a DAG run, `--as-of`), never the wall clock; the replay executor's clock is T itself.
Re-running an hour right after it leaves the warehouse and the dispatch log as they were: the window's events
load as the same batch, state changes already made are no-ops, and the plan sees the jobs its own first run
dispatched as pending and their runs as not yet running, so it is the same plan.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass, field

import pandas as pd

from common.jsonutil import canonical_json
from common.timeutil import HOUR, iso_z, utc_hour
from scheduling import service_hours
from scheduling.domain.execution import DEFAULT_CHECKPOINT_MIN
from scheduling.domain.plan import Plan
from scheduling.executors.base import Executor
from scheduling.executors.dispatch_log import DispatchError, dispatch, read_log
from scheduling.executors.events import TABLE as EVENTS
from scheduling.executors.events import load_events, window_start
from scheduling.executors.items import dispatch_items
from scheduling.executors.power_log import apply_power_changes, read_changes, record_decisions
from scheduling.executors.preempt_log import apply_preemptions, read_preemptions, record_preemptions
from scheduling.executors.registry import make_executor
from scheduling.executors.runs import ASSIGNMENTS
from scheduling.executors.service_log import apply_scalings, load_service_usage, read_scalings
from scheduling.output.loop_log import logged_step
from scheduling.output.plan_store import plan_id_for, read_plan
from scheduling.planning.pausing import Pausing
from scheduling.planning.policies.registry import DEFAULT_POLICY
from scheduling.planning.recap import Recapping
from scheduling.planning.serving import ServingPolicy
from scheduling.queue import store
from scheduling.queue.frame import job_frame, pending_job_frame
from scheduling.queue.intake import fleet_facts, intake_staging, submit_mappings
from scheduling.service import (
    DEFAULT_DEADLINE_RESERVE,
    DEFAULT_HORIZON_H,
    make_plan,
    plan_fleet,
    plan_forecasts,
    validate_inputs,
    write_plan,
)
from warehouse.db import column_exists, reader, session, table_exists, writer

log = logging.getLogger(__name__)

# the recent arrivals a policy may forecast demand from (rolling-lp replays the last 18 h of them)
ARRIVALS_LOOKBACK = pd.Timedelta(hours=24)
# queue states of jobs an executor has, and of every job handed on (the recent ones are demand history)
LIVE_STATES = ("dispatched", "running")
# queue states of jobs no plan dispatched yet (an adopted import's own start moves them: `apply_events`)
WAITING_STATES = ("queued", "planned")
HANDED_ON_STATES = ("dispatched", "running", "finished", "failed", "cancelled")
# what an event means for the job's state (failed: queued again while retries are left)
# (preempted: queued again at once, resuming from the checkpoint `queue.checkpoints` keeps)
EVENT_STATE = {
    "started": "running",
    "resumed": "running",
    "finished": "finished",
    "cancelled": "cancelled",
    "failed": "failed",
    "preempted": "preempted",
}


@dataclass
class LoopContext:
    """What one hour works with: the planning time, the fleet, each cluster's executor, the settings."""

    plan_time: pd.Timestamp
    fleet: object
    executors: dict[str, Executor]
    policy: str = DEFAULT_POLICY
    horizon_hours: int = DEFAULT_HORIZON_H
    deadline_reserve: float = DEFAULT_DEADLINE_RESERVE
    db_path: object = None
    data_dir: object = None
    schedule_root: object = None
    explainer: object = None
    recapping: Recapping | None = None  # the hourly power limits of running jobs (None: the defaults)
    pausing: Pausing | None = None  # the hourly preemptions of running jobs for carbon (None: the defaults)
    serving: ServingPolicy | None = None  # the inference services' hourly capacity rule (None: the defaults)

    @property
    def plan_id(self) -> str:
        return plan_id_for(self.policy, self.plan_time)

    def distinct_executors(self) -> list[Executor]:
        """Each executor once, in cluster order."""
        return list({id(e): e for e in self.executors.values()}.values())


@dataclass
class HourResult:
    plan_time: pd.Timestamp
    sync: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    dispatch: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"plan_time": iso_z(self.plan_time), "sync": self.sync, "plan": self.plan, "dispatch": self.dispatch}


def fleet_executors(fleet, db_path=None) -> dict[str, Executor]:
    """Cluster name -> the executor its jobs go to; clusters that name the same kind and settings share one."""
    built: dict[str, Executor] = {}
    out = {}
    for cluster, config in fleet.executors().items():
        key = canonical_json({"kind": config.kind, "settings": config.settings})
        if key not in built:
            try:
                built[key] = make_executor(config.kind, config.settings, db_path=db_path)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"cluster {cluster!r}: executor {config.kind!r}: {exc}") from exc
        out[cluster] = built[key]
    return out


def context(
    as_of,
    *,
    policy: str = DEFAULT_POLICY,
    regions=None,
    horizon_hours: int = DEFAULT_HORIZON_H,
    deadline_reserve: float = DEFAULT_DEADLINE_RESERVE,
    db_path=None,
    data_dir=None,
    schedule_root=None,
    explainer=None,
    fleet=None,
    executors: dict[str, Executor] | None = None,
    recapping: Recapping | None = None,
    pausing: Pausing | None = None,
    serving: ServingPolicy | None = None,
) -> LoopContext:
    """The hour's context; ValueError naming a bad setting before any work."""
    checked = validate_inputs(as_of, policy, regions, horizon_hours, deadline_reserve)
    fleet = fleet if fleet is not None else plan_fleet(regions, data_dir)
    return LoopContext(
        plan_time=utc_hour(checked["as_of"]),
        fleet=fleet,
        executors=executors if executors is not None else fleet_executors(fleet, db_path),
        policy=policy,
        horizon_hours=int(horizon_hours),
        deadline_reserve=checked["deadline_reserve"],
        db_path=db_path,
        data_dir=data_dir,
        schedule_root=schedule_root,
        explainer=explainer,
        recapping=recapping,
        pausing=pausing,
        serving=serving,
    )


def one_connection(step):
    """Run a step (its first argument: the LoopContext) on one warehouse connection (`warehouse.db.session`): a
    step opens the warehouse dozens of times, and each open and close of a large file costs tens of ms."""

    @functools.wraps(step)
    def wrapped(ctx, *args, **kwargs):
        with session(ctx.db_path):
            return step(ctx, *args, **kwargs)

    return wrapped


# ------------------------------------------------------------------------------------------------ 1. sync


def _queue_rows(db_path, states) -> pd.DataFrame:
    with reader(db_path) as con:
        if not table_exists(con, store.JOBS):
            return pd.DataFrame(columns=["tenant", "job_id", "state", "attempts", "max_retries", "cancel_requested_at"])
        marks = ", ".join("?" for _ in states)
        return con.execute(
            f"SELECT tenant, job_id, state, attempts, max_retries, cancel_requested_at FROM {store.JOBS} "
            f"WHERE state IN ({marks}) ORDER BY tenant, job_id",
            list(states),
        ).df()


def request_cancellations(ctx: LoopContext) -> list[str]:
    """Pass operators' cancellations of dispatched or running jobs (requested by T) to their executors; the
    executor's `cancelled` event then ends the job. Returns the planner ids the executors stopped."""
    live = _queue_rows(ctx.db_path, LIVE_STATES)
    live = live[live["cancel_requested_at"].notna()]
    live = live[pd.to_datetime(live["cancel_requested_at"], utc=True) <= ctx.plan_time]
    stopped = []
    for row in live.itertuples(index=False):
        job = f"{row.tenant}/{row.job_id}"
        if any(executor.cancel(job, ctx.plan_time) for executor in ctx.distinct_executors()):
            stopped.append(job)
    return stopped


def apply_events(events: pd.DataFrame, ctx: LoopContext) -> dict[str, int]:
    """Move queue states after the window's events, in time order; an event of an older attempt than the job's
    current one is history and changes nothing. Attempt 0 is an adopted import its executor started without a plan
    (at its latest start): it moves a job no plan dispatched yet (queued or planned). The changes are written
    together (`store.apply_changes`: one transaction, a few statements). Returns the number of jobs per state
    entered."""
    own_starts = bool((events["attempt"] == 0).any())  # the waiting jobs are read only when they can move
    live = _queue_rows(ctx.db_path, LIVE_STATES + WAITING_STATES if own_starts else LIVE_STATES)
    # plain dicts: this runs once per event (thousands an hour), where frame lookups cost ~0.5 ms each
    current = {
        (t, j): {"state": st, "attempts": int(a), "max_retries": int(m)}
        for t, j, st, a, m in zip(live["tenant"], live["job_id"], live["state"], live["attempts"], live["max_retries"])
    }
    entered: dict[str, int] = {}
    changes, checkpoints = [], []
    ordered = events.sort_values(["event_time", "planner_job_id", "event"], kind="mergesort")
    for event in ordered.itertuples(index=False):
        key = (event.tenant, event.job_id)
        target = EVENT_STATE.get(event.event)
        row = current.get(key)
        if target is None or row is None:
            continue
        if row["attempts"] != int(event.attempt) or (row["state"] in WAITING_STATES and int(event.attempt) != 0):
            continue
        if target == "failed" and row["attempts"] <= row["max_retries"]:
            target = "queued"  # a retry: planned again from the next hour
        if target == row["state"]:
            continue
        reason = f"{event.executor}: {event.event} ({event.plan_id}, attempt {event.attempt})"
        changes.append((key, target, event.event_time, reason))
        entered[target] = entered.get(target, 0) + 1
        if target == "preempted":
            changes.append((key, "queued", event.event_time, reason))
            checkpoints.append((*key, int(event.attempt), event.event_time, event.plan_id, event.executor))
            target = "queued"
        if target in LIVE_STATES or target in WAITING_STATES:
            row["state"] = target
        else:
            del current[key]
    kept = _kept_shares(checkpoints, ctx)
    with writer(ctx.db_path) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            store.apply_changes(changes, source="loop:sync", con=con)
            store.record_checkpoints(con, kept)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return entered


def _kept_shares(checkpoints: list[tuple], ctx: LoopContext) -> list[tuple]:
    """`store.record_checkpoints` rows of the preempted attempts `checkpoints` ((tenant, job_id, attempt, time,
    run plan id, executor) each): the share of the job the plan that preempted it expected the checkpoint to keep
    (`plan.preemptions`), else (a run stopped by someone else) the share its previous checkpoint kept."""
    if not checkpoints:
        return []
    jobs = [f"{t}/{j}" for t, j, *_ in checkpoints]
    decided = read_preemptions(db_path=ctx.db_path, job_ids=jobs)
    expected = {
        (r.job_id, r.run_plan_id, int(r.attempt)): float(r.work_done)
        for r in decided.itertuples(index=False)
        if r.status == "sent"
    }
    with reader(ctx.db_path) as con:
        before = store.checkpoint_shares(con, [(t, j) for t, j, *_ in checkpoints])
    out = []
    for (tenant, job_id, attempt, at, plan_id, executor), job in zip(checkpoints, jobs):
        share = expected.get((job, plan_id, attempt), before.get((tenant, job_id), (0.0, 0))[0])
        out.append((tenant, job_id, attempt, at, share, plan_id, executor))
    return out


def _latest_starts(jobs: list[str], ctx: LoopContext) -> dict[str, pd.Timestamp]:
    """Planner id -> the latest start that still meets the job's deadline (its run time on its home cluster)."""
    with reader(ctx.db_path) as con:
        rows = store.fetch(con, [store.split_id(j) for j in jobs])
    specs = [store.spec_of(r) for r in rows.values()]
    frame = job_frame(specs, ctx.fleet, rows=list(rows.values()), data_dir=ctx.data_dir)
    latest = pd.to_datetime(frame["deadline"], utc=True) - pd.to_timedelta(frame["duration_h_home"], unit="h")
    return dict(zip(frame["job_id"], latest))


def import_jobs(ctx: LoopContext) -> tuple[dict, dict[str, str]]:
    """Jobs users submitted to the executors themselves for carbon-aware planning (`Executor.imports`) into
    queue.jobs, each as its own submission (a rejected one is quarantined once, with its reasons, and stays with
    its executor; the accepted ones are adopted once the hour's plan is written, `adopt_imports`); those the queue
    cancelled are withdrawn. Returns (the report, unreachable executors)."""
    T = ctx.plan_time
    region = dict(zip(ctx.fleet.names, ctx.fleet.cluster_regions))
    home = {}
    for cluster, executor in ctx.executors.items():
        home.setdefault(id(executor), region[cluster])
    report: dict = {"accepted": 0, "unchanged": 0, "rejected": {}}
    unreachable: dict[str, str] = {}
    facts = None
    for executor in ctx.distinct_executors():
        try:
            found = executor.imports(T)
        except Exception as exc:  # noqa: BLE001 - fail open: the jobs wait in the executor until the next hour
            unreachable[executor.name] = f"{type(exc).__name__}: {exc}"
            continue
        if found and facts is None:
            facts = fleet_facts(fleet=ctx.fleet, data_dir=ctx.data_dir)
        for job in found:
            outcome = submit_mappings(
                [{"home_region": home[id(executor)], **job}],
                source=_import_source(executor),
                as_of=job.get("submitted_at") or T,  # not T: offered again next hour, it is the same batch
                facts=facts,
                db_path=ctx.db_path,
                data_dir=ctx.data_dir,
            ).outcomes[0]
            if outcome.status == "rejected":
                report["rejected"][outcome.job] = "; ".join(e["message"] for e in outcome.errors)
                continue
            report[outcome.status] += 1  # accepted | unchanged (never replaced: the intake keeps a stored job)
        try:
            for job in _cancelled_imports(executor, ctx):
                if executor.drop_import(job, T):
                    report.setdefault("withdrawn", []).append(job)
        except Exception as exc:  # noqa: BLE001 - they stay live there; the next hour tries again
            unreachable[executor.name] = f"{type(exc).__name__}: {exc}"
    return report, unreachable


def adopt_imports(ctx: LoopContext) -> dict[str, str]:
    """Hand each executor's imported jobs that no plan dispatched yet (queued, planned) to `Executor.adopt` under
    the hour's plan, which is written by now and holds them: a held one is released to start by its latest start,
    and a run it then starts itself is that plan's attempt 0. Returns the executors that could not be reached
    (their jobs stay held; the next hour tries again)."""
    unreachable: dict[str, str] = {}
    for executor in ctx.distinct_executors():
        jobs = _waiting_imports(executor, ctx)
        if not jobs:
            continue
        cluster = next(c for c, e in ctx.executors.items() if e is executor)
        try:
            executor.adopt(_latest_starts(jobs, ctx), ctx.plan_time, plan_id=ctx.plan_id, cluster=cluster)
        except Exception as exc:  # noqa: BLE001 - fail open: they stay held, the next hour adopts them
            log.warning("hour %s: executor %s could not adopt imports: %s", iso_z(ctx.plan_time), executor.name, exc)
            unreachable[executor.name] = f"{type(exc).__name__}: {exc}"
    return unreachable


def _waiting_imports(executor: Executor, ctx: LoopContext) -> list[str]:
    """Jobs imported from `executor`, submitted by T, that no plan dispatched yet."""
    waiting = ", ".join(f"'{state}'" for state in WAITING_STATES)
    return _imported(executor, ctx, f"state IN ({waiting}) AND submitted_at <= ?", [ctx.plan_time])


def _import_source(executor: Executor) -> str:
    return f"executor:{executor.name}"


def _cancelled_imports(executor: Executor, ctx: LoopContext) -> list[str]:
    """Jobs imported from `executor` that the queue cancelled in the last day (still live there until dropped)."""
    since = ctx.plan_time - ARRIVALS_LOOKBACK
    return _imported(executor, ctx, "state = 'cancelled' AND state_changed_at > ? AND state_changed_at <= ?",
                     [since, ctx.plan_time])  # fmt: skip


def _imported(executor: Executor, ctx: LoopContext, condition: str, params: list) -> list[str]:
    """Planner ids of the jobs imported from `executor` that meet `condition` (SQL on queue.jobs, `?` = params)."""
    with reader(ctx.db_path) as con:
        if not table_exists(con, store.JOBS):
            return []
        rows = con.execute(
            f"SELECT tenant || '/' || job_id FROM {store.JOBS} WHERE created_from = ? AND {condition} ORDER BY 1",
            [_import_source(executor), *(p.to_pydatetime() if isinstance(p, pd.Timestamp) else p for p in params)],
        ).fetchall()
    return [r[0] for r in rows]


def _sync_details(_ctx, out: dict) -> dict:
    return {"unreachable": sorted(out["unreachable"]), "unconfirmed": len(out["unconfirmed"])}


@one_connection
@logged_step("sync", _sync_details)
def sync(ctx: LoopContext) -> dict:
    """Step 1 (see the module doc): staged submissions, cancellations, the executors' events of [T-1h, T)."""
    T = ctx.plan_time
    staged = intake_staging(as_of=T, db_path=ctx.db_path, data_dir=ctx.data_dir)
    imported, unreachable = import_jobs(ctx)
    stopped = request_cancellations(ctx)
    loaded, frames = 0, []
    for executor in ctx.distinct_executors():
        since = window_start(executor, T, db_path=ctx.db_path)
        try:
            events = executor.sync(T, since=since)
        except Exception as exc:  # noqa: BLE001 - fail open: the next hour catches this window up
            log.warning("hour %s: executor %s could not be synced: %s", iso_z(T), executor.name, exc)
            unreachable[executor.name] = f"{type(exc).__name__}: {exc}"
            continue
        loaded += int(load_events(events, executor, since, T, db_path=ctx.db_path).rows)
        frames.append(events)
    events = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else None
    entered = apply_events(events, ctx) if events is not None else {}
    served = sync_service_usage(ctx, unreachable)
    return {
        "staged": staged.counts,
        "imported": imported,
        "cancel_requests_passed": stopped,
        "events": loaded,
        "entered": entered,
        "unreachable": unreachable,
        "unconfirmed": [] if events is None else sorted(events.loc[events["event"] == "unconfirmed", "planner_job_id"]),
        "service_hours": served,
    }


def sync_service_usage(ctx: LoopContext, unreachable: dict) -> int:
    """The hour [T-1h, T) the executors' services served, with its counterfactual, into `raw.service_usage`
    (replacing the window: a re-run writes the same rows). An executor that cannot be reached reports none."""
    T = ctx.plan_time
    frames = []
    for executor in ctx.distinct_executors():
        if not executor.serves:
            continue
        try:
            frames.append(executor.service_usage(T, since=T - HOUR))
        except Exception as exc:  # noqa: BLE001 - fail open: its hour is missing from the ledger, the loop goes on
            log.warning("hour %s: executor %s reports no service usage: %s", iso_z(T), executor.name, exc)
            unreachable.setdefault(executor.name, f"{type(exc).__name__}: {exc}")
    usage = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else None
    if usage is None and not service_hours.any_services(ctx.db_path):
        return 0
    usage = service_hours.with_counterfactual(usage, ctx.fleet, ctx.db_path, ctx.data_dir)
    return load_service_usage(usage if usage is not None else pd.DataFrame(), T - HOUR, T, ctx.db_path)


# ------------------------------------------------------------------------------------------------ 2. plan


def _dispatched_by(plan_id: str, db_path) -> set[str]:
    """The jobs this plan's own earlier run dispatched (a re-run plans them again, as the first run did)."""
    log_rows = read_log(plan_id, db_path=db_path)
    return set(log_rows["job_id"]) if len(log_rows) else set()


def drained_fleet(ctx: LoopContext):
    """The fleet without the nodes the executors' resource managers drain at T (`Executor.drained_nodes`, e.g.
    Slurm's DRAIN): nothing new starts there. An executor that cannot be reached drains nothing (fail open)."""
    drained: dict[str, dict[str, str]] = {}
    for executor in ctx.distinct_executors():
        try:
            nodes = executor.drained_nodes(ctx.plan_time)
        except Exception as exc:  # noqa: BLE001 - fail open: plan on the nodes the fleet file lists
            log.warning("hour %s: executor %s reports no drained nodes: %s", iso_z(ctx.plan_time), executor.name, exc)
            continue
        for cluster in (c for c, e in ctx.executors.items() if e is executor and nodes):
            drained[cluster] = nodes
    return ctx.fleet.with_drained(drained) if drained else ctx.fleet


def _running(executor: Executor, T) -> pd.DataFrame:
    """What `executor` runs at T; nothing known when it cannot be reached (its jobs' dispatches fail open too)."""
    try:
        return executor.running(T)
    except Exception as exc:  # noqa: BLE001 - fail open: plan the rest of the fleet
        log.warning("hour %s: executor %s reports no running jobs: %s", iso_z(T), executor.name, exc)
        return pd.DataFrame()


def _resources(running: pd.DataFrame, db_path) -> pd.DataFrame:
    """CPU milli-cores and memory MiB of the running jobs, by planner id, from the queue: a run holds them however
    long ago its job was submitted (the recent arrivals do not list a job running for more than a day); whether the
    job checkpoints, its checkpoint overhead and preemption cap (empty: the defaults), the share of it done before
    this run and its preemptions so far (`queue.checkpoints`)."""
    keys = [store.split_id(j) for j in running["job_id"]]
    with reader(db_path) as con:
        rows = store.fetch(con, keys)
        kept = store.checkpoint_shares(con, keys)
    frame = pd.DataFrame(
        [
            (
                f"{t}/{j}",
                r["cpu_milli"],
                r["memory_mib"],
                r["checkpoint_interval_min"] is not None,
                r.get("checkpoint_overhead_min"),
                r.get("max_preemptions"),
                *kept.get((t, j), (0.0, 0)),
            )
            for (t, j), r in rows.items()
        ],
        columns=[
            "job_id",
            "cpu_milli",
            "memory_mib",
            "checkpointing",
            "checkpoint_overhead_min",
            "max_preemptions",
            "work_done",
            "preemptions",
        ],  # fmt: skip
    )
    return frame.set_index("job_id")


def inputs(ctx: LoopContext) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(pending, running, arrived) at T: the queued and planned jobs submitted by T (plus those the hour's own
    plan dispatched, on a re-run), what the executors report running at T (not the runs the hour's own plan
    started), and the recent arrivals already dispatched (demand history for the policy)."""
    T, db = ctx.plan_time, ctx.db_path
    mine = _dispatched_by(ctx.plan_id, db)
    pending = pending_job_frame(T, ctx.fleet, db_path=db, data_dir=ctx.data_dir)
    others = store.load_specs(HANDED_ON_STATES, as_of=T, db_path=db, since=T - ARRIVALS_LOOKBACK, or_ids=mine)
    frame = job_frame([s for s, _ in others], ctx.fleet, rows=[r for _, r in others], data_dir=ctx.data_dir)
    own = frame["job_id"].isin(mine)
    if own.any():
        unhostable = pending.attrs.get("unhostable", [])
        pending = pd.concat([pending, frame[own]], ignore_index=True)
        pending = pending.sort_values(["submitted_at", "job_id"], kind="mergesort").reset_index(drop=True)
        pending.attrs["unhostable"] = unhostable
    arrived = frame[~own].reset_index(drop=True)
    runs = [r for r in (_running(e, T) for e in ctx.distinct_executors()) if len(r)]
    if not runs:
        return pending, pd.DataFrame(), arrived
    running = pd.concat(runs, ignore_index=True)
    running = running[~running["job_id"].isin(mine)]
    running = running.join(_resources(running, db), on="job_id")
    running[["cpu_milli", "memory_mib"]] = running[["cpu_milli", "memory_mib"]].fillna(0).astype("int64")
    running["checkpointing"] = running["checkpointing"].fillna(False).astype(bool)
    running[["work_done", "preemptions"]] = running[["work_done", "preemptions"]].fillna(0)
    # a resumed run reads its checkpoint back first, for as long as the job's checkpoint takes (the recap's restore)
    minutes = pd.to_numeric(running["checkpoint_overhead_min"], errors="coerce").fillna(DEFAULT_CHECKPOINT_MIN)
    running["restore_h"] = (minutes / 60.0).where(running["work_done"] > 0, 0.0)
    running = running.rename(columns={"gpu_count": "num_gpu"})
    running["gpu_devices"] = running["gpu_devices"].fillna("")
    running = _run_details(running.reset_index(drop=True), ctx)
    return pending, running, arrived


def _run_details(running: pd.DataFrame, ctx: LoopContext) -> pd.DataFrame:
    """`running` with what the planner needs to follow each run's progress (`scheduling.planning.recap`): its
    dispatch plan's window, limit and deadline, the limits it changed to before T (its `power_changed` events),
    the limit in force before T, and whether its executor can change a limit (`recap`)."""
    keys = running[["plan_id", "job_id"]].astype(str)
    with reader(ctx.db_path) as con:
        if not table_exists(con, ASSIGNMENTS):
            return running
        con.register("_runs", keys)
        # a long job's run stops after its chunk (plans written before chunks have no such column: whole runs)
        chunk_end = "a.chunk_end" if column_exists(con, ASSIGNMENTS, "chunk_end") else "CAST(NULL AS TIMESTAMPTZ)"
        plans = con.execute(
            f"SELECT a.plan_id, a.job_id, a.start_time AS planned_start, a.end_time AS planned_end, "
            f"a.power_limit_w AS dispatch_limit_w, a.deadline, {chunk_end} AS chunk_end FROM {ASSIGNMENTS} AS a "
            "JOIN _runs AS r ON r.plan_id = a.plan_id AND r.job_id = a.job_id"
        ).df()
        changes = pd.DataFrame(columns=["plan_id", "job_id", "event_time", "power_limit_w"])
        if table_exists(con, EVENTS):
            changes = con.execute(
                f"SELECT e.plan_id, e.planner_job_id AS job_id, e.event_time, e.power_limit_w FROM {EVENTS} AS e "
                "JOIN _runs AS r ON r.plan_id = e.plan_id AND r.job_id = e.planner_job_id "
                "WHERE e.event = 'power_changed' AND e.event_time < ? ORDER BY e.event_time",
                [ctx.plan_time.to_pydatetime()],
            ).df()
        con.unregister("_runs")
    out = running.merge(plans, on=["plan_id", "job_id"], how="left")
    history: dict[tuple[str, str], list] = {}
    for r in changes.itertuples(index=False):
        history.setdefault((r.plan_id, r.job_id), []).append((pd.Timestamp(r.event_time), float(r.power_limit_w)))
    out["changes"] = [history.get((p, j), []) for p, j in zip(out["plan_id"], out["job_id"])]
    # the limit in force before T (a re-run of the hour sees the limits its first run found, not its own changes)
    out["power_limit_w"] = [
        ch[-1][1] if ch else (d if pd.notna(d) else w)
        for ch, d, w in zip(out["changes"], out["dispatch_limit_w"], out["power_limit_w"])
    ]
    can = {c: e.changes_power_limits for c, e in ctx.executors.items()}
    out["recap"] = out["cluster"].map(can).fillna(False).astype(bool)
    stops = {c: e.preempts for c, e in ctx.executors.items()}
    out["preempt"] = out["cluster"].map(stops).fillna(False).astype(bool)
    return out


def _plan_details(ctx: LoopContext, _out) -> dict:
    """The fleet the hour planned on: GPUs and zone per cluster (monitoring sets allocations against them)."""
    fleet = {c.name: {"gpus": int(c.n_gpus), "zone": c.config.zone} for c in ctx.fleet.clusters}
    return {"fleet": json.dumps(fleet, sort_keys=True)}


@one_connection
@logged_step("plan", _plan_details)
def plan(ctx: LoopContext, *, dry_run: bool = False, created_from: str = "loop") -> tuple[Plan, dict, pd.DataFrame]:
    """Step 2 (see the module doc): (the plan, its summary, the pending job frame)."""
    t0 = time.perf_counter()
    pending, running, arrived = inputs(ctx)
    fleet = drained_fleet(ctx)
    forecasts = plan_forecasts(fleet.schedulable(), ctx.plan_time, ctx.horizon_hours, ctx.db_path, ctx.data_dir)
    # the services first: the GPUs their replicas hold this hour are taken capacity for the batch plan
    services = service_hours.plan_service_hour(
        ctx.plan_time, ctx.plan_id, fleet, ctx.executors, running, horizon_hours=ctx.horizon_hours,
        db_path=ctx.db_path, data_dir=ctx.data_dir, policy=ctx.serving, forecasts=forecasts,
    )  # fmt: skip
    held = services["rows"]
    result, info = make_plan(
        ctx.plan_time,
        jobs=pending,
        running=pd.concat([running, held], ignore_index=True) if len(held) else running,
        arrived=arrived,
        policy=ctx.policy,
        fleet=fleet,
        horizon_hours=ctx.horizon_hours,
        deadline_reserve=ctx.deadline_reserve,
        db_path=ctx.db_path,
        data_dir=ctx.data_dir,
        recapping=ctx.recapping,
        pausing=ctx.pausing,
        forecasts=forecasts,
    )
    summary = write_plan(
        result,
        info,
        dry_run=dry_run,
        db_path=ctx.db_path,
        schedule_root=ctx.schedule_root,
        created_from=created_from,
        explainer=ctx.explainer,
        started=t0,
        job_files={cluster: executor.job_files for cluster, executor in ctx.executors.items()},
    )
    summary["files"] = len(summary["files"])
    summary["n_running"] = int(len(running))  # the jobs' runs; the services' replicas are in summary["services"]
    summary["power"] = _power_summary(info.get("recaps"))
    summary["services"] = dict(services["summary"])
    if not dry_run and not services["provisions"].empty:
        summary["services"]["logged"] = service_hours.write_service_hour(
            services, ctx.plan_id, ctx.executors, ctx.db_path
        )
    if not dry_run:
        recaps = info.get("recaps")
        if recaps is not None and len(recaps):
            changed = recaps[recaps["changed"].astype(bool)]
            summary["power"]["logged"] = record_decisions(summary["plan_id"], changed, ctx.executors, ctx.db_path)
        pauses = info.get("pauses")
        summary["preempted"] = {"decided": 0 if pauses is None else int(len(pauses))}
        if pauses is not None and len(pauses):
            summary["preempted"]["by_reason"] = pauses["reason"].value_counts().sort_index().astype(int).to_dict()
        if pauses is not None and len(pauses):
            summary["preempted"]["logged"] = record_preemptions(summary["plan_id"], pauses, ctx.executors, ctx.db_path)
    if not dry_run and len(result.assignments):
        later = result.assignments.loc[result.assignments["status"] != "dispatched", "job_id"]
        queued = set(pending.loc[pending["state"] == "queued", "job_id"]) & _waiting_now(_queue_now(later, ctx))
        store.set_states(
            [j for j in later if j in queued],
            "planned",
            at=ctx.plan_time,
            reason=summary["plan_id"],
            source="loop:plan",
            db_path=ctx.db_path,
        )
    return result, summary, pending


def _power_summary(recaps: pd.DataFrame | None) -> dict:
    """The hour's running jobs by what their limit does: counts of changes (at risk, for carbon) and of runs
    projected past their deadline even at the fastest limit."""
    if recaps is None or recaps.empty:
        return {"running_followed": 0, "raised_at_risk": 0, "changed_for_carbon": 0, "projected_late": 0}
    changed = recaps["changed"].astype(bool)
    late = pd.to_datetime(recaps["projected_end"], utc=True) > pd.to_datetime(recaps["deadline"], utc=True)
    return {
        "running_followed": int(len(recaps)),
        "raised_at_risk": int((changed & (recaps["reason"] == "at_risk")).sum()),
        "changed_for_carbon": int((changed & (recaps["reason"] == "carbon")).sum()),
        "projected_late": int(late.sum()),
    }


# ------------------------------------------------------------------------------------------------ 3. dispatch


def _dispatch_details(_ctx, out: dict) -> dict:
    """The executors that could not be reached and the jobs and actions that failed."""
    failed = len(out["failed"]) + sum(len(out[k]["failed"]) for k in ("power", "preempted", "services") if k in out)
    return {"unreachable": sorted(out.get("unreachable") or {}), "dispatch_failed": failed}


@one_connection
@logged_step("dispatch", _dispatch_details)
def dispatch_plan(ctx: LoopContext, result: Plan | None = None, pending: pd.DataFrame | None = None) -> dict:
    """Step 3 (see the module doc): the plan's jobs that start at T, to their clusters' executors, exactly once;
    those jobs -> dispatched. `result`/`pending` default to the stored plan of the hour and the queue."""
    if result is None:
        result = read_plan(ctx.plan_id, db_path=ctx.db_path)
    totals = {"plan_id": ctx.plan_id, "sent": 0, "skipped": 0, "reconciled": 0, "failed": {}}
    totals["unreachable"] = adopt_imports(ctx)
    totals["power"] = change_power_limits(ctx)
    totals["preempted"] = preempt_running(ctx)
    totals["services"] = scale_services(ctx)
    starting = result.dispatched()
    if starting.empty:
        return totals
    if pending is None:
        loaded = store.load_specs(("queued", "planned", "dispatched"), as_of=ctx.plan_time, db_path=ctx.db_path)
        pending = job_frame([s for s, _ in loaded], ctx.fleet, rows=[r for _, r in loaded], data_dir=ctx.data_dir)
    jobs = pending[pending["job_id"].isin(starting["job_id"])].copy()
    mine = _dispatched_by(ctx.plan_id, ctx.db_path)
    # the attempt this dispatch is: the next one, or (a re-run) the one the first run counted
    jobs["attempt"] = jobs["attempts"] + (~jobs["job_id"].isin(mine)).astype(int)
    items = dispatch_items(result, jobs)
    rows = _queue_now(items["job_id"], ctx)
    waiting = _waiting_now(rows)
    # a past hour run again plans from the queue as it was then: the jobs a later hour handed on are not sent twice
    items = items[items["job_id"].isin(waiting | set(mine))]
    origins = _import_origins(rows, ctx)
    for executor in ctx.distinct_executors():
        clusters = [c for c, e in ctx.executors.items() if e is executor]
        part = items[items["cluster"].isin(clusters)]
        if part.empty:
            continue
        moved = _drop_imports_elsewhere(part["job_id"], origins, executor, ctx)
        totals["failed"].update(moved)
        part = part[~part["job_id"].isin(moved)]
        if part.empty:
            continue
        try:
            outcome = dispatch(ctx.plan_id, part, executor, db_path=ctx.db_path)
        except DispatchError as exc:  # fail open: these jobs stay queued for the next hour; the others go on
            log.warning("%s", exc)
            outcome = exc.result
            totals["failed"].update(outcome.failed)
        except Exception as exc:  # noqa: BLE001 - an executor that cannot be reached at all fails open too
            log.warning("hour %s: executor %s failed: %s", iso_z(ctx.plan_time), executor.name, exc)
            logged = read_log(ctx.plan_id, db_path=ctx.db_path)
            sent = set(logged.loc[logged["status"] == "sent", "job_id"])
            totals["failed"].update({j: f"{type(exc).__name__}: {exc}" for j in part["job_id"] if j not in sent})
            continue
        for key in ("sent", "skipped", "reconciled"):
            totals[key] += len(getattr(outcome, key))
    store.set_states(
        [j for j in items["job_id"] if j not in totals["failed"] and j in waiting],
        "dispatched",
        at=ctx.plan_time,
        reason=ctx.plan_id,
        source="loop:dispatch",
        db_path=ctx.db_path,
    )
    return totals


def change_power_limits(ctx: LoopContext) -> dict:
    """The hour's logged power-limit changes of running jobs, to their executors, exactly once
    (`scheduling.executors.power_log`); an executor that fails leaves its jobs at their limits (fail-open)."""
    return _carry_out(ctx, read_changes, apply_power_changes)


def preempt_running(ctx: LoopContext) -> dict:
    """The hour's logged preemptions of running jobs, to their executors, exactly once
    (`scheduling.executors.preempt_log`); an executor that fails lets its jobs run on (fail-open)."""
    return _carry_out(ctx, read_preemptions, apply_preemptions)


def scale_services(ctx: LoopContext) -> dict:
    """The hour's logged scalings of inference services, to their executors, exactly once
    (`scheduling.executors.service_log`); an executor that fails leaves its replicas as they were (fail-open)."""
    return _carry_out(ctx, read_scalings, apply_scalings)


def _carry_out(ctx: LoopContext, read, apply) -> dict:
    """The counts of carrying out one action log's rows of the hour (`action_log.ActionLog.carry_out`)."""
    out = {"sent": 0, "reconciled": 0, "skipped": 0, "no_run": 0, "failed": {}}
    if read(ctx.plan_id, ctx.db_path).empty:
        return out
    for executor in ctx.distinct_executors():
        done = apply(ctx.plan_id, executor, ctx.db_path)
        for key in ("sent", "reconciled", "skipped", "no_run"):
            out[key] += len(done[key])
        out["failed"].update(done["failed"])
    return out


def _queue_now(jobs, ctx: LoopContext) -> dict[tuple[str, str], dict]:
    """The queue's rows of `jobs` (planner ids) as they are now."""
    with reader(ctx.db_path) as con:
        return store.fetch(con, [store.split_id(j) for j in jobs])


def _waiting_now(rows: dict) -> set[str]:
    """The planner ids of the jobs of `rows` (`_queue_now`) that are queued or planned now. A past hour run again
    plans from the queue as it was then; a job that has moved on since (dispatched, running, ended) keeps its state."""
    return {f"{t}/{j}" for (t, j), r in rows.items() if r["state"] in ("queued", "planned")}


def _import_origins(rows: dict, ctx: LoopContext) -> dict[str, Executor]:
    """Planner id -> the executor a job of `rows` (`_queue_now`) was imported from (`Executor.imports`)."""
    by_source = {_import_source(e): e for e in ctx.distinct_executors()}
    return {f"{t}/{j}": by_source[r["created_from"]] for (t, j), r in rows.items() if r["created_from"] in by_source}


def _drop_imports_elsewhere(jobs, origins: dict[str, Executor], executor: Executor, ctx) -> dict[str, str]:
    """Withdraw the user's own submission of each job that goes to `executor` from another one, before it is
    submitted here (never two runs of one job); the jobs whose origin could not be reached stay, with the error."""
    failed = {}
    for job in jobs:
        origin = origins.get(job)
        if origin is None or origin is executor:
            continue
        try:
            origin.drop_import(job, ctx.plan_time)
        except Exception as exc:  # noqa: BLE001 - fail open: the job waits for the next hour
            failed[job] = f"{origin.name}: its own submission could not be withdrawn: {type(exc).__name__}: {exc}"
    return failed


# ------------------------------------------------------------------------------------------------ the hour


def run_hour(as_of, **settings) -> HourResult:
    """sync -> plan -> dispatch for the planning hour `as_of` (settings: see `context`)."""
    ctx = context(as_of, **settings)
    out = HourResult(ctx.plan_time)
    out.sync = sync(ctx)
    result, out.plan, pending = plan(ctx)
    out.dispatch = dispatch_plan(ctx, result, pending)
    log.info(
        "hour %s: %d events, %d jobs planned, %d dispatched",
        iso_z(ctx.plan_time),
        out.sync["events"],
        out.plan["n_jobs"],
        out.dispatch["sent"] + out.dispatch["reconciled"],
    )
    return out


def run_hours(start, hours: int, progress=None, **settings) -> list[HourResult]:
    """`run_hour` for `hours` consecutive hours from `start`. A `fleet` (and `executors`) passed in serve every hour;
    without one each hour reads the fleet file again, as every `plan_hourly` run does, so that a node drained or
    removed while the hours run counts from the next hour on."""
    plan_time = context(start, **settings).plan_time  # a bad setting fails here, before any hour runs
    results = []
    for h in range(int(hours)):
        results.append(run_hour(plan_time + h * HOUR, **settings))
        if progress is not None:
            progress(results[-1])
    return results
