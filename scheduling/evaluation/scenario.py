"""The evaluation scenario: fleet, job trace, grid actuals and forecast provider of one period and load.

    sc = build_scenario(start="2021-07-01", days=14, n_jobs=1000, regions=6, load=0.5)

With `load` set, the fleet is sized so that the jobs' GPU-hours are `load` of the fleet's GPU-hours over the period
(`demand_gpu_hours`, then `calibrate` rounds on performance-first's placed load), and the trace is drawn again on the
sized fleet so that home clusters and deadlines refer to clusters that exist. `load_basis` says how a shared-GPU job
counts: the GPU-milli it asks for (`gpu-milli`, default), or the share of a device it holds when jobs of its size
share the device (`device-share`: an 810-milli job holds the whole device, since the 190 left fit few jobs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.timeutil import utc
from scheduling.domain.fleet import Fleet, load_fleet
from scheduling.domain.jobs import SpeedModel, generate_jobs
from scheduling.evaluation.load import DEFAULT_LOAD_BASIS, job_gpus, placed_load
from scheduling.evaluation.scenario_record import DEFAULT_TAIL_DAYS, Scenario
from scheduling.evaluation.simulator import BASELINE, simulate
from scheduling.planning.agents import default_workload, job_pods
from scheduling.planning.forecasts import BACKTEST, GridSeries, make_forecasts
from scheduling.planning.power_options import load_power_table
from scheduling.planning.problem import JobTable

HOUR = pd.Timedelta(hours=1)
CALIBRATION_TOLERANCE = 0.02  # a measured placed load this close to the target ends the calibration


def demand_gpu_hours(jobs: pd.DataFrame, table: JobTable, on: str = "fleet", basis: str = DEFAULT_LOAD_BASIS) -> float:
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
    return float((job_gpus(jobs, basis) * d).sum())


def bound_minimum_gpus(
    jobs: pd.DataFrame, table: JobTable, load: float, hours: int, basis: str = DEFAULT_LOAD_BASIS
) -> np.ndarray:
    """Per cluster, the GPUs that the jobs bound to a few clusters need at `load`: for every set S of clusters that
    some job can run on only (its GPU models), the GPU-hours of the jobs that fit nowhere else but S, over
    (load x hours), split over S by weight; each cluster keeps the largest of its shares. A fleet sized on the
    total alone can leave a GPU model that many jobs demand far over `load` (e.g. every T4-only job on one T4
    cluster) and no schedule could meet their deadlines."""
    allowed = table.allowed
    weights = np.array([c.config.weight for c in table.fleet.clusters], dtype=float)
    w = allowed * weights[None, :]
    w = w / np.maximum(w.sum(axis=1, keepdims=True), 1e-12)
    gpu_hours = (w * np.where(allowed, table.base_dur, 0.0)).sum(axis=1) * job_gpus(jobs, basis)
    minimum = np.zeros(allowed.shape[1])
    for subset in np.unique(allowed[allowed.sum(axis=1) < allowed.shape[1]], axis=0):
        if not subset.any():
            continue
        inside = ~np.any(allowed & ~subset[None, :], axis=1)  # jobs that can run only within the subset
        need = gpu_hours[inside].sum() / (load * hours)
        share = need * weights * subset / (weights * subset).sum()
        minimum = np.maximum(minimum, share)
    return minimum


def build_scenario(
    start="2021-07-01",
    days: float = 14,
    n_jobs: int = 1000,
    regions=6,
    load: float | None = 0.5,
    seed: int = 0,
    forecasts: str = "auto",
    fleet_path=None,
    data_dir=None,
    pod_list: str = "default",
    max_duration_h: float = 48.0,
    grid_source: str = "auto",
    db_path=None,
    forecast_model: str | None = None,
    forecast_version: str | None = BACKTEST,
    tail_days: int = DEFAULT_TAIL_DAYS,
    packing: str = "fgd",
    calibrate: int = 0,
    load_basis: str = DEFAULT_LOAD_BASIS,
) -> Scenario:
    """Fleet, job trace, grid actuals and the forecast provider for one evaluation.

    Fleet size: with `load` set, the clusters are re-sized (in proportion to their weights, whole nodes) so that
    the offered load -- the jobs' GPU-hours on a GPU drawn in proportion to the clusters that can host each job,
    over the fleet's GPU-hours of the period -- is `load`; the job trace is then drawn again (same seed, same
    draws) on the re-sized fleet so that home clusters and deadlines refer to clusters that exist. With
    `calibrate` > 0 performance-first runs the jobs on the fleet and the fleet is re-sized by its placed load (the
    GPU-hours it ran the jobs with / fleet GPU-hours) / `load`, up to `calibrate` times; every fleet tried is
    measured and the one whose placed load is closest to `load` is kept (whole nodes: a re-size can overshoot).
    The measured utilisation (mean GPU allocation inside the period) is reported beside it: lower, since the fleet
    starts empty and jobs arriving late run after the period. `load_basis`: how a shared-GPU job counts in the
    load (`load.LOAD_BASES`). `load=None` keeps the configured sizes. `forecast_version`: which model_version of the
    stored forecasts (`make_forecasts`; default: the stored backtest where there is one, else every version)."""
    start = utc(start).floor("h")
    hours = int(round(days * 24))
    fleet = load_fleet(fleet_path, regions=regions, data_dir=data_dir)
    if load is not None:  # sized to a load: the sampled clusters (declared ones are machines of a fixed size)
        fleet = fleet.sampled()
    speed = SpeedModel(data_dir)

    def draw(fleet, power):
        """The trace's jobs (same seed, same draws) on `fleet`, and their static arrays."""
        jobs = generate_jobs(
            n_jobs,
            start,
            hours,
            fleet,
            seed=seed,
            data_dir=data_dir,
            pod_list=pod_list,
            max_duration_h=max_duration_h,
            speed_model=speed,
        )
        return jobs, JobTable(jobs, fleet, speed, power)

    power = load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=start)
    jobs, table = draw(fleet, power)
    minimum = None
    if load is not None:
        minimum = bound_minimum_gpus(jobs, table, load, hours, load_basis)
        fleet = fleet.scaled(demand_gpu_hours(jobs, table, basis=load_basis) / (load * hours), minimum_gpus=minimum)
        # The same draws again on the re-sized fleet: home cluster, home run time and so the deadline must refer
        # to clusters that exist (and can host the job) in the fleet the jobs run on.
        power = load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=start)
        jobs, table = draw(fleet, power)
    end = start + (hours + tail_days * 24 + 24 * 8) * HOUR
    grid = GridSeries.load(fleet.zones, start, end, source=grid_source, data_dir=data_dir, db_path=db_path)
    if grid.t0 > start - 24 * HOUR:
        raise ValueError(f"grid data starts {grid.t0}: the naive forecast at {start} needs the day before")
    provider = make_forecasts(
        forecasts,
        grid,
        fleet.zones,
        start=start,
        end=end,
        db_path=db_path,
        data_dir=data_dir,
        model=forecast_model,
        version=forecast_version,
    )
    workload = default_workload(job_pods(jobs))
    calibration = []
    if load is not None and calibrate > 0:

        def redraw(f):
            j, t = draw(f, power)
            return j, t, default_workload(job_pods(j))

        def probe(f, j, t, w):
            return Scenario(start, hours, f, j, t, grid, provider, load, {}, w, tail_days * 24)

        fleet, jobs, table, workload, calibration = _calibrate(
            fleet, (jobs, table, workload), redraw, probe, minimum=minimum, load=load, basis=load_basis,
            rounds=int(calibrate),
        )  # fmt: skip
    config = {
        "start": start.isoformat(),
        "days": days,
        "n_jobs": int(len(jobs)),
        "n_jobs_requested": n_jobs,
        "regions": list(dict.fromkeys(fleet.cluster_regions)),
        "zones": fleet.zones,
        "load_target": load,
        "seed": seed,
        "pod_list": pod_list,
        "max_duration_h": max_duration_h,
        "packing": packing,
        "forecasts_requested": forecasts,
        "forecast_version_requested": forecast_version,
        "grid_source": grid.source,
        "fleet_file": fleet.source_path,
        "power_options": power.source,
        "speed_source": speed.source,
        "jobs_dropped": int(jobs.attrs.get("dropped", 0)) + int(jobs.attrs.get("dropped_after_scaling", 0)),
        "load_calibration": calibration,
        "load_definition": (
            "GPU-hours of the jobs as performance-first runs them / fleet GPU-hours of the period"
            if calibration
            else "GPU-hours on a GPU drawn in proportion to the clusters that can host each "
            "job / fleet GPU-hours of the period"
        ),
        "load_basis": load_basis,
        "offered_load": round(demand_gpu_hours(jobs, table, basis=load_basis) / (fleet.total_gpus * hours), 4),
        "demand_gpu_hours_fleet": round(demand_gpu_hours(jobs, table, basis=load_basis), 1),
        "demand_gpu_hours_fastest": round(demand_gpu_hours(jobs, table, on="fastest", basis=load_basis), 1),
    }
    return Scenario(start, hours, fleet, jobs, table, grid, provider, load, config, workload, tail_days * 24)


def _calibrate(fleet, drawn, redraw, probe, *, minimum, load: float, basis: str, rounds: int):
    """Performance-first on `fleet` (its trace `drawn` = (jobs, table, workload)) and up to `rounds` re-sized fleets
    (target GPUs x placed load / `load`, the trace drawn again by `redraw(fleet)`, run on `probe(...)`'s scenario);
    the fleet whose measured placed load is closest to `load` is kept. Returns (fleet, jobs, table, workload, the
    measurements with the kept one marked `used`). Stops early within CALIBRATION_TOLERANCE or when whole nodes
    bring a re-size back to a fleet already measured."""
    jobs, table, workload = drawn
    target_gpus = float(fleet.total_gpus)
    tried, seen = [], set()
    while True:
        seen.add(tuple(c.n_gpus for c in fleet.clusters))
        probe_sc = probe(fleet, jobs, table, workload)
        res = simulate(probe_sc, BASELINE)
        # The work as performance-first places it (slow GPUs included), over the fleet's GPU-hours of the period:
        # the utilisation the fleet has if it keeps up. The allocation measured inside the period is no target:
        # it saturates below 1 (packing) when the fleet cannot keep up and the queue grows.
        placed = placed_load(jobs, res.records["duration_h"].to_numpy(), fleet, probe_sc.hours, basis)
        entry = {
            "gpus": fleet.total_gpus,
            "placed_load": round(placed, 4),
            "utilization": round(res.metrics["utilization"], 4),
            "deadline_satisfaction": round(res.metrics["deadline_satisfaction"], 4),
        }
        tried.append((abs(placed - load), len(tried), (fleet, jobs, table, workload), entry))
        if abs(placed - load) < CALIBRATION_TOLERANCE or placed <= 0 or len(tried) > rounds:
            break
        target_gpus = target_gpus * placed / load
        resized = fleet.scaled(target_gpus, minimum_gpus=minimum)
        if tuple(c.n_gpus for c in resized.clusters) in seen:
            break
        fleet = resized
        jobs, table, workload = redraw(fleet)
    best = min(tried, key=lambda t: (t[0], t[1]))
    calibration = [dict(entry, used=entry is best[3]) for _, _, _, entry in tried]
    return (*best[2], calibration)


def scenario_for_jobs(
    jobs: pd.DataFrame,
    fleet: Fleet,
    start,
    hours: int,
    *,
    forecasts: str = "auto",
    speed_model: SpeedModel | None = None,
    db_path=None,
    data_dir=None,
    tail_days: int = DEFAULT_TAIL_DAYS,
) -> Scenario:
    """The scenario of given jobs (the generator's frame, e.g. `scheduling.queue.trace.trace_frame`) arriving in
    [start, start + hours) on `fleet` as it is (no load sizing): the simulator's side of a comparison with the
    operating loop on the same jobs."""
    start = utc(start).floor("h")
    speed = speed_model or SpeedModel(data_dir)
    power = load_power_table(fleet, data_dir=data_dir, db_path=db_path, as_of=start)
    table = JobTable(jobs, fleet, speed, power)
    end = start + (int(hours) + tail_days * 24 + 24 * 8) * HOUR
    grid = GridSeries.load(fleet.zones, start, end, data_dir=data_dir, db_path=db_path)
    provider = make_forecasts(forecasts, grid, fleet.zones, start=start, end=end, db_path=db_path, data_dir=data_dir)
    config = {"start": start.isoformat(), "hours": int(hours), "n_jobs": int(len(jobs)), "forecasts": provider.name}
    return Scenario(
        start,
        int(hours),
        fleet,
        jobs,
        table,
        grid,
        provider,
        None,
        config,
        default_workload(job_pods(jobs)),
        tail_days * 24,
    )
