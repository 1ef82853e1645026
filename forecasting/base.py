"""The one forecaster interface (in the style of scikit-learn / statsforecast).

Every model: `fit(history, target)` then `predict(issued_at, horizon, data)` → P10/P50/P90 per region and target
hour. `history` and `data` are frames shaped like `marts.grid_hourly` (one row per region × hour_utc; see
docs/data-contracts.md). `predict` may read from `data` only what is known at `issued_at`: target and mix values
for hours strictly before `issued_at`, and known-future inputs (calendar, weather *forecasts*) for the horizon.
`known_at` enforces that, so no model can leak the future by accident.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import pandas as pd

QUANTILES = (0.1, 0.5, 0.9)
QUANTILE_COLUMNS = ("p10", "p50", "p90")
# The columns of every frame `Forecaster.predict` returns.
OUTPUT_COLUMNS = ("region", "issued_at", "target_time", "horizon_h", *QUANTILE_COLUMNS, "model")
# Horizon buckets (hours ahead, inclusive) that metrics, weights and calibration are computed per.
HORIZON_BUCKETS = ((1, 6), (7, 24), (25, 48), (49, 96))
# Targets and the grid_hourly column each one forecasts.
TARGET_COLUMNS = {
    "carbon_intensity": "carbon_intensity_direct_gco2_per_kwh",
    "solar": "solar_mw",
    "wind": "wind_mw",
}
# Inputs that are forecasts themselves (GFS weather) or calendar: allowed for hours after issued_at.
KNOWN_FUTURE_COLUMNS = (
    "wind_speed_m_per_s",
    "temperature_k",
    "dewpoint_k",
    "dswrf_w_per_m2",
    "precipitation_kg_per_m2",
    "hour_of_day",
    "day_of_week",
    "month",
    "day_of_year",
    "is_weekend",
)


def target_column(target: str, strict: bool = False) -> str:
    """The grid_hourly column that `target` forecasts. Any other name is taken as a column itself (e.g. nat_gas_mw);
    with `strict`, it must be a target or one of their columns (ValueError otherwise)."""
    if target in TARGET_COLUMNS:
        return TARGET_COLUMNS[target]
    if strict and target not in TARGET_COLUMNS.values():
        raise ValueError(f"unknown target {target!r}; expected one of {sorted(TARGET_COLUMNS)}")
    return target


def known_at(data: pd.DataFrame, issued_at: pd.Timestamp) -> pd.DataFrame:
    """`data` as known at `issued_at`: observed columns blanked from `issued_at` on, known-future ones kept."""
    issued_at = pd.Timestamp(issued_at)
    future = data["hour_utc"] >= issued_at
    masked = data.copy()
    observed = [c for c in data.columns if c not in KNOWN_FUTURE_COLUMNS and c not in ("region", "hour_utc")]
    for column in observed:
        if masked[column].dtype == bool:
            # numpy bool cannot hold a missing value (pandas 3 raises); the nullable boolean can
            masked[column] = masked[column].astype("boolean")
        masked.loc[future, column] = np.nan if pd.api.types.is_float_dtype(masked[column]) else pd.NA
    return masked


class Forecaster(ABC):
    """fit/predict surface shared by naive, Prophet, LightGBM, TFT and the ensemble."""

    name: str = "forecaster"

    @abstractmethod
    def fit(self, history: pd.DataFrame, target: str) -> Forecaster:
        """Learn from `history` (rows with hour_utc before the training cut-off) for one target name."""

    @abstractmethod
    def predict(self, issued_at: pd.Timestamp, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        """Forecast hours issued_at … issued_at + horizon − 1 for every region in `data`.

        Returns columns: region, issued_at, target_time, horizon_h (1-based), p10, p50, p90, model.
        """

    def get_params(self) -> dict:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
