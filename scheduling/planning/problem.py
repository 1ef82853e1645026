"""The numeric planning problem: `PlanningProblem` (what every placement policy plans), its options
(`PriorityWeights`) and the static per-job arrays (`JobTable`) it is sliced from.

A `JobTable` is computed once for a job set and a fleet: run time per power option and cluster (predictor speeds
x power-limit time factors), draw in kW incl. PUE, which clusters can host the job, transfer energy when it runs
outside its home region. `JobTable.problem(now, idx, free, forecast, ...)` slices it for the jobs pending at one
planning hour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from scheduling.domain.execution import DEFAULT_CHECKPOINT_MIN, run_wall_h
from scheduling.domain.jobs import SpeedModel, hostable
from scheduling.planning.power_options import PowerTable, load_power_table, option_arrays

HOUR_NS = 3_600_000_000_000


@dataclass(frozen=True)
class PriorityWeights:
    """P = urgency*U + flexibility*F + opportunity*O (defaults 0.35, 0.40, 0.25).

    U = (deadline - now) / duration, F = flexibility (fraction), O = (C_max - C_min) / C_max over the job's window.
    A high P means a job with slack, flexibility and a clean window ahead: it can wait for (or move to) low-carbon
    hours, whereas a low-P job has few candidates. `order="ascending"` (default) plans low P first, so the jobs
    with the fewest options take their capacity before the flexible ones fill the clean hours; "descending"
    applies the formula literally (high P first)."""

    urgency: float = 0.35
    flexibility: float = 0.40
    opportunity: float = 0.25
    order: str = "ascending"

    def __post_init__(self) -> None:
        if self.order not in ("ascending", "descending"):
            raise ValueError(f"order must be ascending or descending, not {self.order!r}")

    def as_dict(self) -> dict:
        return {
            "urgency": self.urgency,
            "flexibility": self.flexibility,
            "opportunity": self.opportunity,
            "order": self.order,
        }


@dataclass
class PlanningProblem:
    """Everything numeric one plan needs; hour indices are relative to `now` (0 = the planning hour).

    Shapes: N jobs, K power options, H hours, C clusters.

    * `forecast` (H, C) gCO2e/kWh of each cluster's zone (the forecast known at `now`); `renewable` (H, C) or None.
    * `free` (H, C) int64 GPU-milli free per cluster and hour (capacity minus running/committed jobs);
      `free_other` (R, H, C) the same for CPU milli-cores and memory MiB, `req_other` (N, R) the requests
      (aggregate per cluster: node-level fit is the agents' job).
    * `release` (N,) earliest start hour (>= 0); `deadline_rel` (N,) deadline in hours from now (float).
    * `gpu_total` (N,) GPU-milli a job occupies (num_gpu x gpu_milli).
    * `dur` (N, K, C) run time in hours per power option and cluster (inf where the option does not exist);
      `kw` (N, K, C) the job's draw in kW incl. PUE; `limit_w` (K, C) the per-GPU power limit of an option.
    * `allowed` (N, C) the cluster can host the job (GPU model constraint and node shape).
    * `transfer_kwh` (N, C) network energy if the job runs on that cluster (0 in its home region); `home` (N,)
      home cluster index (-1: not in this fleet).
    * `speed` (N, C) or None: the speed behind `dur` (relative to a V100 at the default limit), recorded with each
      assignment for runtime feedback.
    """

    now: pd.Timestamp
    hours: int
    clusters: list[str]
    regions: list[str]
    zones: list[str]
    gpu_models: list[str]
    capacity: np.ndarray
    forecast: np.ndarray
    free: np.ndarray
    jobs: pd.DataFrame
    release: np.ndarray
    deadline_rel: np.ndarray
    gpu_total: np.ndarray
    dur: np.ndarray
    kw: np.ndarray
    limit_w: np.ndarray
    allowed: np.ndarray
    transfer_kwh: np.ndarray
    home: np.ndarray
    forecast_version: str = "unknown"
    renewable: np.ndarray | None = None
    free_other: np.ndarray | None = None  # (R, H, C) free CPU milli-cores and memory MiB (None: not tracked)
    req_other: np.ndarray | None = None  # (N, R) the jobs' CPU and memory requests
    capacity_price: np.ndarray | None = None  # (H, C) kgCO2e per GPU-milli-hour a job's window is charged
    expected: PlanningProblem | None = None  # jobs expected to arrive (rolling-lp plans their capacity only)
    release_c: np.ndarray | None = None  # (N, C) earliest start per cluster (None: `release` everywhere)
    postpone_margin_h: float = 0.0  # a start after now must leave this many hours before the latest start
    pods: list | None = None  # scheduling.packing.Pod per job (built lazily by the agents)
    # running checkpointing jobs that may be preempted now (job id -> what evicting it costs: GPU-milli x hours of
    # work left); None or empty: no preemption
    evictable: dict | None = None
    speed: np.ndarray | None = None  # (N, C) speed relative to a V100 at the default limit (None: not recorded)
    # a power option below the default limit starts only where its run time x `option_margin` still ends by the
    # job's deadline, which lies `deadline_spare` (N,) hours after `deadline_rel` (the reserve the plan keeps)
    option_margin: float = 1.0
    deadline_spare: np.ndarray | None = None
    # likewise at the default limit on a cluster slower than the job's fastest, with `cluster_margin`
    cluster_margin: float = 1.0
    # (N, C) the whole job's run time at the default limit (None: `dur`'s), where `dur` holds only what a resumed
    # job has left: the run-now counterfactual runs the whole job
    run_now_dur: np.ndarray | None = None

    @property
    def n_jobs(self) -> int:
        return int(len(self.release))

    @property
    def n_options(self) -> int:
        return int(self.dur.shape[1])

    @property
    def n_clusters(self) -> int:
        return len(self.clusters)

    def ref_duration(self) -> np.ndarray:
        """(N,) the job's duration for the priority's urgency: on its home cluster at the default limit (the
        fastest allowed cluster when the home cluster is not in the fleet)."""
        d0 = np.where(self.allowed, self.dur[:, 0, :], np.inf)
        fastest = d0.min(axis=1)
        idx = np.arange(self.n_jobs)
        home = np.where(self.home >= 0, self.dur[idx, 0, np.maximum(self.home, 0)], fastest)
        return np.where(np.isfinite(home), home, fastest)


def abs_hours(ts) -> np.ndarray | int:
    """Hours since the Unix epoch (int64) of UTC timestamps (scalar or array-like)."""
    if isinstance(ts, (pd.Series, pd.Index, np.ndarray, list)):
        vals = pd.to_datetime(pd.Series(ts), utc=True).dt.as_unit("ns").astype("int64").to_numpy()
        return vals // HOUR_NS
    return int(pd.Timestamp(ts).as_unit("ns").value // HOUR_NS)


def abs_hours_float(ts) -> np.ndarray:
    vals = pd.to_datetime(pd.Series(ts), utc=True).dt.as_unit("ns").astype("int64").to_numpy()
    return vals / HOUR_NS


def hour_ts(h: int) -> pd.Timestamp:
    return pd.Timestamp(int(h) * HOUR_NS, tz="UTC")


class JobTable:
    """Per-job static arrays over the fleet. Shapes: N jobs, K power options (1 when not power-aware),
    C clusters.

    `deadline_reserve` (fraction, default 0): plan every job to end that share of its fastest run time before its
    deadline (never less spare than it had: a job without room for it keeps its deadline), so that a run longer
    than its estimate still ends in time; `deadline_h` is that planning deadline.

    `option_margin` (>= 1, default 1): a power option below the default limit is offered to a job only where its
    run time times `option_margin` fits between the job's submission and its deadline, and starts only where it
    still fits between the start and the deadline (`Evaluator.latest_all`), so that a job with little spare is
    never slowed into a miss by a run that outlasts its estimate (the loop passes the run-time error's high
    quantile; the simulator's runs are exact). `cluster_margin` (>= 1, default 1): likewise at the default limit
    on a cluster slower than the job's fastest (the loop passes a milder quantile: forbidding slower clusters to
    tight jobs at p99 gave up nearly all of the saving)."""

    def __init__(
        self,
        jobs: pd.DataFrame,
        fleet,
        speed_model: SpeedModel | None = None,
        power_table: PowerTable | None = None,
        data_dir=None,
        deadline_reserve: float = 0.0,
        option_margin: float = 1.0,
        cluster_margin: float = 1.0,
    ):
        if not 0 <= deadline_reserve < 1:
            raise ValueError(f"deadline_reserve must be in [0, 1), got {deadline_reserve!r}")
        if not option_margin >= 1.0:
            raise ValueError(f"option_margin must be >= 1, got {option_margin!r}")
        if not cluster_margin >= 1.0:
            raise ValueError(f"cluster_margin must be >= 1, got {cluster_margin!r}")
        self.jobs = jobs.reset_index(drop=True)
        self.fleet = fleet
        self.speed_model = speed_model or SpeedModel(data_dir)
        self.power_table = power_table or load_power_table(fleet, data_dir=data_dir)
        n, C = len(self.jobs), len(fleet)
        # (N, C) speed relative to a V100 and run time at the default limit (`scheduling.domain.jobs.durations`)
        self.speed = self.speed_model.matrix(self.jobs["job_type"], fleet)
        base = self.jobs["duration_h_ref"].to_numpy(float)[:, None] / np.maximum(self.speed, 1e-6)
        tf, pw, lw = option_arrays(fleet, self.power_table, power_aware=True)
        self.K = tf.shape[0]
        self.base_dur = base
        self.dur = base[:, None, :] * tf[None, :, :]  # (N, K, C), inf where a cluster has fewer options
        share = self.jobs["num_gpu"].to_numpy(float) * self.jobs["gpu_milli"].to_numpy(float) / 1000.0
        self.kw = share[:, None, None] * pw[None, :, :] / 1000.0 * fleet.pue[None, None, :]
        self.limit_w = lw
        self.allowed = hostable(self.jobs, fleet)
        self.gpu_total = self.jobs["num_gpu"].to_numpy(np.int64) * self.jobs["gpu_milli"].to_numpy(np.int64)
        self.req_other = np.stack(
            [self.jobs["cpu_milli"].to_numpy(np.int64), self.jobs["memory_mib"].to_numpy(np.int64)], axis=1
        )  # (N, 2)
        self.requests = np.concatenate([self.gpu_total[:, None], self.req_other], axis=1)  # (N, 3)
        # hours to write (and to restore) a checkpoint: what each preemption costs the job, twice
        minutes = self.jobs.get("checkpoint_overhead_min")
        minutes = np.full(n, DEFAULT_CHECKPOINT_MIN) if minutes is None else minutes.to_numpy(float)
        self.checkpoint_h = np.where(np.isfinite(minutes), minutes, DEFAULT_CHECKPOINT_MIN) / 60.0
        names = {nm: i for i, nm in enumerate(fleet.names)}
        regions = np.array(fleet.cluster_regions, dtype=object)
        home = np.array([names.get(h, -1) for h in self.jobs["home_cluster"]], dtype=np.int64)
        home_region = self.jobs["home_region"].to_numpy(object)
        for i in np.flatnonzero(home < 0):  # home cluster not in this fleet: any cluster of the home region
            hits = np.flatnonzero(regions == home_region[i])
            if len(hits):
                home[i] = hits[0]
        self.home = home
        moves = regions[None, :] != home_region[:, None]
        self.transfer_kwh = np.where(
            moves, self.jobs["data_gb"].to_numpy(float)[:, None] * fleet.transfer_kwh_per_gb, 0.0
        )
        self.submit_h = abs_hours(self.jobs["submit_time"])
        self.deadline_h = abs_hours_float(self.jobs["deadline"])
        if option_margin > 1.0 and n:
            spare = (self.deadline_h - abs_hours_float(self.jobs["submit_time"]))[:, None, None]
            risky = self.dur * option_margin > spare
            risky[:, 0, :] = False  # the default limit is always offered
            self.dur = np.where(risky, np.inf, self.dur)
        self.option_margin = float(option_margin)
        self.cluster_margin = float(cluster_margin)
        self.deadline_spare = np.zeros(n)
        if deadline_reserve > 0:
            fastest = np.where(self.allowed, base, np.inf).min(axis=1)
            fastest = np.where(np.isfinite(fastest), fastest, 0.0)
            spare = np.maximum(self.deadline_h - self.submit_h - fastest, 0.0)
            self.deadline_spare = np.minimum(deadline_reserve * fastest, spare)
            self.deadline_h = self.deadline_h - self.deadline_spare
        self.n = n
        self.C = C

    def problem(
        self,
        now,
        idx,
        free: np.ndarray,
        forecast: np.ndarray,
        *,
        power_aware: bool = True,
        forecast_version: str = "unknown",
        renewable: np.ndarray | None = None,
        release: np.ndarray | None = None,
        work_left: np.ndarray | None = None,
    ) -> PlanningProblem:
        """The problem for jobs `idx` at hour `now`: `forecast` is (H, C) over the plan horizon; `free` is (H, C)
        free GPU-milli, or (3, H, C) free GPU-milli, CPU milli-cores and memory MiB. `work_left` (per job of
        `idx`, default 1): the share of each job's work still to do (a preempted job resumes from its checkpoint):
        its run times are the restore of the checkpoint and the work left (`execution.run_wall_h`)."""
        now = pd.Timestamp(now)
        now_h = abs_hours(now)
        idx = np.asarray(idx, dtype=np.int64)
        K = self.K if power_aware else 1
        H = int(forecast.shape[0])
        if release is None:
            release = np.maximum(self.submit_h[idx] - now_h, 0)
        jobs = self.jobs.iloc[idx].reset_index(drop=True)
        dur = self.dur[idx, :K]
        if work_left is not None:
            done = 1.0 - np.asarray(work_left, dtype=float)[:, None, None]
            dur = run_wall_h(dur, done, self.checkpoint_h[idx][:, None, None])
        free = np.asarray(free, dtype=np.int64)
        free_other = None
        if free.ndim == 3:
            free, free_other = free[0], free[1:]
        return PlanningProblem(
            now=now,
            hours=H,
            clusters=list(self.fleet.names),
            regions=list(self.fleet.cluster_regions),
            zones=list(self.fleet.cluster_zones),
            gpu_models=[c.config.gpu_model for c in self.fleet.clusters],
            capacity=self.fleet.capacity_milli,
            forecast=np.asarray(forecast, dtype=float),
            free=np.asarray(free, dtype=np.int64),
            jobs=jobs,
            release=np.asarray(release, dtype=np.int64),
            deadline_rel=self.deadline_h[idx] - now_h,
            gpu_total=self.gpu_total[idx],
            dur=dur,
            kw=self.kw[idx, :K],
            limit_w=self.limit_w[:K],
            allowed=self.allowed[idx],
            transfer_kwh=self.transfer_kwh[idx],
            home=self.home[idx],
            forecast_version=forecast_version,
            renewable=renewable,
            free_other=free_other,
            req_other=self.req_other[idx] if free_other is not None else None,
            speed=self.speed[idx],
            option_margin=self.option_margin,
            cluster_margin=self.cluster_margin,
            deadline_spare=self.deadline_spare[idx],
            run_now_dur=self.dur[idx, 0] if work_left is not None else None,
        )


def horizon_for(
    table: JobTable, idx, now_h: int, min_hours: int = 24, max_hours: int = 336, slack_hours: int = 24
) -> int:
    """Plan horizon: up to the latest deadline of the jobs (or the longest run time from now plus
    `slack_hours` for late jobs), within [min_hours, max_hours]."""
    idx = np.asarray(idx, dtype=np.int64)
    if not len(idx):
        return min_hours
    d = np.where(np.isfinite(table.dur[idx]), table.dur[idx], 0).max(axis=(1, 2))
    rel = np.maximum(table.submit_h[idx] - now_h, 0)
    need = np.maximum(table.deadline_h[idx] - now_h, rel + d + slack_hours)
    return int(np.clip(np.ceil(need.max()), min_hours, max_hours))
