"""The record of one evaluated period, `Scenario`: what the simulator replays (built by `scenario.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduling.domain.fleet import Fleet
from scheduling.planning.forecasts import ForecastProvider, GridSeries
from scheduling.planning.problem import JobTable, abs_hours

DEFAULT_TAIL_DAYS = 10  # days simulated after the last arrival, for the last jobs to start and finish


@dataclass
class Scenario:
    """Everything one evaluation replays: the period (`start`, `hours` of arrivals, then `tail_hours` for the last
    jobs to finish), the fleet, the job trace and its `table`, the grid actuals, the forecast provider the policies
    plan from, the FGD target `workload` and the `config` reported with the results."""

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
        """(C,) each cluster's column in the grid's zones."""
        pos = {z: i for i, z in enumerate(self.grid.zones)}
        return np.array([pos[z] for z in self.fleet.cluster_zones], dtype=np.int64)

    def actual(self, what: str = "ci") -> tuple[int, np.ndarray]:
        """(first absolute hour, (T, C) actual values per cluster) over the grid axis."""
        arr = self.grid.ci if what == "ci" else self.grid.renewable
        return abs_hours(self.grid.t0), arr[:, self.zone_col]
