"""The trainable predictor: network 1 (prior) + network 2 (refiner) in torch + the feedback observed so far.

    predictor = PerformancePredictor.train(throughput)          # or PerformancePredictor.load(artifact_dir)
    predictor.isolated(jobs, "v100")                            # steps/s, refined by any feedback of the job
    predictor.colocated(job_a, job_b, "p100")                   # (normalized A, normalized B)
    predictor.observe(feedback_rows)                            # online: new runtime measurements, no retraining

Jobs are described by a frame (or a dict / list of dicts) with job_type and, optionally, model_family,
batch_size, scale_factor (default 1) and consolidated (default True). Job types network 1 never saw still get a
feature-based estimate. The plan predicts with the numpy `inference.PredictorRuntime` of the saved predictor
(`load_latest_good("gpu-predictor")`), which gives the same numbers without importing torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from scheduling.models.performance.features import build_tables
from scheduling.models.performance.feedback import attach_prior, feedback_cells, flag_unit_mismatch
from scheduling.models.performance.inference import FEEDBACK_COLUMNS, PredictorRuntime, as_jobs, saved_feedback
from scheduling.models.performance.prior import PriorConfig, PriorModel
from scheduling.models.performance.refiner import Refiner, RefinerConfig

__all__ = ["FEEDBACK_COLUMNS", "PerformancePredictor", "as_jobs"]


class PerformancePredictor(PredictorRuntime):
    """The predictor with the torch networks: trains them, re-fits the refiner, saves; the predictions and the
    feedback handling are `PredictorRuntime`'s (the plan loads that runtime with the numpy networks)."""

    def __init__(
        self,
        prior: PriorModel,
        refiner: Refiner | None = None,
        feedback: pd.DataFrame | None = None,
        metadata: dict | None = None,
    ):
        super().__init__(prior, refiner, feedback, metadata)

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
    def refit_refiner(self, config: RefinerConfig | None = None, min_jobs: int = 3) -> bool:
        """Re-learn network 2's kernel from the feedback observed so far (e.g. nightly); network 1 untouched.
        Returns False (and keeps the current kernel) when fewer than `min_jobs` jobs have feedback."""
        if self.feedback.job_key.nunique() < min_jobs:
            return False
        cells = attach_prior(self.feedback.reset_index(drop=True), self.prior)
        self.refiner = Refiner(config or (self.refiner.config if self.refiner else None)).fit(cells)
        self.metadata["kernel"] = self.refiner.kernel_summary()
        return True

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
        return cls(prior, refiner, *saved_feedback(directory))
