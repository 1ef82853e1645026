"""The explainer interface: turn a decision's explanation record into the card text an operator reads.

The record is the planner's explanation record (docs/data-contracts.md, "Planning"): `job_id`, `priority`,
`urgency`, `flexibility`, `opportunity`, `weights`, `chosen` {region, cluster, start_time, kgco2e}, `alternatives`
(top five: region, start_time, kgco2e), `counterfactuals` {run_now_kgco2e, greedy_carbon_kgco2e, optimum_kgco2e},
`binding_constraints`, `forecast_version`, `power` {limit_w, saving_kgco2e}. Missing keys are written as "n/a".
"""

from __future__ import annotations

from typing import Protocol


class Explainer(Protocol):
    def explain(self, record: dict) -> str:  # pragma: no cover - interface
        """The card text of one explanation record."""
