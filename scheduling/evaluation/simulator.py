"""Trace-driven simulator: replays a scenario's job trace over its grid period hour by hour with one policy.

Each hour t: jobs that finished free their nodes; the policy plans every pending job (submitted, not started) from
the forecast known at t (`scheduling.planning.forecasts`); the jobs it starts at t are packed onto nodes by the
cluster agents (FGD) and run to completion, or until the policy preempts them -- their carbon is computed from the
*actual* intensity of the hours they run. Future starts are only tentative and are planned again the next hour.

    sc = build_scenario(start="2021-07-01", days=14, n_jobs=1000, regions=6, load=0.5)   # scenario.py
    res = simulate(sc, "priority")                # SimResult: per-job records + metrics

Metrics: kgCO2e (actual intensity; job energy = the job's share of its GPUs x average board power at its power limit
x run time x PUE, plus data transfer when it moved), deadline satisfaction (finished by the deadline), mean delay
(first start - submission, hours), unallocated GPUs (fleet GPUs not allocated, mean over the period's hours),
utilisation, placed load, energy (kWh), renewable share of the energy used (sum energy x the region's renewable share
that hour / sum energy). `results.evaluate` adds the reduction against performance-first and the share of the
optimum's reduction captured ((perf - policy) / (perf - optimum)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scheduling.domain.execution import run_wall_h
from scheduling.evaluation.load import placed_load
from scheduling.evaluation.scenario_record import Scenario
from scheduling.planning.forecasts import ForecastProvider
from scheduling.planning.pausing import Pausing
from scheduling.planning.policies.base import PlacementPolicy
from scheduling.planning.policies.registry import DEFAULT_POLICY, make_policy
from scheduling.planning.problem import PriorityWeights, abs_hours
from scheduling.planning.session import HourlyPlanner, apply_running

BASELINE = "performance-first"  # the reference: load calibration, reductions and shares are measured against it


@dataclass
class SimResult:
    """One policy's run: per-job records, the metrics, and the GPU-milli allocated per hour and cluster."""

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


def execute(
    sc: Scenario,
    start_h: np.ndarray,
    k: np.ndarray,
    c: np.ndarray,
    run_h: np.ndarray | None = None,
    preempted: list | None = None,
) -> dict[str, np.ndarray]:
    """Actual carbon, energy and renewable energy of jobs started at absolute hours `start_h` on clusters `c` with
    power option `k` (arrays over all jobs; -1 = never started) and run for `run_h` hours (default: the whole job's
    run time there; a resumed job: `execution.run_wall_h`), plus the runs that ended in a preemption (`preempted`:
    [(job, start hour, hours run, option, cluster)], in order). Data is transferred (and charged) when a run is on
    another cluster than the job's previous run (the first: its home cluster; no charge within the home region)."""
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
    last = tbl.dur[idx, k[idx], c[idx]] if run_h is None else np.asarray(run_h, dtype=float)[idx]
    dur = np.concatenate([np.array([float(r[2]) for r in runs]), last])
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
    for key, vals in (
        ("kg", (kw * w_ci + tk * ci_move) / 1000.0),
        ("kwh", kw * dur + tk),
        ("renew_kwh", kw * w_re + tk * re_move),
        ("dur_h", dur),
    ):
        out[key] = np.bincount(job, weights=vals, minlength=n)
    return out


def simulate(
    sc: Scenario,
    policy: str | PlacementPolicy = DEFAULT_POLICY,
    *,
    seed: int = 0,
    weights: PriorityWeights | None = None,
    progress=None,
    explain: bool = False,
    forecasts: ForecastProvider | None = None,
    postpone_margin_h: float = 1.0,
    reserve_nodes: bool = False,
    pausing: Pausing | None = None,
    held: pd.DataFrame | None = None,
    chunks: bool = True,
) -> SimResult:
    """Replay the scenario's trace with one online policy (a registered name or a policy object; see the module
    docstring). `forecasts`: plan from these instead of the scenario's. `postpone_margin_h`: a job may be postponed
    only to a start that leaves this many hours before its latest timely start. `reserve_nodes`: the planner's
    backfill reservations (`HourlyPlanner.reserve_nodes_for`). `pausing`: each hour, stop running checkpointing jobs
    through dirty stretches as the loop does (`HourlyPlanner.pause_running`). `held`: capacity outside the jobs (the
    loop's service replicas), rows of `session.apply_running` with a `start_time`, held from that hour on as the
    loop's running rows are. `chunks`: long checkpointing jobs planned and run in chunks (`planning.chunks`); False:
    planned whole."""
    t_run = time.perf_counter()
    tbl = sc.table
    n = tbl.n
    T0 = abs_hours(sc.start)
    T_arr = T0 + sc.hours
    T_max = T_arr + sc.tail_hours
    label = policy.name if isinstance(policy, PlacementPolicy) else policy
    if not isinstance(policy, PlacementPolicy):
        policy = make_policy(policy, seed=seed, weights=weights)
    hp = HourlyPlanner(
        sc.fleet,
        table=tbl,
        policy=policy,
        forecasts=forecasts or sc.forecasts,
        workload=sc.workload,
        explain=explain,
        tentative=False,
        seed=seed,
        postpone_margin_h=postpone_margin_h,
        reserve_nodes=reserve_nodes,
        pausing=pausing,
        chunks=chunks,
    )
    C = len(sc.fleet)
    alloc = np.zeros((sc.hours, C), dtype=np.int64)
    free_parts = np.zeros((sc.hours, C, 3), dtype=np.int64)
    plan_s = []
    late_planned = 0
    held_at = _by_start_hour(held)
    for t in range(T0, T_max):
        now = pd.Timestamp(t * 3_600_000_000_000, tz="UTC")
        hp.release_finished(t)
        hp.end_chunks(t)
        if t in held_at:
            apply_running(hp, held_at[t], now)
        if pausing is not None:
            hp.pause_running(now, t)
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
        if t >= T_arr and hp.started.all() and not (hp.chunk_end_h > t).any():  # every chunk stopped too
            break
    if progress is not None and t + 1 < T_max:
        progress.update(T_max - t - 1)
    full = tbl.dur[np.arange(n), np.maximum(hp.k, 0), np.maximum(hp.c, 0)]
    last_run = np.where(hp.started, run_wall_h(full, hp.work_done, tbl.checkpoint_h), 0.0)
    ex = execute(sc, np.where(hp.started, hp.start_h, -1), hp.k, hp.c, last_run, hp.preempted_runs)
    jobs = sc.jobs
    submit_h = tbl.submit_h
    end_h = np.where(hp.started, hp.start_h + last_run, np.nan)
    first_h = np.where(hp.started, hp.first_start_h, 0)
    met = hp.started & (end_h <= tbl.deadline_h + 1e-6)
    records = pd.DataFrame(
        {
            "job_id": jobs["job_id"],
            "started": hp.started,
            "start_time": pd.to_datetime(first_h * 3_600_000_000_000, utc=True),
            "cluster": np.where(hp.c >= 0, np.array(sc.fleet.names, dtype=object)[np.maximum(hp.c, 0)], None),
            "power_option": hp.k,
            "delay_h": np.where(hp.started, first_h - submit_h, np.nan),
            "duration_h": ex["dur_h"],
            "kgco2e": ex["kg"],
            "energy_kwh": ex["kwh"],
            "renewable_kwh": ex["renew_kwh"],
            "met_deadline": met,
            "node": hp.node,
            "preemptions": hp.preemptions,
        }
    )
    cap = sc.fleet.capacity_milli
    metrics = {
        "kgco2e": float(ex["kg"].sum()),
        "energy_kwh": float(ex["kwh"].sum()),
        "renewable_share": float(ex["renew_kwh"].sum() / max(ex["kwh"].sum(), 1e-12)),
        "deadline_satisfaction": float(met.mean()) if n else 1.0,
        # late jobs that starting at once on their home cluster (run-now, `run_now_meets`) would have kept on time
        "deadline_regret": float((~met & run_now_meets(sc)).mean()) if n else 0.0,
        "mean_delay_h": float(np.nanmean(records["delay_h"])) if hp.started.any() else None,
        "unallocated_gpus": float(((cap[None, :] - alloc).sum(axis=1) / 1000.0).mean()),
        "utilization": float(alloc.sum() / (cap.sum() * sc.hours)),
        # GPU-hours as this policy ran the jobs (slow GPUs, power caps included) / fleet GPU-hours of the period
        "placed_load": placed_load(jobs, ex["dur_h"], sc.fleet, sc.hours),
        "jobs_started": int(hp.started.sum()),
        "jobs_late": int((hp.started & ~met).sum()),
        "jobs_never_started": int((~hp.started).sum()),
        "agent_rejections": int(hp.rejections),
        "preemptions": int(hp.preemptions.sum()),
        "preempted_jobs": int((hp.preemptions > 0).sum()),
        "paused_for_carbon": len(hp.paused),
        "power_capped_jobs": int((hp.k > 0).sum()),
        "moved_jobs": int((hp.started & (hp.c != tbl.home)).sum()),
        "forecast_fallback_share": float(np.nanmean(hp.fallback_shares)) if hp.fallback_shares else None,
        "plans": len(plan_s),
        "plan_latency_ms_mean": float(1000 * np.mean(plan_s)) if plan_s else None,
        "plan_latency_ms_max": float(1000 * np.max(plan_s)) if plan_s else None,
        "runtime_s": round(time.perf_counter() - t_run, 2),
        "by_region_kgco2e": {
            r: float(v)
            for r, v in pd.Series(ex["kg"])
            .groupby(np.where(hp.c >= 0, np.array(sc.fleet.cluster_regions, dtype=object)[np.maximum(hp.c, 0)], "none"))
            .sum()
            .items()
        },
        "by_cluster": by_cluster(sc, alloc, free_parts),
    }
    return SimResult(label, records, metrics, alloc)


def _by_start_hour(held: pd.DataFrame | None) -> dict[int, pd.DataFrame]:
    """`held`'s rows per hour (absolute) they start at."""
    if held is None or not len(held):
        return {}
    epoch = pd.Timestamp(0, tz="UTC")
    hours = ((pd.to_datetime(held["start_time"], utc=True) - epoch) // pd.Timedelta(hours=1)).to_numpy()
    return {int(h): held[hours == h].reset_index(drop=True) for h in np.unique(hours)}


def run_now(sc: Scenario) -> dict[str, np.ndarray]:
    """The run-now counterfactual of the scenario's jobs, as the carbon ledger values it: every job started at its
    submission hour on its home cluster (else the fastest that hosts it) at the default power limit, at the actual
    intensity. Per job, as `execute`: kg, kwh, renew_kwh, dur_h (0 for a job no cluster hosts)."""
    tbl = sc.table
    d0 = np.where(tbl.allowed, tbl.dur[:, 0, :], np.inf)
    home_ok = (tbl.home >= 0) & np.isfinite(d0[np.arange(tbl.n), np.maximum(tbl.home, 0)])
    c = np.where(home_ok, tbl.home, np.argmin(d0, axis=1))
    start = np.where(np.isfinite(d0).any(axis=1), tbl.submit_h, -1)
    return execute(sc, start, np.zeros(tbl.n, dtype=np.int64), c)


def run_now_meets(sc: Scenario) -> np.ndarray:
    """Per job: whether its run-now start (`run_now`: at submission, home cluster, default limit) ends by its
    deadline."""
    tbl = sc.table
    d0 = np.where(tbl.allowed, tbl.dur[:, 0, :], np.inf)
    home_ok = (tbl.home >= 0) & np.isfinite(d0[np.arange(tbl.n), np.maximum(tbl.home, 0)])
    c = np.where(home_ok, tbl.home, np.argmin(d0, axis=1))
    return tbl.submit_h + d0[np.arange(tbl.n), c] <= tbl.deadline_h + 1e-6


def by_cluster(sc: Scenario, alloc: np.ndarray, free_parts: np.ndarray | None = None) -> dict:
    """Per cluster, means over the period's hours: the share of its GPUs allocated and, where the agents' state
    is known (`free_parts`), the free GPUs by kind: on whole free devices (`idle_gpus`), on partly used devices
    (`fragmented_gpus`: device shares only small jobs can use) and on standby nodes (`standby_idle_gpus`). With
    the mean actual intensity of the cluster's zone over the period, this shows where the clean capacity went."""
    cap = sc.fleet.capacity_milli.astype(float)
    t0, ci = sc.actual("ci")
    a = abs_hours(sc.start) - t0
    mean_ci = ci[a : a + sc.hours].mean(axis=0)
    out = {}
    for c, name in enumerate(sc.fleet.names):
        row = {
            "mean_intensity_g_per_kwh": float(mean_ci[c]),
            "gpus": float(cap[c] / 1000.0),
            "utilization": float(alloc[:, c].mean() / max(cap[c], 1.0)),
        }
        if free_parts is not None:
            for i, key in enumerate(("idle_gpus", "fragmented_gpus", "standby_idle_gpus")):
                row[key] = float(free_parts[:, c, i].mean() / 1000.0)
        out[name] = row
    return out
