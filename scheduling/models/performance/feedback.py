"""Runtime feedback cells: the second, noisy measurement set (Gavel's oracle run) against network 1's prior.

A feedback *cell* is one placement of a job that was measured at runtime: (job, GPU type, partner or none) with
the observed steps/s of the job. `feedback_cells` attaches network 1's prior (log isolated throughput, log
normalized throughput) and the residual log(observed) - prior log, which is what network 2 learns from.

Data quality: Gavel's oracle file reports Recommendation jobs in a different unit than the simulation file
(oracle/simulation isolated ratio 0.004-0.21 and shrinking with batch size; every other job type is within
0.58-3.7). `flag_unit_mismatch` marks jobs whose median isolated observed/prior ratio is outside
[1/UNIT_RATIO, UNIT_RATIO]; protocol 3 reports them separately instead of letting a unit error dominate a MAPE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from scheduling.models.measured import parse_job_type
from scheduling.models.performance.features import GPU_TYPES, job_key

if TYPE_CHECKING:  # any network 1 with predict_log_isolated / predict_log_norm: torch's or the numpy runtime's
    from scheduling.models.performance.prior import PriorModel

UNIT_RATIO = 4.0


def feedback_cells(throughput: pd.DataFrame, prior: PriorModel, measurement_set: str = "oracle") -> pd.DataFrame:
    """One row per feasible measured cell of `measurement_set`, 1-GPU jobs, with the prior attached."""
    frame = throughput[
        (throughput["measurement_set"] == measurement_set)
        & throughput["feasible"]
        & throughput["gpu_type"].isin(GPU_TYPES)
        & (throughput["steps_per_s"] > 0)
    ]
    frame = frame[(frame["scale_factor"] == 1) & frame["consolidated"].astype(bool)].copy()
    frame = frame[frame["partner_job_type"].isna() | (frame["partner_scale_factor"].fillna(1) == 1)]
    frame["job_key"] = [job_key(t, 1, True) for t in frame["job_type"]]
    frame["partner_job_type"] = frame["partner_job_type"].astype(object).where(frame["partner_job_type"].notna(), None)
    return attach_prior(frame.reset_index(drop=True), prior)


def attach_prior(cells: pd.DataFrame, prior: PriorModel) -> pd.DataFrame:
    """Add prior_log_iso, prior_log_norm (0 isolated), prior_log and, where steps_per_s is known, residual."""
    cells = cells.copy()
    jobs = cells[["job_type"]].copy()
    for column, default in (
        ("model_family", None),
        ("batch_size", np.nan),
        ("scale_factor", 1),
        ("consolidated", True),
    ):
        jobs[column] = cells[column] if column in cells else default
    cells["prior_log_iso"] = prior.predict_log_isolated(jobs, cells["gpu_type"].tolist())
    co = cells["partner_job_type"].map(lambda p: isinstance(p, str) and p != "").to_numpy()
    cells["prior_log_norm"] = 0.0
    if co.any():
        partners = pd.DataFrame(
            {"job_type": cells.loc[co, "partner_job_type"].to_numpy(), "scale_factor": 1, "consolidated": True}
        )

        partners["model_family"] = [parse_job_type(p)[0] for p in partners.job_type]
        partners["batch_size"] = [parse_job_type(p)[1] for p in partners.job_type]
        cells.loc[co, "prior_log_norm"] = prior.predict_log_norm(
            jobs[co].reset_index(drop=True), partners, cells.loc[co, "gpu_type"].tolist()
        )
    cells["prior_log"] = cells["prior_log_iso"] + cells["prior_log_norm"]
    if "steps_per_s" in cells:
        cells["residual"] = np.log(cells["steps_per_s"].to_numpy(dtype=float)) - cells["prior_log"]
    return cells


def flag_unit_mismatch(cells: pd.DataFrame, ratio: float = UNIT_RATIO) -> pd.Series:
    """job_key -> True where the job's median isolated residual says the feedback is in another unit."""
    iso = cells[cells["partner_job_type"].isna()]
    median = iso.groupby("job_key")["residual"].median()
    flags = median.abs() > np.log(ratio)
    return flags.reindex(sorted(cells["job_key"].unique()), fill_value=False)
