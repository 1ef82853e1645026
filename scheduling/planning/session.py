"""Hour-by-hour planning with state: `HourlyPlanner` (cluster agents + running jobs) and `plan_hour()` for one plan.

The plan time is always an argument (the DAG's data interval end or `as_of`), never the wall clock.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import numpy as np
import pandas as pd

from common.timeutil import utc
from scheduling.domain.execution import kept_share, run_wall_h
from scheduling.domain.fleet import load_fleet
from scheduling.domain.plan import Plan
from scheduling.packing import Pod
from scheduling.planning.agents import default_workload, job_pods, make_agents
from scheduling.planning.chunks import chunk_shares, rest_hours
from scheduling.planning.forecasts import ForecastProvider, GridSeries, make_forecasts
from scheduling.planning.pausing import Pausing, evictable_running, pause_running
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.policies.registry import DEFAULT_POLICY, make_policy
from scheduling.planning.power_options import option_arrays
from scheduling.planning.problem import JobTable, PriorityWeights, abs_hours, horizon_for
from scheduling.planning.recap import RunTimeError

log = logging.getLogger(__name__)
EXACT_RUN_TIMES = RunTimeError(0.0, 1e-9, 0)  # the simulator's runs take their planned time
PAUSE_HORIZON_H = 72  # hours of forecast the pausing rules read (a resumption within them)


class HourlyPlanner:
    """Plans the pending jobs of `jobs` hour by hour on `fleet`, keeping node state in FGD cluster agents.

    `plan(now)` plans every job submitted at or before `now` that has not started, binds the jobs starting now to
    nodes (they start; their GPU-milli are committed until their end hour) and returns the `Plan` (future starts
    are tentative and planned again next hour). `release_finished(now)` is called by `plan()` first."""

    def __init__(
        self,
        fleet,
        jobs: pd.DataFrame | None = None,
        policy: str | PlacementPolicy = DEFAULT_POLICY,
        forecasts: ForecastProvider | None = None,
        *,
        table: JobTable | None = None,
        workload=None,
        packing: str = "fgd",
        seed: int = 0,
        explain: bool = True,
        tentative: bool = True,
        max_horizon: int = 336,
        min_horizon: int = 24,
        postpone_margin_h: float = 1.0,
        weights: PriorityWeights | None = None,
        data_dir=None,
        reserve_nodes: bool = False,
        pausing: Pausing | None = None,
        chunks: bool = True,
    ):
        fleet = fleet.schedulable()  # a drained node takes no new job (its running jobs: `apply_running`)
        if table is None:
            if jobs is None:
                raise ValueError("jobs or table is required")
            table = JobTable(jobs, fleet, data_dir=data_dir)
        self.fleet = fleet
        self.table = table
        self.policy = policy if isinstance(policy, PlacementPolicy) else make_policy(policy, seed=seed, weights=weights)
        self.forecasts = forecasts
        self.pods = job_pods(table.jobs)
        self.agents = make_agents(
            fleet, workload if workload is not None else default_workload(self.pods), packing, seed
        )
        self.explain = explain
        self.tentative = tentative
        self.max_horizon = max_horizon
        self.min_horizon = min_horizon
        self.postpone_margin_h = postpone_margin_h
        n = table.n
        self.started = np.zeros(n, dtype=bool)
        self.start_h = np.full(n, -1, dtype=np.int64)
        self.end_occ_h = np.full(n, -1, dtype=np.int64)
        self.k = np.full(n, -1, dtype=np.int64)
        self.c = np.full(n, -1, dtype=np.int64)
        self.node: list = [None] * n
        self.gpus: list = [None] * n
        # preemption: share of each job's work done before its current run, the first start, the runs that ended
        # in a preemption [(job, start hour, hours run, option, cluster)]
        # a queued job preempted in an earlier hour (the queue's `work_done`, `preemptions`) resumes from its checkpoint
        self.work_done = _column(table.jobs, "work_done", 0.0, float)
        self.first_start_h = np.full(n, -1, dtype=np.int64)
        self.preempted_runs: list[tuple[int, int, int, int, int]] = []
        self.preemptions = _column(table.jobs, "preemptions", 0, np.int64)
        # a stopped run's job is queued again from the next hour, as the loop's executors report the stop then
        self.resume_h = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        # long checkpointing jobs run in chunks (`scheduling.planning.chunks`): the hour each current run stops at
        # its checkpoint (NaN: it runs to the end)
        self.chunks = chunks
        self.chunk_end_h = np.full(n, np.nan)
        self.index = {pid: j for j, pid in enumerate(self.table.jobs["job_id"].astype(str))}
        self.forecast_versions: list[str] = []
        self.fallback_shares: list[float] = []
        self.rejections = 0
        self.zone_col = None
        self.last_outcome = None
        self.external: list[tuple[int, int, tuple[int, int, int]]] = []  # running jobs given from outside
        self.track_other = True  # CPU and memory in the coordinator's capacity view
        self.reserve_nodes = reserve_nodes
        self.reserve_lead_h = 0.0  # hold a node for a blocked job this many hours before its latest start
        # preemption for carbon and for due jobs, the loop's own rule (`scheduling.planning.pausing`): None = off
        self.pausing = pausing
        self.paused: list[tuple[int, int]] = []  # (job, hour) of every pause
        # running jobs outside the table the plan may preempt for a due job (the loop's, `service.make_plan`)
        self.running_evictable: dict[str, float] = {}

    # ------------------------------------------------------------------ state
    def usage(self, now_h: int, hours: int) -> np.ndarray:
        """(3, hours, C) GPU-milli, CPU milli-cores and memory MiB committed by started (and externally given
        running) jobs from `now_h` on."""
        C = len(self.fleet)
        run = np.flatnonzero(self.started & (self.end_occ_h > now_h))
        diff = np.zeros((3, hours + 1, C), dtype=np.int64)
        starts = [np.clip(self.start_h[run] - now_h, 0, hours)]
        ends = [np.clip(self.end_occ_h[run] - now_h, 0, hours)]
        cs = [self.c[run]]
        req = [self.table.requests[run]]
        if self.external:
            ext = np.array([(c, e) for c, e, _ in self.external], dtype=np.int64).reshape(-1, 2)
            starts.append(np.zeros(len(ext), dtype=np.int64))
            ends.append(np.clip(ext[:, 1] - now_h, 0, hours))
            cs.append(ext[:, 0])
            req.append(np.array([r for _, _, r in self.external], dtype=np.int64).reshape(-1, 3))
        a, b, c, q = (np.concatenate(x) for x in (starts, ends, cs, req))
        for r in range(3):
            np.add.at(diff[r], (a, c), q[:, r])
            np.add.at(diff[r], (b, c), -q[:, r])
        return np.cumsum(diff, axis=1)[:, :hours]

    def release_finished(self, now) -> None:
        h = abs_hours(now) if not isinstance(now, (int, np.integer)) else int(now)
        for agent in self.agents:
            agent.release_finished(h)

    def pending(self, now_h: int) -> np.ndarray:
        return np.flatnonzero((self.table.submit_h <= now_h) & ~self.started & (self.resume_h <= now_h))

    # ------------------------------------------------------------------ planning
    def _forecast(self, now, hours: int):
        if self.forecasts is None:
            raise ValueError("HourlyPlanner needs a forecast provider")
        F, version, meta = self.forecasts.at(now, hours)
        return F[:, self._zone_col()], version, meta

    def _zone_col(self) -> np.ndarray:
        if self.zone_col is None:
            pos = {z: i for i, z in enumerate(self.forecasts.zones)}
            self.zone_col = np.array([pos[z] for z in self.fleet.cluster_zones], dtype=np.int64)
        return self.zone_col

    def forecast_matrix(self, now, hours: int) -> np.ndarray:
        """(hours, C) forecast per cluster known at `now` (no bookkeeping)."""
        F, _, _ = self.forecasts.at(now, hours)
        return F[:, self._zone_col()]

    def actual_matrix(self, start_h: int, hours: int) -> np.ndarray:
        """(hours, C) actual intensity per cluster for hours [start_h, start_h + hours) (all before now)."""
        grid = self.forecasts.grid
        start = pd.Timestamp(int(start_h) * 3_600_000_000_000, tz="UTC")
        arr = grid.window(start, hours)[:, self.forecasts.zidx]
        return arr[:, self._zone_col()]

    def plan_outcome(self, now, idx=None):
        now = utc(now).floor("h")
        now_h = abs_hours(now)
        self.release_finished(now_h)
        idx = self.pending(now_h) if idx is None else np.asarray(idx, dtype=np.int64)
        if not len(idx):
            return None
        H = horizon_for(self.table, idx, now_h, min_hours=self.min_horizon, max_hours=self.max_horizon)
        F, version, meta = self._forecast(now, H)
        self.forecast_versions.append(version)
        self.fallback_shares.append(float(meta.get("fallback_share", np.nan)))
        free = self.fleet.resource_capacity[:, None, :] - self.usage(now_h, H)
        if self.reserve_nodes:
            self.reserve_nodes_for(idx, now_h)
            free = free - self.held_capacity(now_h, H)
        if not self.track_other:
            free = free[0]
        done = self.work_done[idx]
        share, rest = self._chunk_plan(idx, done)
        chunked = share < 1.0
        prob = self.table.problem(
            now,
            idx,
            free,
            F,
            power_aware=self.policy.power_aware,
            forecast_version=version,
            work_left=1.0 - done if done.any() else None,
        )
        whole_dur = prob.dur
        if chunked.any():
            # the chunk: the restore (when resumed), its share of the work left, and the checkpoint written at its
            # end (its GPUs held meanwhile); it ends early enough for the rest
            ck = self.table.checkpoint_h[idx][chunked][:, None, None]
            done_c, share_c = done[chunked][:, None, None], share[chunked][:, None, None]
            full = self.table.dur[idx[chunked], : prob.dur.shape[1]]
            prob.dur = prob.dur.copy()
            prob.dur[chunked] = np.where(done_c > 0, ck, 0.0) + full * (1.0 - done_c) * share_c + ck
            prob.deadline_rel = prob.deadline_rel - rest
            if prob.run_now_dur is None:  # the run-now counterfactual stays the whole job
                prob.run_now_dur = self.table.dur[idx, 0]
        prob.evictable = self.evictable(now, now_h)
        prob.capacity_price = self.policy.capacity_prices(self, now_h, H)
        prob.expected = self.policy.expected_jobs(self, now, free, F)
        prob.postpone_margin_h = self.postpone_margin_h
        pods = [self.pods[i] for i in idx]
        out = self.policy.plan(prob, self.agents, pods, now_h, explain=self.explain, tentative=self.tentative)
        out.stats["forecast_fallback_share"] = meta.get("fallback_share")
        if chunked.any():  # the plan's runs are the whole rest (the recap and the executors' estimate), stopped early
            j_all, kk, cc = np.arange(len(idx)), np.maximum(out.k, 0), np.maximum(out.c, 0)
            out.chunk_run_h = np.where(chunked & out.placed, prob.dur[j_all, kk, cc], np.nan)
            out.problem = dataclasses.replace(out.problem, dur=whole_dur, deadline_rel=prob.deadline_rel + rest)
        go = np.flatnonzero(out.placed & (out.s == 0))
        for jj in go:
            j = int(idx[jj])
            kk, cc = int(out.k[jj]), int(out.c[jj])
            self.started[j] = True
            self.start_h[j] = now_h
            if self.first_start_h[j] < 0:
                self.first_start_h[j] = now_h
            self.k[j], self.c[j] = kk, cc
            self.end_occ_h[j] = now_h + int(np.ceil(self.run_hours(j) - 1e-9))
            self.chunk_end_h[j] = np.nan
            if chunked[jj]:  # stopped the first hour after its chunk; its GPUs then wait an hour for the rest
                self.chunk_end_h[j] = now_h + float(out.chunk_run_h[jj])
                self.end_occ_h[j] = now_h + int(np.ceil(out.chunk_run_h[jj] - 1e-9)) + 1
                job_id, bound = str(self.table.jobs["job_id"].iat[j]), self.agents[cc].end_hour
                if job_id in bound:
                    bound[job_id] = int(self.end_occ_h[j])
            self.node[j], self.gpus[j] = out.node[jj], out.gpus[jj]
        for victim, _, _ in out.evicted:
            if victim not in self.running_evictable:  # the loop's running jobs are preempted by their executors
                self.preempt(self.index[victim], now_h)
        self.rejections += int(out.stats.get("agent_rejections", 0))
        self.last_outcome = out
        out.global_index = idx
        return out

    def _chunk_plan(self, idx: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(share of its work left each job's next run does, hours its rest needs after it) of jobs `idx`
        (`scheduling.planning.chunks`; the horizon: `max_horizon`)."""
        n = len(idx)
        if not self.chunks or not n:
            return np.ones(n), np.zeros(n)
        tbl = self.table
        fastest = np.where(tbl.allowed[idx], tbl.dur[idx, 0], np.inf).min(axis=1) * (1.0 - done)
        share = chunk_shares(fastest, tbl.jobs["checkpointing"].to_numpy(bool)[idx], self.max_horizon)
        ck = tbl.checkpoint_h[idx]
        return share, rest_hours(fastest, share, ck, self.max_horizon)

    def end_chunks(self, now_h: int) -> list[int]:
        """Stop the runs whose chunk ended by `now_h` at their checkpoint (their work kept, pending again with the
        rest from the next hour, `preempt`); their GPUs wait for that rest until then (`planning.chunks`). Returns
        them."""
        due = np.flatnonzero(self.started & (self.chunk_end_h <= now_h + 1e-9))
        for j in due:
            j = int(j)
            # its binding already ends at now_h + 1 (set at its start); the capacity view keeps that hour too
            c = int(self.c[j])
            self.external.append((c, now_h + 1, tuple(int(x) for x in self.table.requests[j])))
            self.preempt(j, now_h)
        return [int(j) for j in due]

    def run_hours(self, j: int) -> float:
        """Hours job j's current run takes: the restore of its checkpoint (when resumed) and the work left at its
        start, on its option and cluster (`execution.run_wall_h`)."""
        return float(run_wall_h(self.table.dur[j, self.k[j], self.c[j]], self.work_done[j], self.table.checkpoint_h[j]))

    def evictable(self, now, now_h: int) -> dict[str, float] | None:
        """The running jobs the plan may preempt now to start a job due now; job id -> GPU-milli-hours of work it
        would take elsewhere plus those lost (the cost the agents minimise). With `pausing.for_deadline`, the loop's
        rule (`pausing.evictable_running`) on the table's running jobs; always the loop's own running jobs that its
        service offers (`running_evictable`)."""
        out = dict(self.running_evictable)
        if self.pausing is not None and self.pausing.for_deadline:
            got = self._pausable(now, now_h, PAUSE_HORIZON_H)
            if got is not None:
                F = self.forecast_matrix(now, PAUSE_HORIZON_H)
                ev = evictable_running(*got, self.fleet, self._options, F, now, EXACT_RUN_TIMES, self.pausing)
                out.update(zip(ev["job_id"], ev["cost"].astype(float)))
        return out or None

    def _done_if_stopped(self, idx: np.ndarray, now_h: int) -> np.ndarray:
        """Share of their work jobs `idx` (running) keep if stopped at `now_h` (`execution.kept_share`): a
        checkpointing job what it had done when told to checkpoint, another one nothing of this run."""
        tbl = self.table
        ck_h = tbl.checkpoint_h[idx]
        return kept_share(
            (now_h - self.start_h[idx]).astype(float),
            tbl.dur[idx, self.k[idx], self.c[idx]],
            self.work_done[idx],
            ck_h,
            ck_h,
            tbl.jobs["checkpointing"].to_numpy(bool)[idx],
        )

    def pause_running(self, now, now_h: int, horizon_h: int = PAUSE_HORIZON_H) -> list[int]:
        """Stop the running checkpointing jobs that `pausing.pause_running` pauses at `now_h` (the loop's rule, on
        the simulator's exact run times: the run-time error is nil), releasing their nodes; returns them."""
        got = self._pausable(now, now_h, horizon_h)
        if got is None:
            return []
        pauses = pause_running(
            *got, self.fleet, self._options, self.forecast_matrix(now, horizon_h), now, EXACT_RUN_TIMES, self.pausing
        )
        stopped = [self.index[j] for j in pauses["job_id"]]
        for j in stopped:
            self.agents[int(self.c[j])].release(str(self.table.jobs["job_id"].iat[j]))
            self.preempt(j, now_h)
            self.paused.append((j, now_h))
        return stopped

    def _pausable(self, now, now_h: int, horizon_h: int) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """(recaps, runs) of the running checkpointing jobs as the loop's `pausing` rules read them, or None."""
        tbl = self.table
        run = np.flatnonzero(
            self.started
            & (self.start_h < now_h)
            & (self.end_occ_h > now_h + 1)
            & tbl.jobs["checkpointing"].to_numpy(bool)
        )
        if self.pausing is None or not len(run):
            return None
        k, c = self.k[run], self.c[run]
        tf, _, lw = self._options
        restore = np.where(self.work_done[run] > 0, tbl.checkpoint_h[run], 0.0)
        ids = tbl.jobs["job_id"].astype(str).to_numpy()[run]
        recaps = pd.DataFrame(
            {
                "job_id": ids,
                "plan_id": "simulated",
                "attempt": 1 + self.preemptions[run],
                "cluster": np.array(self.fleet.names, dtype=object)[c],
                # the job's own deadline, not the reserve the plan keeps before it
                "deadline": pd.to_datetime((tbl.deadline_h[run] + tbl.deadline_spare[run]) * 3.6e12, utc=True),
                "to_limit_w": lw[k, c],
                "reason": "keep",
                # in hours at the maximum limit, as the recap counts them
                "work_h": tbl.dur[run, k, c] * (1.0 - self.work_done[run]) / tf[k, c],
                "work_done_h": np.maximum(now_h - self.start_h[run] - restore, 0.0) / tf[k, c],
            }
        )
        runs = pd.DataFrame(
            {
                "job_id": ids,
                "num_gpu": tbl.jobs["num_gpu"].to_numpy()[run],
                "gpu_milli": tbl.jobs["gpu_milli"].to_numpy()[run],
                "checkpointing": True,
                "preemptions": self.preemptions[run],
                "work_done": self.work_done[run],
                "preempt": True,
                "checkpoint_overhead_min": 60.0 * tbl.checkpoint_h[run],
            }
        )
        if "max_preemptions" in tbl.jobs.columns:  # the job spec's cap, where it gives one
            runs["max_preemptions"] = pd.to_numeric(tbl.jobs["max_preemptions"], errors="coerce").to_numpy()[run]
        return recaps, runs

    @functools.cached_property
    def _options(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return option_arrays(self.fleet, self.table.power_table, power_aware=True)

    def preempt(self, j: int, now_h: int) -> None:
        """Job j stopped at `now_h` (its agent has released it): the run so far is recorded, the work it keeps
        (`_done_if_stopped`) too, and it is pending again from the next hour."""
        kk, cc = int(self.k[j]), int(self.c[j])
        self.preempted_runs.append((j, int(self.start_h[j]), int(now_h - self.start_h[j]), kk, cc))
        self.work_done[j] = self._done_if_stopped(np.array([j]), now_h)[0]
        self.preemptions[j] += 1
        self.resume_h[j] = now_h + 1
        self.started[j] = False
        self.start_h[j] = self.end_occ_h[j] = self.k[j] = self.c[j] = -1
        self.chunk_end_h[j] = np.nan
        self.node[j] = self.gpus[j] = None

    def reserve_nodes_for(self, idx: np.ndarray, now_h: int) -> dict[str, str]:
        """Backfill reservations, made again from the cluster state at every plan (so a replayed plan and the
        simulator agree): a pending multi-GPU job that no node can take now gets a node held
        (`ClusterAgent.reserve`) on the cluster where it would finish first once the node drains; other jobs
        may use that node only if they end by then. Without it, whole-node jobs wait for days while small jobs
        keep refilling every node and the GPU count says "free". Earliest latest start first; one node per
        cluster; only for jobs that cannot wait another hour (`reserve_lead_h`). Returns {job id: node}.
        Off by default (`reserve_nodes=False`): at high load a held node costs more deadlines than it saves
        (docs/experiments.md, "Levers tried and not adopted")."""
        for agent in self.agents:
            agent.reserved.clear()
        tbl = self.table
        multi = tbl.jobs["num_gpu"].to_numpy()[idx] > 1
        cand = idx[multi]
        if not len(cand):
            return {}
        d = np.where(tbl.allowed[cand], tbl.dur[cand, 0], np.inf)  # (n, C) at the default power limit
        latest = tbl.deadline_h[cand] - d.min(axis=1)
        held = {}
        due = latest < now_h + 1 + self.reserve_lead_h  # a job that can still wait keeps every node in use
        for r in np.flatnonzero(due)[np.argsort(latest[due], kind="stable")]:
            pod = self.pods[int(cand[r])]
            hosts = np.flatnonzero(np.isfinite(d[r]))
            if not len(hosts) or any(self.agents[c].cluster.feasible(pod).any() for c in hosts):
                continue
            # the node (on any cluster that can run the job) on which it would finish first once drained
            best = None
            for c in hosts:
                opt = self.agents[c].drain_option(pod)
                if opt is not None:
                    finish = max(opt[1], now_h) + d[r, c]
                    if best is None or finish < best[0]:
                        best = (finish, int(c))
            if best is not None:
                held[pod.pod_id] = self.agents[best[1]].reserve(pod)
        return held

    def held_capacity(self, now_h: int, hours: int) -> np.ndarray:
        """(3, hours, C) GPU-milli, CPU and memory that reserved nodes hold back from the capacity view until they
        drain (what is free on them now; the agents refuse other jobs there unless they end by then)."""
        held = np.zeros((3, hours, len(self.agents)), dtype=np.int64)
        for c, agent in enumerate(self.agents):
            cl = agent.cluster
            for node, (_, drained_h) in agent.reserved.items():
                span = int(np.clip(drained_h - now_h, 0, hours))
                if span:
                    held[:, :span, c] += np.array(
                        [cl.gpu_free[node].sum(), cl.cpu_free[node], cl.mem_free[node]], dtype=np.int64
                    )[:, None]
        return held

    def plan(self, now, idx=None) -> Plan:
        out = self.plan_outcome(now, idx)
        if out is None:
            return Plan(plan_time=utc(now).floor("h"), policy=self.policy.name, forecast_version=None)
        return out.to_plan()


def _column(jobs: pd.DataFrame, name: str, default, dtype) -> np.ndarray:
    """A numeric column of the job frame, `default` where the frame has none or a value is missing."""
    if name not in jobs.columns:
        return np.full(len(jobs), default, dtype=dtype)
    return pd.to_numeric(jobs[name], errors="coerce").fillna(default).to_numpy(dtype)


def plan_hour(
    plan_time,
    jobs: pd.DataFrame,
    *,
    fleet=None,
    policy: str | PlacementPolicy = DEFAULT_POLICY,
    forecasts: str | ForecastProvider = "auto",
    running: pd.DataFrame | None = None,
    weights: PriorityWeights | None = None,
    grid: GridSeries | None = None,
    grid_source: str = "auto",
    explain: bool = True,
    data_dir=None,
    db_path=None,
    seed: int = 0,
) -> Plan:
    """One plan at `plan_time` for the pending `jobs` (scheduling.domain.jobs.JOB_COLUMNS).

    `running` (optional): jobs already running, columns job_id, cluster, gpu_milli (per device), num_gpu,
    end_time, and optionally node + gpu_devices (then they are bound on the agents' nodes too). `fleet` default:
    scheduling/domain/fleet.yaml restricted to the zones with grid data at plan_time."""
    plan_time = utc(plan_time).floor("h")
    if fleet is None:
        fleet = load_fleet()
        fleet = fleet.select([r for r, z in zip(fleet.cluster_regions, fleet.cluster_zones) if z != "GB"] or None)
    zones = fleet.zones
    if isinstance(forecasts, str):
        if grid is None:
            grid = GridSeries.load(
                zones,
                plan_time,
                plan_time + pd.Timedelta(days=15),
                source=grid_source,
                data_dir=data_dir,
                db_path=db_path,
            )
        forecasts = make_forecasts(
            forecasts,
            grid,
            zones,
            start=plan_time,
            end=plan_time + pd.Timedelta(days=15),
            db_path=db_path,
            data_dir=data_dir,
        )
    jobs = jobs.reset_index(drop=True)
    hp = HourlyPlanner(fleet, jobs, policy, forecasts, explain=explain, weights=weights, data_dir=data_dir, seed=seed)
    if running is not None and len(running):
        apply_running(hp, running, plan_time)
    idx = np.flatnonzero(hp.table.submit_h <= abs_hours(plan_time))
    return hp.plan(plan_time, idx)


def apply_running(hp: HourlyPlanner, running: pd.DataFrame, plan_time) -> pd.DataFrame:
    """Commit running jobs' resources until their end hour (and bind them on nodes where given). A job on a node the
    plan no longer counts (`off_fleet_running`: drained, or gone from the fleet file) takes none of the cluster's
    capacity: that node's capacity is not in it. A job whose devices no longer fit its node as the file now
    declares it holds the cluster's capacity without a binding. Returns the jobs not bound (`off_fleet_running`'s
    columns; node_state `drained`, `removed` or `not_fitting`)."""
    names = {n: i for i, n in enumerate(hp.fleet.names)}
    off = off_fleet_running(hp.fleet, running)
    skip = set(off["job_id"])
    unbound = [off]
    known = [set(agent.cluster.names) for agent in hp.agents]
    for r in running.itertuples(index=False):
        c = names.get(r.cluster)
        if c is None:
            raise ValueError(f"running job {r.job_id}: unknown cluster {r.cluster!r}")
        if r.job_id in skip:
            continue
        end_h = int(np.ceil(utc(r.end_time).value / 3.6e12))
        cpu, mem = int(getattr(r, "cpu_milli", 0) or 0), int(getattr(r, "memory_mib", 0) or 0)
        g = int(r.num_gpu) * int(r.gpu_milli)
        hp.external.append((c, end_h, (g, cpu, mem)))
        node = node_name(known[c], r.cluster, getattr(r, "node", None))
        if node is not None:
            agent = hp.agents[c]
            devs = getattr(r, "gpu_devices", "") or ""
            gpus = tuple(int(x) for x in str(devs).split(",") if x != "")
            pod = Pod(str(r.job_id), cpu, mem, int(r.num_gpu), int(r.gpu_milli))
            try:
                agent.cluster.allocate(pod, agent.cluster.node_index(node), gpus)
            except ValueError as exc:
                reason = f"its devices do not fit the node as the fleet file declares it ({exc})"
                unbound.append(_off_rows([r], "not_fitting", reason))
                continue
            agent.end_hour[pod.pod_id] = end_h
    return pd.concat(unbound, ignore_index=True) if len(unbound) > 1 else off


OFF_FLEET_COLUMNS = ["job_id", "cluster", "node", "gpu_devices", "end_time", "node_state", "reason"]


def off_fleet_running(fleet, running: pd.DataFrame) -> pd.DataFrame:
    """The running jobs of `running` (on the fleet's clusters) whose node the fleet does not plan on: one drained
    (`FleetCluster.drained`: node_state `drained`) or one the fleet file no longer lists (`removed`). Such a job
    runs on until it ends, on a node that takes no new job; the plan reports it (OFF_FLEET_COLUMNS)."""
    if running is None or not len(running) or "node" not in running.columns:
        return pd.DataFrame(columns=OFF_FLEET_COLUMNS)
    clusters = {c.name: c for c in fleet.clusters}
    known = {c.name: set(c.nodes["sn"].astype(str)).difference(c.drained) for c in fleet.clusters}
    frames, removed = [], []
    for r in running.itertuples(index=False):
        node, cluster = getattr(r, "node", None), clusters.get(r.cluster)
        if cluster is None or not isinstance(node, str) or not node or node_name(known[cluster.name], r.cluster, node):
            continue
        drained = node_name(cluster.drained, r.cluster, node)
        if drained is None:
            removed.append(r)
        else:
            frames.append(_off_rows([r], "drained", f"the node is drained ({cluster.drained[drained]})"))
    frames.append(_off_rows(removed, "removed", "the node is not in the fleet file"))
    return pd.concat(frames, ignore_index=True)


def node_name(names, cluster: str, node) -> str | None:
    """The name among `names` (a cluster's node names) of a node an executor reports: as reported, or without the
    `<cluster>/` prefix the schedule files give it; None when there is no such node."""
    if not isinstance(node, str) or not node:
        return None
    if node in names:
        return node
    bare = node.removeprefix(f"{cluster}/")
    return bare if bare in names else None


def _off_rows(rows: list, state: str, reason: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            (str(r.job_id), r.cluster, r.node, getattr(r, "gpu_devices", "") or "", r.end_time, state, reason)
            for r in rows
        ],
        columns=OFF_FLEET_COLUMNS,
    )


def report_off_fleet(off: pd.DataFrame | None, plan_time, info: dict, moving=frozenset()) -> None:
    """Warn of the running jobs a plan did not bind to a node (`apply_running`, `off_fleet_running`), one warning
    and one `info["running_off_fleet"]` entry per node (cluster, node, node_state, jobs, moving, reason): they run on
    until they end, except those of `moving` (preempted at a checkpoint to move, `pausing`), and no new job starts
    on a drained or removed node."""
    info["running_off_fleet"] = []
    if off is None or off.empty:
        return
    for (cluster, node, state), rows in off.groupby(["cluster", "node", "node_state"], sort=True):
        jobs = sorted(rows["job_id"])
        moved = [j for j in jobs if j in moving]
        entry = {"cluster": cluster, "node": node, "node_state": state, "jobs": jobs, "moving": moved,
                 "reason": rows["reason"].iloc[0]}  # fmt: skip
        info["running_off_fleet"].append(entry)
        staying = [j for j in jobs if j not in moving]
        what = [f"running job(s) {', '.join(staying)} keep it until they end"] if staying else []
        what += [f"job(s) {', '.join(moved)} are preempted at a checkpoint and move"] if moved else []
        log.warning(
            "plan %s: node %s of cluster %s: %s; %s; no new job starts there",
            utc(plan_time).isoformat(),
            node,
            cluster,
            entry["reason"],
            "; ".join(what),
        )
