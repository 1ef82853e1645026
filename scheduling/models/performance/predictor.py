"""The planner-facing predictor: network 1 (prior) + network 2 (refiner) + the feedback observed so far.

    predictor = PerformancePredictor.train(throughput)          # or load_latest_good("gpu-predictor")
    predictor.isolated(jobs, "v100")                            # steps/s, refined by any feedback of the job
    predictor.colocated(job_a, job_b, "p100")                   # (normalized A, normalized B)
    predictor.observe(feedback_rows)                            # online: new runtime measurements, no retraining

Jobs are described by a frame (or a dict / list of dicts) with job_type and, optionally, model_family,
batch_size, scale_factor (default 1) and consolidated (default True). Job types network 1 never saw still get a
feature-based estimate.
"""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path

import numpy as np
import pandas as pd

from scheduling.models.measured import parse_job_type
from scheduling.models.performance.features import build_tables, job_key
from scheduling.models.performance.feedback import attach_prior, feedback_cells, flag_unit_mismatch
from scheduling.models.performance.prior import PriorConfig, PriorModel
from scheduling.models.performance.refiner import Refiner, RefinerConfig

FEEDBACK_COLUMNS = [
    "job_key",
    "job_type",
    "model_family",
    "batch_size",
    "scale_factor",
    "consolidated",
    "gpu_type",
    "partner_job_type",
    "steps_per_s",
]


def as_jobs(jobs) -> pd.DataFrame:
    """Normalise a job description (DataFrame, dict, or list of dicts) to the columns network 1 needs."""
    if isinstance(jobs, dict):
        jobs = [jobs]
    frame = pd.DataFrame(jobs).reset_index(drop=True)
    if "job_type" not in frame:
        raise ValueError("a job needs a job_type (e.g. 'ResNet-50 (batch size 64)')")
    parsed = [parse_job_type(t) for t in frame.job_type]
    if "model_family" not in frame:
        frame["model_family"] = [p[0] for p in parsed]
    if "batch_size" not in frame:
        frame["batch_size"] = [p[1] for p in parsed]
    frame["scale_factor"] = frame["scale_factor"].fillna(1).astype(int) if "scale_factor" in frame else 1
    frame["consolidated"] = frame["consolidated"].fillna(True).astype(bool) if "consolidated" in frame else True
    frame["job_key"] = [job_key(t, s, c) for t, s, c in zip(frame.job_type, frame.scale_factor, frame.consolidated)]
    return frame


class PerformancePredictor:
    def __init__(
        self,
        prior: PriorModel,
        refiner: Refiner | None = None,
        feedback: pd.DataFrame | None = None,
        metadata: dict | None = None,
    ):
        self.prior = prior
        self.refiner = refiner
        self.feedback = feedback if feedback is not None else pd.DataFrame(columns=FEEDBACK_COLUMNS)
        self.metadata = metadata or {}

    # -- training ----------------------------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        throughput: pd.DataFrame,
        prior_config: PriorConfig | None = None,
        refiner_config: RefinerConfig | None = None,
        feedback_set: str = "oracle",
    ) -> PerformancePredictor:
        """Network 1 on the simulation set; network 2's kernel on the `feedback_set` measurements (jobs whose
        feedback is in another unit excluded). The feedback itself is not kept as observations: a fresh predictor
        starts from the prior and learns a job only from `observe`."""
        tables = build_tables(throughput, "simulation")
        prior = PriorModel(prior_config).fit(tables)
        refiner = None
        cells = feedback_cells(throughput, prior, feedback_set)
        flags = flag_unit_mismatch(cells) if len(cells) else pd.Series(dtype=bool)
        cells = cells[~cells.job_key.isin(flags.index[flags])]
        if len(cells):
            refiner = Refiner(refiner_config).fit(cells)
        meta = {
            "n_sim_iso": int(len(tables.iso)),
            "n_sim_pairs": int(len(tables.pairs)),
            "n_feedback_cells_for_kernel": int(len(cells)),
            "feedback_set": feedback_set,
            "excluded_feedback_jobs": sorted(flags.index[flags]) if len(flags) else [],
            "prior_final_loss": [h[-1] for h in prior.history],
            "kernel": refiner.kernel_summary() if refiner else None,
        }
        return cls(prior, refiner, metadata=meta)

    # -- feedback ----------------------------------------------------------------------------------------------
    def copy(self) -> PerformancePredictor:
        """A predictor that shares the trained networks (only read when predicting) and has its own feedback and
        metadata: `observe` on the copy leaves this one, e.g. a cached registered version, as it is."""
        return PerformancePredictor(self.prior, self.refiner, self.feedback.copy(), deepcopy(self.metadata))

    def observe(self, feedback) -> int:
        """Add runtime measurements: rows with job_type (+ job features), gpu_type, partner_job_type (None for
        isolated), steps_per_s of the job. Returns the number of stored observations. Network 1 is untouched;
        later predictions of the same job condition on everything observed."""
        frame = as_jobs(feedback)
        if "partner_job_type" not in frame:
            frame["partner_job_type"] = None
        frame["partner_job_type"] = (
            frame["partner_job_type"].astype(object).where(frame["partner_job_type"].notna(), None)
        )
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        bad = ~(pd.to_numeric(frame["steps_per_s"], errors="coerce") > 0)
        if bad.any():
            raise ValueError(f"feedback row {int(np.flatnonzero(bad)[0])}: steps_per_s must be > 0")
        frame = frame[FEEDBACK_COLUMNS]
        self.feedback = pd.concat([self.feedback, frame], ignore_index=True) if len(self.feedback) else frame
        return int(len(self.feedback))

    def refit_refiner(self, config: RefinerConfig | None = None, min_jobs: int = 3) -> bool:
        """Re-learn network 2's kernel from the feedback observed so far (e.g. nightly); network 1 untouched.
        Returns False (and keeps the current kernel) when fewer than `min_jobs` jobs have feedback."""
        if self.feedback.job_key.nunique() < min_jobs:
            return False
        cells = attach_prior(self.feedback.reset_index(drop=True), self.prior)
        self.refiner = Refiner(config or (self.refiner.config if self.refiner else None)).fit(cells)
        self.metadata["kernel"] = self.refiner.kernel_summary()
        return True

    def _refine(self, cells: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(log mean, log variance) of cells (job_key, job_type, gpu_type, partner_job_type + job features)."""
        cells = attach_prior(cells, self.prior)
        mean = cells["prior_log"].to_numpy(dtype=float).copy()
        var = np.zeros(len(cells))
        if self.refiner is None:
            return mean, var
        observed = self.feedback
        for key, idx in cells.groupby("job_key", sort=False).groups.items():
            obs = observed[observed.job_key == key]
            target = cells.loc[idx]
            if len(obs):
                obs = attach_prior(obs.reset_index(drop=True), self.prior)
            else:
                obs = target.iloc[:0].assign(residual=[])
            m, v = self.refiner.predict(obs, target)
            positions = cells.index.get_indexer(idx)
            mean[positions] += m
            var[positions] = v
        return mean, var

    # -- predictions -------------------------------------------------------------------------------------------
    def isolated(self, jobs, gpu_type, refined: bool = True) -> np.ndarray:
        """Isolated steps/s of each job on `gpu_type` (a string, or one per job)."""
        frame = as_jobs(jobs)
        frame["gpu_type"] = [gpu_type] * len(frame) if isinstance(gpu_type, str) else list(gpu_type)
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        frame["partner_job_type"] = None
        if not refined:
            return self.prior.predict_isolated(frame, frame.gpu_type.tolist())
        mean, _ = self._refine(frame)
        return np.exp(mean)

    def colocated(self, job_a, job_b, gpu_type, refined: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Normalized throughput (fraction of isolated) of A next to B and of B next to A on `gpu_type`."""
        a, b = as_jobs(job_a), as_jobs(job_b)
        gpus = [gpu_type] * len(a) if isinstance(gpu_type, str) else list(gpu_type)
        norm_a = self.prior.predict_norm(a, b, gpus)
        norm_b = self.prior.predict_norm(b, a, gpus)
        if refined and self.refiner is not None and len(self.feedback):
            norm_a = self._refined_norm(a, b, gpus, norm_a)
            norm_b = self._refined_norm(b, a, gpus, norm_b)
        return norm_a, norm_b

    def _refined_norm(self, a, b, gpus, prior_norm) -> np.ndarray:
        """Refined co-located / refined isolated (both conditioned on the job's feedback)."""
        iso = a.copy()
        iso["gpu_type"] = [g.lower() for g in gpus]
        iso["partner_job_type"] = None
        co = iso.copy()
        co["partner_job_type"] = b.job_type.to_numpy()
        mean_iso, _ = self._refine(iso)
        mean_co, _ = self._refine(co)
        return np.minimum(np.exp(mean_co - mean_iso), 1.0)

    def predict_cells(self, cells) -> pd.DataFrame:
        """For placement cells (job features, gpu_type, partner_job_type): prior and refined steps/s of the job,
        and the refined log-space standard deviation (0 without a refiner)."""
        frame = as_jobs(cells)
        if "partner_job_type" not in frame:
            frame["partner_job_type"] = None
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        mean, var = self._refine(frame)
        prior = attach_prior(frame, self.prior)["prior_log"].to_numpy()
        return frame.assign(prior_steps_per_s=np.exp(prior), steps_per_s=np.exp(mean), log_std=np.sqrt(var))

    # -- persistence (the model registry calls save/load) --------------------------------------------------------
    def save(self, directory: Path | str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.prior.save(directory)  # prior.json, prior.pt (flat: the registry checksums top-level files)
        if self.refiner is not None:
            self.refiner.save(directory)  # refiner.json, refiner.pt
        self.feedback.to_csv(directory / "feedback.csv", index=False)
        (directory / "predictor.json").write_text(json.dumps(self.metadata, indent=2, default=str))
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> PerformancePredictor:
        directory = Path(directory)
        prior = PriorModel.load(directory)
        refiner = Refiner.load(directory) if (directory / "refiner.pt").exists() else None
        feedback = pd.read_csv(directory / "feedback.csv") if (directory / "feedback.csv").exists() else None
        if feedback is not None:
            feedback["partner_job_type"] = (
                feedback["partner_job_type"].astype(object).where(feedback["partner_job_type"].notna(), None)
            )
        meta = json.loads((directory / "predictor.json").read_text()) if (directory / "predictor.json").exists() else {}
        return cls(prior, refiner, feedback if feedback is not None and len(feedback) else None, meta)
