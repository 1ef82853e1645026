"""Trace-driven simulator: replays a job trace over a historical grid period hour by hour.

Each hour t: jobs that finished free their nodes; the policy plans every pending job (submitted, not started) from
the forecast known at t (`forecast.*`, DACF published, or seasonal naive: `scheduling.planning.forecasts`); the jobs
it starts at t are packed onto nodes by the cluster agents (FGD) and run to completion (non-preemptive) -- their
carbon is then computed from the *actual* intensity of the hours they run. Future starts are only tentative and
are planned again the next hour. The offline optimum (LP relaxation, perfect knowledge of intensity and of all
jobs) bounds what any policy can reach.

    from scheduling.evaluation.simulator import build_scenario, simulate, evaluate
    sc = build_scenario(start="2021-07-01", days=14, n_jobs=1000, regions=6, load=0.5)
    res = simulate(sc, "priority")                # SimResult: per-job records + metrics
    report = evaluate(sc)                          # every policy + the bound, JSON-ready dict

Metrics (per policy): kgCO2e (actual intensity; job energy = the job's share of its GPUs x average board power at
its power limit x run time x PUE, plus data transfer when it moved), reduction against performance-first, share
of the optimum's reduction captured ((perf - policy) / (perf - optimum)), deadline satisfaction (finished by the
deadline), mean delay (start - submission, hours), unallocated GPUs (fleet GPUs not allocated, mean over the
period's hours), utilisation, energy (kWh), renewable share of the energy used (sum energy x the region's
renewable share that hour / sum energy).
"""
from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduling.domain.fleet import Fleet, load_fleet
from scheduling.domain.jobs import SpeedModel, generate_jobs
from scheduling.planning.agents import default_workload, job_pods
from scheduling.planning.forecasts import BACKTEST, SIGNAL, ForecastProvider, GridSeries, make_forecasts, utc
from scheduling.planning.policies.base import ONLINE_POLICIES, PlacementPolicy, make_policy
from scheduling.planning.power_options import load_power_table
from scheduling.planning.problem import JobTable, abs_hours
from scheduling.planning.session import HourlyPlanner
from scheduling.domain.plan import PriorityWeights
from scheduling.evaluation.ablations import PERFECT_ARRIVALS_H, ClairvoyantArrivals, ReplayPlan

HOUR = pd.Timedelta(hours=1)
BASELINE = "performance-first"
DEFAULT_TAIL_DAYS = 10  # simulated hours after the last arrival, for the last jobs to start and finish


@dataclass
class Scenario:
    start: pd.Timestamp
    hours: int  # arrival window (the period)
    fleet: Fleet
    jobs: pd.DataFrame
    table: JobTable
    grid: GridSeries
    forecasts: ForecastProvider
    load: float | None
    config: dict = field(default_factory=dict)
    workload: object = None
    tail_hours: int = DEFAULT_TAIL_DAYS * 24

    @property
    def zone_col(self) -> np.ndarray:
        pos = {z: i for i, z in enumerate(self.grid.zones)}
        return np.array([pos[z] for z in self.fleet.cluster_zones], dtype=np.int64)

    def actual(self, what: str = "ci") -> tuple[int, np.ndarray]:
        """(first absolute hour, (T, C) actual values per cluster) over the grid axis."""
        arr = self.grid.ci if what == "ci" else self.grid.renewable
        return abs_hours(self.grid.t0), arr[:, self.zone_col]


def demand_gpu_hours(jobs: pd.DataFrame, table: JobTable, on: str = "fleet") -> float:
    """GPU-hours the jobs need at the default power limit: `on="fleet"` (default, the fleet sizing) the run time
    on a GPU of the fleet drawn in proportion to the clusters' sizes among those that can host the job -- where a
    busy fleet puts its work, slow GPUs included; `"fastest"` on the fastest cluster that can host each job (the
    least work the trace can be done with); `"home"` on the home clusters."""
    idx = np.arange(table.n)
    if on == "home":
        d = table.base_dur[idx, np.maximum(table.home, 0)]
    elif on == "fleet":
        w = table.allowed * np.array([c.config.weight for c in table.fleet.clusters], dtype=float)[None, :]
        w = w / np.maximum(w.sum(axis=1, keepdims=True), 1e-12)
        d = (w * np.where(table.allowed, table.base_dur, 0.0)).sum(axis=1)
    else:
        d = np.where(table.allowed, table.base_dur, np.inf).min(axis=1)
        d = np.where(np.isfinite(d), d, table.base_dur[idx, np.maximum(table.home, 0)])
    share = jobs["num_gpu"].to_numpy(float) * jobs["gpu_milli"].to_numpy(float) / 1000.0
    return float((share * d).sum())


def build_scenario(start="2021-07-01", days: float = 14, n_jobs: int = 1000, regions=6, load: float | None = 0.5,
                   seed: int = 0, forecasts: str = "auto", fleet_path=None, data_dir=None, pod_list: str = "default",
                   max_duration_h: float = 48.0, grid_source: str = "auto", db_path=None,
                   forecast_model: str | None = None, forecast_version: str | None = BACKTEST,
                   tail_days: int = DEFAULT_TAIL_DAYS,
                   packing: str = "fgd", calibrate: int = 0) -> Scenario:
    """Fleet, job trace, grid actuals and the forecast provider for one evaluation.

    Fleet size: with `load` set, the clusters are re-sized (in proportion to their weights, whole nodes) so that
    the offered load -- the jobs' GPU-hours on a GPU drawn in proportion to the clusters that can host each job,
    over the fleet's GPU-hours of the period -- is `load`; the job trace is then drawn again (same seed, same
    draws) on the re-sized fleet so that home clusters and deadlines refer to clusters that exist. With
    `calibrate` > 0 the fleet is re-sized up to that many times by (GPU-hours performance-first runs the jobs
    with / fleet GPU-hours) / `load` (`placed_load` of its metrics). The measured utilisation (mean GPU allocation inside the
    period) is reported beside it: lower, since the fleet starts empty and jobs arriving late run after the
    period. `load=None` keeps the configured sizes. `forecast_version`: which model_version of the stored forecasts
    (`make_forecasts`; default: the stored backtest where there is one, else every version)."""
    start = utc(start).floor("h")
    hours = int(round(days * 24))
    fleet = load_fleet(fleet_path, regions=regions, data_dir=data_dir)
    speed = SpeedModel(data_dir)
    jobs = generate_jobs(n_jobs, start, hours, fleet, seed=seed, data_dir=data_dir, pod_list=pod_list,
                         max_duration_h=max_duration_h, speed_model=speed)
    power = load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=start)
    table = JobTable(jobs, fleet, speed, power)
    if load is not None:
        need = demand_gpu_hours(jobs, table) / (load * hours)
        fleet = fleet.scaled(need)
        # The same draws again on the re-sized fleet: home cluster, home run time and so the deadline must refer
        # to clusters that exist (and can host the job) in the fleet the jobs run on. Before, they referred to
        # the configured fleet's node shapes, and some jobs could not meet their deadline anywhere.
        jobs = generate_jobs(n_jobs, start, hours, fleet, seed=seed, data_dir=data_dir, pod_list=pod_list,
                             max_duration_h=max_duration_h, speed_model=speed)
        power = load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=start)
        table = JobTable(jobs, fleet, speed, power)
    end = start + (hours + tail_days * 24 + 24 * 8) * HOUR
    grid = GridSeries.load(fleet.zones, start, end, source=grid_source, data_dir=data_dir, db_path=db_path)
    if grid.t0 > start - 24 * HOUR:
        raise ValueError(f"grid data starts {grid.t0}: the naive forecast at {start} needs the day before")
    provider = make_forecasts(forecasts, grid, fleet.zones, start=start, end=end, db_path=db_path,
                              data_dir=data_dir, model=forecast_model, version=forecast_version)
    workload = default_workload(job_pods(jobs))
    calibration = []
    if load is not None:
        target_gpus = float(fleet.total_gpus)
        for _ in range(int(calibrate)):
            probe = Scenario(start, hours, fleet, jobs, table, grid, provider, load, {}, workload, tail_days * 24)
            res = simulate(probe, BASELINE)
            # The work as performance-first places it (slow GPUs included), over the fleet's GPU-hours of the
            # period: the utilisation the fleet has if it keeps up. The allocation measured inside the period is
            # no target: it saturates below 1 (packing) when the fleet cannot keep up and the queue grows.
            placed = res.metrics["placed_load"]
            calibration.append({"gpus": fleet.total_gpus, "placed_load": round(placed, 4),
                                "utilization": round(res.metrics["utilization"], 4),
                                "deadline_satisfaction": round(res.metrics["deadline_satisfaction"], 4)})
            if abs(placed - load) < 0.02 or placed <= 0:
                break
            target_gpus = target_gpus * placed / load
            fleet = fleet.scaled(target_gpus)
            jobs = generate_jobs(n_jobs, start, hours, fleet, seed=seed, data_dir=data_dir, pod_list=pod_list,
                                 max_duration_h=max_duration_h, speed_model=speed)
            workload = default_workload(job_pods(jobs))
            table = JobTable(jobs, fleet, speed, power)
    config = {"start": start.isoformat(), "days": days, "n_jobs": int(len(jobs)), "n_jobs_requested": n_jobs,
              "regions": list(dict.fromkeys(fleet.cluster_regions)), "zones": fleet.zones, "load_target": load,
              "seed": seed, "pod_list": pod_list, "max_duration_h": max_duration_h, "packing": packing,
              "forecasts_requested": forecasts, "forecast_version_requested": forecast_version,
              "grid_source": grid.source,
              "fleet_file": fleet.source_path, "power_options": power.source, "speed_source": speed.source,
              "jobs_dropped": int(jobs.attrs.get("dropped", 0)) + int(jobs.attrs.get("dropped_after_scaling", 0)),
              "load_calibration": calibration, "load_definition": (
                  "GPU-hours of the jobs as performance-first runs them / fleet GPU-hours of the period"
                  if calibration else "GPU-hours on a GPU drawn in proportion to the clusters that can host each "
                  "job / fleet GPU-hours of the period"),
              "offered_load": round(demand_gpu_hours(jobs, table) / (fleet.total_gpus * hours), 4),
              "demand_gpu_hours_fleet": round(demand_gpu_hours(jobs, table), 1),
              "demand_gpu_hours_fastest": round(demand_gpu_hours(jobs, table, on="fastest"), 1)}
    return Scenario(start, hours, fleet, jobs, table, grid, provider, load, config, workload, tail_days * 24)


# ---------------------------------------------------------------------------------------------------- results
@dataclass
class SimResult:
    policy: str
    records: pd.DataFrame  # one row per job
    metrics: dict
    hourly_alloc: np.ndarray  # (hours of the period, C) GPU-milli allocated


def _window_sums(values: np.ndarray, t0: int, start_h: np.ndarray, dur: np.ndarray, col: np.ndarray) -> np.ndarray:
    """Sum over [start, start + dur) (fractional last hour) of values[:, col] (hour axis from t0)."""
    T = values.shape[0]
    S = np.zeros((T + 1, values.shape[1]))
    np.cumsum(values, axis=0, out=S[1:])
    a = start_h - t0
    whole = np.floor(dur + 1e-9).astype(np.int64)
    frac = dur - whole
    frac[frac < 1e-9] = 0.0
    b = a + whole
    if (a < 0).any() or (b >= T).any():
        raise ValueError("a job runs outside the grid data; load a longer period")
    return S[b, col] - S[a, col] + frac * values[b, col]


def execute(sc: Scenario, start_h: np.ndarray, k: np.ndarray, c: np.ndarray, work: np.ndarray | None = None,
            preempted: list | None = None) -> dict[str, np.ndarray]:
    """Actual carbon, energy and renewable energy of jobs started at absolute hours `start_h` on clusters `c`
    with power option `k` (arrays over all jobs; -1 = never started) and run to the end of `work` (share of the
    job's work left at that start, default 1), plus the runs that ended in a preemption (`preempted`: [(job, start
    hour, hours run, option, cluster)], in order). Data is transferred (and charged) when a run is on another
    cluster than the job's previous run (the first: its home cluster; no charge within the home region)."""
    tbl = sc.table
    n = tbl.n
    out = {"kg": np.zeros(n), "kwh": np.zeros(n), "renew_kwh": np.zeros(n), "dur_h": np.zeros(n)}
    runs = sorted(preempted or [], key=lambda r: (r[1], r[0]))
    idx = np.flatnonzero(start_h >= 0)
    job = np.array([r[0] for r in runs] + idx.tolist(), dtype=np.int64)
    if not len(job):
        return out
    ss = np.array([r[1] for r in runs] + start_h[idx].tolist(), dtype=np.int64)
    kk = np.array([r[3] for r in runs] + k[idx].tolist(), dtype=np.int64)
    cc = np.array([r[4] for r in runs] + c[idx].tolist(), dtype=np.int64)
    left = np.ones(len(idx)) if work is None else np.asarray(work, dtype=float)[idx]
    dur = np.concatenate([np.array([float(r[2]) for r in runs]), tbl.dur[idx, k[idx], c[idx]] * left])
    # the cluster each run comes from: the job's previous run (in time order), else home
    prev = np.where(tbl.home[job] >= 0, tbl.home[job], cc)
    seen: dict[int, int] = {}
    for i in np.argsort(ss, kind="stable"):
        j = int(job[i])
        if j in seen:
            prev[i] = seen[j]
        seen[j] = int(cc[i])
    t0, ci = sc.actual("ci")
    _, ren = sc.actual("renewable")
    kw = tbl.kw[job, kk, cc]
    tk = np.where(cc != prev, tbl.transfer_kwh[job, cc], 0.0)
    w_ci = _window_sums(ci, t0, ss, dur, cc)
    w_re = _window_sums(ren, t0, ss, dur, cc)
    ci_move = 0.5 * (ci[ss - t0, prev] + ci[ss - t0, cc])
    re_move = 0.5 * (ren[ss - t0, prev] + ren[ss - t0, cc])
    for key, vals in (("kg", (kw * w_ci + tk * ci_move) / 1000.0), ("kwh", kw * dur + tk),
                      ("renew_kwh", kw * w_re + tk * re_move), ("dur_h", dur)):
        out[key] = np.bincount(job, weights=vals, minlength=n)
    return out


def simulate(sc: Scenario, policy: str | PlacementPolicy = "priority", *, seed: int = 0,
             weights: PriorityWeights | None = None, progress=None, explain: bool = False,
             forecasts: ForecastProvider | None = None, postpone_margin_h: float = 1.0,
             reserve_nodes: bool = False) -> SimResult:
    """Replay the scenario's trace with one online policy (see module docstring). `postpone_margin_h`: a job
    may be postponed only to a start that leaves this many hours before its latest timely start."""
    t_run = time.perf_counter()
    tbl = sc.table
    n = tbl.n
    T0 = abs_hours(sc.start)
    T_arr = T0 + sc.hours
    T_max = T_arr + sc.tail_hours
    label = policy.name if isinstance(policy, PlacementPolicy) else policy
    if not isinstance(policy, PlacementPolicy):
        policy = make_policy(policy, seed=seed, weights=weights)
    hp = HourlyPlanner(sc.fleet, table=tbl, policy=policy,
                       forecasts=forecasts or sc.forecasts, workload=sc.workload, explain=explain, tentative=False,
                       seed=seed, postpone_margin_h=postpone_margin_h, reserve_nodes=reserve_nodes)
    C = len(sc.fleet)
    alloc = np.zeros((sc.hours, C), dtype=np.int64)
    free_parts = np.zeros((sc.hours, C, 3), dtype=np.int64)
    plan_s = []
    late_planned = 0
    for t in range(T0, T_max):
        now = pd.Timestamp(t * 3_600_000_000_000, tz="UTC")
        hp.release_finished(t)
        pend = hp.pending(t)
        if len(pend):
            t1 = time.perf_counter()
            out = hp.plan_outcome(now, pend)
            plan_s.append(time.perf_counter() - t1)
            late_planned += int(out.late[out.placed & (out.s == 0)].sum())
        if t < T_arr:
            alloc[t - T0] = [a.gpu_milli_allocated for a in hp.agents]
            free_parts[t - T0] = [a.free_breakdown() for a in hp.agents]
        if progress is not None:
            progress.update(1)
        if t >= T_arr and hp.started.all():
            break
    if progress is not None and t + 1 < T_max:
        progress.update(T_max - t - 1)
    work = 1.0 - hp.work_done
    ex = execute(sc, np.where(hp.started, hp.start_h, -1), hp.k, hp.c, work, hp.preempted_runs)
    jobs = sc.jobs
    submit_h = tbl.submit_h
    last_run = np.where(hp.started, tbl.dur[np.arange(n), np.maximum(hp.k, 0), np.maximum(hp.c, 0)] * work, 0.0)
    end_h = np.where(hp.started, hp.start_h + last_run, np.nan)
    first_h = np.where(hp.started, hp.first_start_h, 0)
    met = hp.started & (end_h <= tbl.deadline_h + 1e-6)
    records = pd.DataFrame({
        "job_id": jobs["job_id"], "started": hp.started,
        "start_time": pd.to_datetime(first_h * 3_600_000_000_000, utc=True),
        "cluster": np.where(hp.c >= 0, np.array(sc.fleet.names, dtype=object)[np.maximum(hp.c, 0)], None),
        "power_option": hp.k, "delay_h": np.where(hp.started, first_h - submit_h, np.nan),
        "duration_h": ex["dur_h"], "kgco2e": ex["kg"], "energy_kwh": ex["kwh"], "renewable_kwh": ex["renew_kwh"],
        "met_deadline": met, "node": hp.node, "preemptions": hp.preemptions,
    })
    cap = sc.fleet.capacity_milli
    metrics = {
        "kgco2e": float(ex["kg"].sum()),
        "energy_kwh": float(ex["kwh"].sum()),
        "renewable_share": float(ex["renew_kwh"].sum() / max(ex["kwh"].sum(), 1e-12)),
        "deadline_satisfaction": float(met.mean()) if n else 1.0,
        "mean_delay_h": float(np.nanmean(records["delay_h"])) if hp.started.any() else None,
        "unallocated_gpus": float(((cap[None, :] - alloc).sum(axis=1) / 1000.0).mean()),
        "utilization": float(alloc.sum() / (cap.sum() * sc.hours)),
        # GPU-hours as this policy ran the jobs (slow GPUs, power caps included) / fleet GPU-hours of the period
        "placed_load": float((tbl.gpu_total / 1000.0 * ex["dur_h"]).sum() / max(cap.sum() / 1000.0 * sc.hours,
                                                                                 1e-12)),
        "jobs_started": int(hp.started.sum()),
        "jobs_late": int((hp.started & ~met).sum()),
        "jobs_never_started": int((~hp.started).sum()),
        "agent_rejections": int(hp.rejections),
        "preemptions": int(hp.preemptions.sum()),
        "preempted_jobs": int((hp.preemptions > 0).sum()),
        "power_capped_jobs": int((hp.k > 0).sum()),
        "moved_jobs": int((hp.started & (hp.c != tbl.home)).sum()),
        "forecast_fallback_share": float(np.nanmean(hp.fallback_shares)) if hp.fallback_shares else None,
        "plans": len(plan_s),
        "plan_latency_ms_mean": float(1000 * np.mean(plan_s)) if plan_s else None,
        "plan_latency_ms_max": float(1000 * np.max(plan_s)) if plan_s else None,
        "runtime_s": round(time.perf_counter() - t_run, 2),
        "by_region_kgco2e": {r: float(v) for r, v in pd.Series(ex["kg"]).groupby(
            np.where(hp.c >= 0, np.array(sc.fleet.cluster_regions, dtype=object)[np.maximum(hp.c, 0)], "none")
        ).sum().items()},
        "by_cluster": by_cluster(sc, alloc, free_parts),
    }
    return SimResult(label, records, metrics, alloc)


def by_cluster(sc: Scenario, alloc: np.ndarray, free_parts: np.ndarray | None = None) -> dict:
    """Per cluster, means over the period's hours: the share of its GPUs allocated and, where the agents' state
    is known (`free_parts`), the free GPUs by kind: on whole free devices (`idle_gpus`), on partly used devices
    (`fragmented_gpus`: device shares only small jobs can use) and on standby nodes (`standby_idle_gpus`). With
    the mean actual intensity of the cluster's zone over the period, this shows where the clean capacity went."""
    cap = sc.fleet.capacity_milli.astype(float)
    t0, ci = sc.actual("ci")
    a = abs_hours(sc.start) - t0
    mean_ci = ci[a: a + sc.hours].mean(axis=0)
    out = {}
    for c, name in enumerate(sc.fleet.names):
        row = {"mean_intensity_g_per_kwh": float(mean_ci[c]), "gpus": float(cap[c] / 1000.0),
               "utilization": float(alloc[:, c].mean() / max(cap[c], 1.0))}
        if free_parts is not None:
            for i, key in enumerate(("idle_gpus", "fragmented_gpus", "standby_idle_gpus")):
                row[key] = float(free_parts[:, c, i].mean() / 1000.0)
        out[name] = row
    return out


# ---------------------------------------------------------------------------------------------------- optimum
def optimum_problem(sc: Scenario):
    """The bound's problem: every job of the trace known at the start, actual intensity, empty fleet."""
    tbl = sc.table
    T0 = abs_hours(sc.start)
    d = np.where(np.isfinite(tbl.dur), tbl.dur, 0).max(axis=(1, 2))
    H = int(np.ceil(max((tbl.deadline_h - T0).max(), (tbl.submit_h - T0 + d).max()) + 48))
    t0g, ci = sc.actual("ci")
    _, ren = sc.actual("renewable")
    a = T0 - t0g
    if a + H > ci.shape[0]:
        H = ci.shape[0] - a
    free = np.repeat(sc.fleet.resource_capacity[:, None, :], H, axis=1)  # (3, H, C)
    prob = tbl.problem(sc.start, np.arange(tbl.n), free, ci[a: a + H], power_aware=True,
                       forecast_version="actual (perfect knowledge)", renewable=ren[a: a + H],
                       release=np.maximum(tbl.submit_h - T0, 0))
    return prob


class BoundNotSolved(RuntimeError):
    """The bound's LP stopped before optimality (time limit, numerical trouble): its value bounds nothing."""


def _require_solved(name: str, result, time_limit_s: float, *, has_schedule: bool = False) -> None:
    """An LP that stopped early is no bound (HiGHS then returns no solution: it would read as 0 kg, and every
    policy's share as if measured against zero emissions). A time-limited MILP is accepted with a whole schedule
    (`has_schedule`). `result`: an LPResult or PreemptiveBound."""
    if result.status == "optimal" or has_schedule:
        return
    raise BoundNotSolved(
        f"{name}: HiGHS stopped with status {result.status!r} after {result.solve_s:.0f} s (time limit "
        f"{time_limit_s:.0f} s; {result.n_vars} variables): no bound. Give it more time (evaluate --lp-time-limit) "
        "or a quieter machine.")


def solve_optimum(sc: Scenario, time_limit_s: float = 600.0, integral: bool = False, per_job: bool = False) -> dict:
    """The bound (LP relaxation); `integral=True`: the same model with whole jobs (MILP, time-limited);
    `per_job=True`: also each job's carbon in the bound (array under `PER_JOB_KEY`, not JSON). Raises
    `BoundNotSolved` when the solver stops before it has a bound (LP) or a schedule (MILP)."""
    from scheduling.planning.lp import solve_lp

    t = time.perf_counter()
    prob = optimum_problem(sc)
    lp = solve_lp(prob, time_limit_s=time_limit_s, integral=integral)
    _require_solved("the optimum's " + ("MILP" if integral else "LP"), lp, time_limit_s,
                    has_schedule=integral and float(lp.x.sum() + lp.u.sum()) > 0.5)
    n = prob.n_jobs
    x, u = lp.x, lp.u
    late_delay = np.where(lp.late_start >= 0, lp.late_start - prob.release, 0)
    delay = float(((x * (lp.s - prob.release[lp.job])).sum() + (u * late_delay).sum()) / max(n, 1))
    energy = float(x @ lp.energy_kwh + u @ lp.late_energy_kwh)
    renew = float(x @ lp.renewable_kwh + u @ lp.late_renewable_kwh)
    # allocated GPU-milli per hour of the period from the fractional solution (timely part)
    H, C = prob.hours, prob.n_clusters
    occ = np.ceil(prob.dur[lp.job, lp.k, lp.c] - 1e-9).astype(np.int64)
    diff = np.zeros((H + 1, C))
    g = prob.gpu_total[lp.job] * x
    np.add.at(diff, (lp.s, lp.c), g)
    np.add.at(diff, (np.minimum(lp.s + occ, H), lp.c), -g)
    alloc = np.cumsum(diff, axis=0)[: sc.hours]
    cap = sc.fleet.capacity_milli
    out = {
        "kgco2e": lp.objective_kg,
        "energy_kwh": energy,
        "renewable_share": renew / max(energy, 1e-12),
        "deadline_satisfaction": float(1.0 - u.sum() / max(n, 1)),
        "mean_delay_h": delay,
        "unallocated_gpus": float(((cap[None, :] - alloc).sum(axis=1) / 1000.0).mean()),
        "utilization": float(alloc.sum() / (cap.sum() * sc.hours)),
        "by_cluster": by_cluster(sc, alloc),
        "lp": lp.summary(),
        "runtime_s": round(time.perf_counter() - t, 2),
    }
    if per_job:
        out[PER_JOB_KEY] = lp.job_carbon(n)  # (N,) in the job table's order
    return out


def solve_preemptive_optimum(sc: Scenario, time_limit_s: float = 600.0) -> dict:
    """The bound if the checkpointing jobs (the trace's `checkpointing` flag) could be preempted and resumed
    (`solve_preemptive_lp`): the reference a policy that preempts would be measured against, and the most that
    preempting could save over the non-preemptive bound (`solve_optimum`). No policy preempts today."""
    from scheduling.planning.lp import solve_preemptive_lp

    t = time.perf_counter()
    prob = optimum_problem(sc)
    bound = solve_preemptive_lp(prob, prob.jobs["checkpointing"].to_numpy(bool), time_limit_s=time_limit_s)
    _require_solved("the preemptive bound's LP", bound, time_limit_s)
    return {"kgco2e": bound.objective_kg, "deadline_satisfaction": 1.0 - bound.late_job_share,
            "preemptible_share": bound.n_preemptible / max(prob.n_jobs, 1), "lp": bound.summary(),
            "runtime_s": round(time.perf_counter() - t, 2)}


PER_JOB_KEY = "_per_job_kgco2e"


def job_shape(jobs: pd.DataFrame) -> np.ndarray:
    """Per job its GPU shape for the gap breakdown: "<1" (a share of one GPU) or the whole-GPU count."""
    whole = jobs["gpu_milli"].to_numpy() >= 1000
    return np.where(whole, jobs["num_gpu"].astype(int).astype(str).to_numpy(), "<1")


def gap_by_job_shape(sc: Scenario, records: pd.DataFrame, optimum_per_job: np.ndarray, base_kg: float) -> dict:
    """Where a policy's carbon above the bound comes from, by job GPU shape: per shape the jobs, the policy's and
    the bound's carbon, the gap and its share of the whole gap, the share of late jobs, and the share of the
    optimum's reduction the policy would capture if that shape alone ran at the bound's carbon."""
    shape = job_shape(sc.jobs)
    by_job = records.set_index("job_id").reindex(sc.jobs["job_id"])
    kg = by_job["kgco2e"].to_numpy()
    met = by_job["met_deadline"].to_numpy(dtype=bool)
    total_gap = float(kg.sum() - optimum_per_job.sum())
    reduction = base_kg - float(optimum_per_job.sum())
    out = {}
    for s in sorted(set(shape), key=lambda v: (v != "<1", int(v) if v != "<1" else 0)):
        m = shape == s
        gap = float(kg[m].sum() - optimum_per_job[m].sum())
        out[s] = {"jobs": int(m.sum()), "kgco2e": float(kg[m].sum()), "optimum_kgco2e": float(optimum_per_job[m].sum()),
                  "gap_kg": gap, "gap_share_pct": 100.0 * gap / total_gap if abs(total_gap) > 1e-9 else None,
                  "late_share": float(1.0 - met[m].mean()),
                  "share_if_at_optimum_pct": (100.0 * (base_kg - float(kg.sum()) + gap) / reduction
                                              if reduction > 1e-9 else None)}
    return out


def replay_optimum(sc: Scenario, integral: bool = False, time_limit_s: float = 600.0) -> dict:
    """Diagnostic: the offline optimum's schedule (LP rounded to each job's heaviest candidate, or the whole-job MILP
    with `integral=True`) executed hour by hour through the cluster agents (`ReplayPlan`): how much of the bound's
    reduction a schedule that knew everything reaches once jobs must fit on nodes. Returns the optimum's carbon, the
    replay's metrics, the share of jobs that started at their planned hour and cluster, and the excess carbon of
    the displaced ones."""
    from scheduling.planning.lp import solve_lp

    prob = optimum_problem(sc)
    glp = solve_lp(prob, time_limit_s=time_limit_s, integral=integral)
    n = prob.n_jobs
    best, k, s, c = glp.heaviest(n)
    T0 = abs_hours(sc.start)
    ids = sc.jobs["job_id"].astype(str).tolist()
    plan = {ids[j]: (int(k[j]), T0 + int(s[j]), int(c[j])) for j in range(n) if best[j] > 1e-9}
    res = simulate(sc, ReplayPlan(plan))
    rec = res.records
    start_h = rec["start_time"].astype("int64").to_numpy() // 3_600_000_000_000
    names = np.array(sc.fleet.names, dtype=object)
    on_plan = np.array([i in plan and rec["started"].iat[j] and plan[i][1] == start_h[j]
                        and names[plan[i][2]] == rec["cluster"].iat[j] for j, i in enumerate(ids)])
    opt_job = glp.job_carbon(n)
    excess = rec["kgco2e"].to_numpy() - opt_job
    return {"optimum_kgco2e": glp.objective_kg, "optimum": glp.summary(), "integral": integral,
            "fractional_jobs": int((best < 0.999).sum()), "replay": res.metrics,
            "on_plan_share": float(on_plan.mean()), "excess_kg_on_plan": float(excess[on_plan].sum()),
            "excess_kg_displaced": float(excess[~on_plan].sum())}


# ---------------------------------------------------------------------------------------------------- evaluate
def environment() -> dict:
    import scipy

    return {"cpu_count": os.cpu_count(), "python": sys.version.split()[0], "numpy": np.__version__,
            "pandas": pd.__version__, "scipy": scipy.__version__, "platform": platform.platform(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def evaluate(sc: Scenario, policies=ONLINE_POLICIES, *, with_optimum: bool = True, seed: int = 0,
             weights: PriorityWeights | None = None, progress: bool = False, lp_time_limit_s: float = 600.0,
             ablations: bool = False, postpone_margin_h: float = 1.0) -> dict:
    """Every policy (and the bound) on one scenario; a JSON-ready dict. `ablations`: also the priority policy
    without capacity prices, and priority (and rolling-lp, when run) with oracle (actual) and seasonal-naive
    forecasts, and rolling-lp with perfect information -- oracle forecasts and the trace's true arrivals of the next
    `PERFECT_ARRIVALS_H` hours instead of its replayed expected arrivals: what the same hourly plan reaches on the
    same nodes when nothing is uncertain (under "ablations")."""
    policies = list(policies)
    if BASELINE not in policies:
        policies.append(BASELINE)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(policies) * (sc.hours + sc.tail_hours), file=sys.stderr, unit="h",
                   desc=f"{sc.start.date()} load={sc.load}", leave=False)
    results, records = {}, {}
    for name in policies:
        if bar is not None:
            bar.set_postfix_str(name)
        res = simulate(sc, name, seed=seed, weights=weights, progress=bar, postpone_margin_h=postpone_margin_h)
        results[name] = res.metrics
        if name in OUR_POLICIES:
            records[name] = res.records
    if bar is not None:
        bar.close()
    opt, opt_error = None, None
    if with_optimum:
        try:
            opt = solve_optimum(sc, lp_time_limit_s, per_job=True)
        except BoundNotSolved as exc:  # the policies' results stand; the shares are then unknown, not made up
            opt_error = str(exc)
            print(f"[evaluate] {sc.start.date()} load {sc.load}: {opt_error}", file=sys.stderr)
    base = results[BASELINE]["kgco2e"]
    gaps = None
    if opt is not None:
        per_job = opt.pop(PER_JOB_KEY)
        gaps = {name: gap_by_job_shape(sc, rec, per_job, base) for name, rec in records.items()}
    for name, m in results.items():
        m["reduction_vs_performance_first_pct"] = 100.0 * (base - m["kgco2e"]) / base if base else None
        if opt is not None and base - opt["kgco2e"] > 1e-9:
            m["share_of_optimum_reduction_pct"] = 100.0 * (base - m["kgco2e"]) / (base - opt["kgco2e"])
        else:
            m["share_of_optimum_reduction_pct"] = None
    if opt is not None:
        opt["reduction_vs_performance_first_pct"] = 100.0 * (base - opt["kgco2e"]) / base if base else None
        opt["share_of_optimum_reduction_pct"] = 100.0
    extra = {}
    if ablations:
        zones = sc.fleet.zones
        runs = {
            "priority-noprices": ("priority-noprices", None),
            "priority-oracle-forecast": ("priority", make_forecasts("oracle", sc.grid, zones)),
            "priority-naive-forecast": ("priority", make_forecasts("naive", sc.grid, zones)),
        }
        if "rolling-lp" in policies:
            runs["rolling-lp-oracle-forecast"] = ("rolling-lp", runs["priority-oracle-forecast"][1])
            runs["rolling-lp-naive-forecast"] = ("rolling-lp", runs["priority-naive-forecast"][1])
            # the perfect-information reference: oracle forecasts and the true arrivals of the next 48 h
            runs[PERFECT_INFORMATION] = (ClairvoyantArrivals(PERFECT_ARRIVALS_H),
                                         runs["priority-oracle-forecast"][1])
        for label, (name, provider) in runs.items():
            m = simulate(sc, name, seed=seed, weights=weights, forecasts=provider,
                         postpone_margin_h=postpone_margin_h).metrics
            m["reduction_vs_performance_first_pct"] = 100.0 * (base - m["kgco2e"]) / base if base else None
            m["share_of_optimum_reduction_pct"] = (100.0 * (base - m["kgco2e"]) / (base - opt["kgco2e"])
                                                   if opt is not None and base - opt["kgco2e"] > 1e-9 else None)
            extra[label] = m
    fallback = results.get("priority", next(iter(results.values())))["forecast_fallback_share"]
    report = {
        "config": {**sc.config, "postpone_margin_h": postpone_margin_h},
        "signal": SIGNAL,
        "forecasts": {**sc.forecasts.describe(), "used": sc.forecasts.name,
                      "fallback_share_of_cells": fallback,
                      "note": ("naive = seasonal naive from actuals known at the planning hour"
                               if sc.forecasts.name == "naive" else None)},
        "fleet": {"total_gpus": sc.fleet.total_gpus, "clusters": sc.fleet.capacity_table().to_dict("records")},
        "jobs": {"n": int(len(sc.jobs)), "gpu_hours_home": round(demand_gpu_hours(sc.jobs, sc.table, on="home"), 1),
                 "by_class": {str(k): int(v) for k, v in sc.jobs["workload_class"].value_counts().items()},
                 "mean_duration_h_ref": float(sc.jobs["duration_h_ref"].mean()),
                 "mean_flexibility": float(sc.jobs["flexibility"].mean())},
        "policies": results,
        "optimum": opt,
        **({"optimum_error": opt_error} if opt_error else {}),
        "ablations": extra or None,
        "gap_by_job_shape": gaps,
        "targets": _targets(results, opt),
        "environment": environment(),
    }
    return _clean(report)


def _targets(results: dict, opt: dict | None = None) -> dict:
    """The issue's targets (>= 90 % of the optimum's reduction, >= 98 % deadlines) for each of our policies."""
    out = {}
    for name in OUR_POLICIES:
        ours = results.get(name)
        if ours is None:
            continue
        share = ours.get("share_of_optimum_reduction_pct")
        out[name] = {
            "share_of_optimum_reduction_pct": share,
            "share_target_90_met": None if share is None else bool(share >= 90.0),
            "deadline_satisfaction": ours["deadline_satisfaction"],
            "deadline_target_98_met": bool(ours["deadline_satisfaction"] >= 0.98),
        }
    return out


def _clean(value):
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 6)
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


# ---------------------------------------------------------------------------------------------------- report
OUR_POLICIES = ("priority", "rolling-lp")
PERFECT_INFORMATION = "rolling-lp-perfect-information"
REFERENCE_RUNS = (PERFECT_INFORMATION,)  # ablations reported over seeds beside the policies and the bound
REPORT_POLICIES = ("priority", "rolling-lp", "priority-noprices", "carbon-time", "greedy-carbon", "performance-first",
                   "round-robin", "random")
METHOD_NOTES = """
How to read this:
* Jobs: openb GPU pods (CPU, memory, GPU count and share) arriving with the trace's time of day over the period,
  Philly run times conditioned on GPU count (clipped to 1-48 h, read as V100 hours; other GPUs by Gavel's measured
  speed per job type), a Gavel job-type mix (vision, language, recommendation, RL), deadline = submission +
  home-cluster run time x (1 + flexibility), flexibility per class (20-60 %). Plans every hour; no job is
  preempted (preemption is opt-in, not in these runs).
* Load: the fleet (whole openb / PAI nodes per cluster, equal weights) is sized so that the jobs' GPU-hours as
  performance-first runs them (slow GPUs included) are the target share of the fleet's GPU-hours in the period
  (`placed load`; two re-sizing rounds from a GPU-count-weighted estimate). The job trace is drawn on the sized
  fleet, so home clusters and deadlines refer to clusters that exist. `util.` is the measured mean GPU
  allocation inside the period: lower, since the fleet starts empty and late arrivals run after the period.
* Carbon: energy = GPU share x average board power at the chosen power limit x run time x PUE (+ network energy
  when a job leaves its home region), charged at the actual hourly intensity of the cluster's zone.
* `priority` = the priority order of the issue (P = 0.35 U + 0.40 F + 0.25 O, lowest P planned first), minimum
  forecast carbon over (power limit, start hour, region), plus capacity prices learned each day from the LP duals
  of the previous 72 h of arrivals; `priority-noprices` is the same without the prices.
* `rolling-lp` = model-predictive control with the optimum's own LP: every hour the LP over the jobs known then,
  the capacity left and the *forecast* (15 % capacity head-room for node packing, 6-hour capacity blocks after
  24 h, on clusters with three or more 8-GPU nodes one in three, at most one, kept on standby for 8-GPU jobs
  (and for a job due now that no other node takes) and seen by the LP as a cluster of its own, and the last 18 h
  of arrivals replayed 18 h later as expected jobs); the jobs it
  starts at hour 0, and every job whose latest timely start is now, start; the rest wait.
* `optimum` is a bound: the LP relaxation with every job and the actual intensity known in advance, fractional
  jobs and capacity aggregated per cluster (no node packing). Its deadline figure counts the share of jobs its
  solution runs late. "share of optimum" = (performance-first - policy) / (performance-first - optimum).
"""


def over_seeds(reports: list[dict], partial: bool = False) -> list[dict]:
    """Per period and load evaluated on more than one trace seed: each policy's (and the bound's) share of the
    optimum's reduction and deadline satisfaction over the seeds (mean, min, max; policies run on every seed), and
    the reference ablations (`REFERENCE_RUNS`: rolling-lp with perfect information) where they ran.
    `partial`: every period and load, and each policy over the seeds it ran on (`runs` says how many), e.g. the
    baselines run on one seed beside ours on three."""
    groups: dict[tuple, list[dict]] = {}
    for rep in reports:
        cfg = rep["config"]
        groups.setdefault((cfg["start"], cfg["load_target"], cfg["n_jobs_requested"], cfg["days"]), []).append(rep)
    rows = []
    for (start, load, _, _), reps in groups.items():
        seeds = sorted({int(r["config"]["seed"]) for r in reps})
        if not partial and (len(seeds) < 2 or len(seeds) != len(reps)):
            continue
        runs = [{**r["policies"], **{k: m for k, m in (r.get("ablations") or {}).items() if k in REFERENCE_RUNS}}
                for r in reps]
        names = list(dict.fromkeys(p for x in runs for p in x if partial or all(p in y for y in runs)))
        for name in names + (["optimum"] if all(r.get("optimum") for r in reps) else []):
            pairs = [(r, r["optimum"] if name == "optimum" else x[name]) for r, x in zip(reps, runs)
                     if name == "optimum" or name in x]
            ran, ms = [r for r, _ in pairs], [m for _, m in pairs]
            share = [m.get("share_of_optimum_reduction_pct") for m in ms]
            dl = [m["deadline_satisfaction"] for m in ms]
            kg = [m["kgco2e"] for m in ms]
            ok = all(v is not None for v in share)
            rows.append({"start": start, "load_target": load, "seeds": sorted(int(r["config"]["seed"]) for r in ran),
                         "policy": name, "runs": len(ran),
                         "share_mean_pct": float(np.mean(share)) if ok else None,
                         "share_min_pct": float(np.min(share)) if ok else None,
                         "share_max_pct": float(np.max(share)) if ok else None,
                         "deadlines_mean": float(np.mean(dl)), "deadlines_min": float(np.min(dl)),
                         "deadlines_max": float(np.max(dl)), "kgco2e_mean": float(np.mean(kg))})
    return rows


def _row_label(name: str) -> str:
    return {"optimum": "optimum (bound)", PERFECT_INFORMATION: f"*{PERFECT_INFORMATION}* (reference)"}.get(name, name)


def report_markdown(reports: list[dict]) -> str:
    """The README table(s): periods x loads x policies, the bound beside them, plus the fleet per region."""
    lines = ["# Carbon-aware planner: simulated results", ""]
    if not reports:
        return "\n".join(lines + ["(no results)"])
    r0 = reports[0]
    seeds = ", ".join(str(v) for v in dict.fromkeys(r["config"]["seed"] for r in reports))
    lines += [
        f"Signal: {r0['signal']}. Each row replays {r0['config']['n_jobs']} jobs (openb pods, Philly durations, "
        f"Gavel job-type mix; trace seed {seeds}) over {r0['config']['days']} days on "
        f"{len(r0['config']['regions'])} regions, planning every hour from the forecast known then and charging "
        "the actual intensity. `optimum` is the LP relaxation with perfect knowledge (a bound, not a schedule).",
        "",
        "Columns: kgCO2e; reduction vs performance-first; share of the optimum's reduction captured; deadline "
        "satisfaction; mean delay (h); unallocated GPUs (mean over the period); energy (kWh); renewable share of "
        "the energy used; utilisation.",
        "",
    ]
    lines += METHOD_NOTES.strip().splitlines() + [""]
    summary = over_seeds(reports)
    if summary:
        lines += ["## Over trace seeds", "",
                  "Each period and load on several trace seeds (the jobs, their arrival times and home clusters change "
                  "with the seed, and so the fleet's size and nodes): mean and range over the seeds; single runs "
                  "follow below.", "",
                  "| period | load | seeds | policy | share of optimum: mean (min-max) | deadlines: mean (min) | "
                  "kgCO2e mean |", "|---|---:|---|---|---:|---:|---:|"]
        for r in summary:
            share = (f"{fmt(r['share_mean_pct'])} % ({fmt(r['share_min_pct'])}-{fmt(r['share_max_pct'])})"
                     if r["share_mean_pct"] is not None else "n/a")
            lines.append(f"| {r['start'][:10]} | {r['load_target']} | {', '.join(map(str, r['seeds']))} | "
                         f"{_row_label(r['policy'])} | {share} | "
                         f"{fmt(100 * r['deadlines_mean'])} % ({fmt(100 * r['deadlines_min'])} %) | "
                         f"{fmt(r['kgco2e_mean'], 1)} |")
        lines.append("")
    several = len({rep["config"]["seed"] for rep in reports}) > 1
    for rep in reports:
        cfg = rep["config"]
        fc = rep["forecasts"]
        base = rep["policies"].get("performance-first", {})
        per_region = ", ".join(str(c["gpus"]) for c in rep["fleet"]["clusters"])
        used = fc.get("used")
        if used == "warehouse":
            used = f"forecast.forecasts {fc.get('model')} ({', '.join(fc.get('model_versions') or []) or 'unversioned'})"
        seed = f", trace seed {cfg['seed']}" if several else ""
        lines.append(f"## {cfg['start'][:10]} + {cfg['days']} d, load target {cfg['load_target']}{seed} (placed load "
                     f"under performance-first {fmt(base.get('placed_load'), 2)}, {rep['fleet']['total_gpus']} GPUs: "
                     f"{per_region} per region), forecasts: {used} (naive fallback share of forecast cells "
                     f"{fmt(fc.get('fallback_share_of_cells'), 2)})")
        lines.append("")
        lines.append("| policy | kgCO2e | red. vs perf-first | share of optimum | deadlines | mean delay h | "
                     "unalloc. GPUs | energy kWh | renewable | util. |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = [(p, rep["policies"][p]) for p in REPORT_POLICIES if p in rep["policies"]]
        if rep.get("optimum"):
            rows.append(("optimum (bound)", rep["optimum"]))
        for name, m in rows:
            lines.append(
                f"| {name} | {fmt(m['kgco2e'], 1)} | {fmt(m.get('reduction_vs_performance_first_pct'), 1)} % | "
                f"{fmt(m.get('share_of_optimum_reduction_pct'), 1)} % | "
                f"{fmt(100 * m['deadline_satisfaction'], 1)} % | {fmt(m.get('mean_delay_h'), 2)} | "
                f"{fmt(m.get('unallocated_gpus'), 1)} | {fmt(m['energy_kwh'], 0)} | "
                f"{fmt(100 * m['renewable_share'], 1)} % | {fmt(100 * m.get('utilization', float('nan')), 1)} % |")
        lines.append("")
        if rep.get("optimum_error"):
            lines += [f"No bound for this run, so no shares: {rep['optimum_error']}", ""]
        for name, m in (rep.get("ablations") or {}).items():
            lines.insert(len(lines) - 1, f"| *{name}* | {fmt(m['kgco2e'], 1)} | "
                         f"{fmt(m.get('reduction_vs_performance_first_pct'), 1)} % | "
                         f"{fmt(m.get('share_of_optimum_reduction_pct'), 1)} % | "
                         f"{fmt(100 * m['deadline_satisfaction'], 1)} % | {fmt(m.get('mean_delay_h'), 2)} | "
                         f"{fmt(m.get('unallocated_gpus'), 1)} | {fmt(m['energy_kwh'], 0)} | "
                         f"{fmt(100 * m['renewable_share'], 1)} % | {fmt(100 * m.get('utilization', float('nan')), 1)} % |")
        others = {p: m for p, m in rep["policies"].items() if p not in OUR_POLICIES}
        for name in OUR_POLICIES:
            ours = rep["policies"].get(name)
            if ours is None:
                continue
            carbon = [p for p, m in others.items() if m["kgco2e"] < ours["kgco2e"]]
            dl = [f"{p} ({fmt(100 * m['deadline_satisfaction'], 1)} %)" for p, m in others.items()
                  if m["deadline_satisfaction"] > ours["deadline_satisfaction"] + 1e-9]
            lines.append(f"Where a baseline wins against {name}: "
                         + (f"less carbon: {', '.join(carbon)}; " if carbon else "no baseline emits less carbon; ")
                         + (f"more deadlines met: {', '.join(dl)}." if dl else "none meets more deadlines."))
            lines.append("")
        for name, by_shape in (rep.get("gap_by_job_shape") or {}).items():
            lines.append(f"Where {name}'s carbon above the bound comes from, by job GPU shape (GPUs per job; "
                         "\"if at bound\": the share of the optimum's reduction it would capture if that shape alone "
                         "ran at the bound's carbon):")
            lines.append("")
            lines.append("| GPUs | jobs | kgCO2e | bound kgCO2e | gap kg | share of gap | late | if at bound |")
            lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
            for shape, g in by_shape.items():
                lines.append(f"| {shape} | {g['jobs']} | {fmt(g['kgco2e'], 1)} | {fmt(g['optimum_kgco2e'], 1)} | "
                             f"{fmt(g['gap_kg'], 1)} | {fmt(g['gap_share_pct'], 1)} % | "
                             f"{fmt(100 * g['late_share'], 1)} % | {fmt(g['share_if_at_optimum_pct'], 1)} % |")
            lines.append("")
        lines += _by_cluster_table(rep)
    lines.append("## Fleet capacity per region")
    lines.append("")
    for rep in reports:
        cfg = rep["config"]
        lines.append(f"- {cfg['start'][:10]}, load target {cfg['load_target']}"
                     + (f", trace seed {cfg['seed']}" if several else "") + ": "
                     + "; ".join(f"{c['region']} ({c['zone']}) {c['cluster']}: {c['nodes']} nodes, {c['gpus']} "
                                 f"{c['gpu_model']} GPUs, PUE {c['pue']}" for c in rep["fleet"]["clusters"]))
        lines.append("")
    env = reports[0]["environment"]
    lines.append(f"Environment: {env['cpu_count']} CPUs, Python {env['python']}, numpy {env['numpy']}, "
                 f"scipy {env['scipy']}.")
    return "\n".join(lines) + "\n"


def fmt(v, nd: int = 1) -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "n/a"
    return f"{v:.{nd}f}"


def _by_cluster_table(rep: dict) -> list[str]:
    """Per cluster (cleanest zone first): the bound's utilisation beside each of our policies', and where our
    policies' free GPUs were (whole devices, device fragments, standby nodes)."""
    opt = (rep.get("optimum") or {}).get("by_cluster")
    ours = [(name, rep["policies"][name]["by_cluster"]) for name in OUR_POLICIES
            if (rep["policies"].get(name) or {}).get("by_cluster")]
    if not ours:
        return []
    names = sorted(ours[0][1], key=lambda c: ours[0][1][c]["mean_intensity_g_per_kwh"])
    head = "| cluster | mean gCO2e/kWh | GPUs | bound util. |"
    rule = "|---|---:|---:|---:|"
    for name, _ in ours:
        head += f" {name} util. | free: whole / fragments / standby GPUs |"
        rule += "---:|---:|"
    lines = ["Where the GPUs went, per cluster (means over the period; the bound's utilisation from its fractional "
             "plan; \"fragments\": free shares of partly used devices, which only small jobs can use -- the bound "
             "and the planner's LP count them as usable by any job):", "", head, rule]
    for c in names:
        row = ours[0][1][c]
        line = (f"| {c} | {fmt(row['mean_intensity_g_per_kwh'], 0)} | {fmt(row['gpus'], 0)} | "
                f"{fmt(100 * opt[c]['utilization'], 1) + ' %' if opt and c in opt else 'n/a'} |")
        for _, by in ours:
            m = by[c]
            line += (f" {fmt(100 * m['utilization'], 1)} % | {fmt(m.get('idle_gpus'), 1)} / "
                     f"{fmt(m.get('fragmented_gpus'), 1)} / {fmt(m.get('standby_idle_gpus'), 1)} |")
        lines.append(line)
    return lines + [""]
