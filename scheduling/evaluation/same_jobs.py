"""The simulator's side of a comparison with the operating loop: the loop's demo jobs (`scheduling.queue.trace`)
replayed by the simulator on the same fleet, valued against the carbon ledger's run-now counterfactual."""

from __future__ import annotations

import numpy as np

from common.timeutil import utc
from scheduling.evaluation.scenario import scenario_for_jobs
from scheduling.evaluation.simulator import run_now, simulate
from scheduling.queue.trace import trace_frame


def simulate_same_jobs(
    day,
    n_jobs: int,
    fleet,
    policies,
    job_ids=None,
    *,
    speed_model=None,
    forecasts="auto",
    held=None,
    db_path=None,
    data_dir=None,
) -> list[dict]:
    """One row per policy: the simulator's run of the loop's jobs (the same trace draw, on the same fleet, planned
    from the stored forecasts), valued against the same run-now counterfactual as the ledger, summed over
    `job_ids` (the intake's ids, e.g. the jobs the ledger counts as finished; default all). `speed_model`: the
    run-time speeds (default Gavel's measured ones; the plans' own for a like-for-like comparison); `forecasts`: the
    provider kind (`scheduling.planning.forecasts.make_forecasts`); `held`: the capacity the loop's services held
    (`scheduling.service_hours.service_replicas`), held in the simulator too: both plan the jobs on the same GPUs."""
    jobs = trace_frame(day, n_jobs, fleet, data_dir=data_dir)
    sc = scenario_for_jobs(
        jobs, fleet, day, 24, forecasts=forecasts, speed_model=speed_model, db_path=db_path, data_dir=data_dir
    )
    intake_ids = f"{utc(day):%Y%m%d}-" + jobs["job_id"].astype(str)
    keep = intake_ids.isin(set(job_ids)).to_numpy() if job_ids is not None else np.ones(len(jobs), dtype=bool)
    base = float(run_now(sc)["kg"][keep].sum())
    rows = []
    for policy in policies:
        result = simulate(sc, policy, held=held)
        kg = float(result.records["kgco2e"].to_numpy()[keep].sum())
        rows.append(
            {
                "policy": policy,
                "jobs": int(keep.sum()),
                "deadlines_met_pct": round(100 * float(result.records["met_deadline"].to_numpy()[keep].mean()), 2),
                "kgco2e": round(kg, 3),
                "run_now_kgco2e": round(base, 3),
                "saving_pct": round(100 * (1 - kg / base), 2) if base else None,
            }
        )
    return rows
