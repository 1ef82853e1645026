"""The carbon-optimal power setting of one job: among a job's settings (power limit or SM clock, each with its
duration and energy), the one whose window emits least at the forecast intensity while meeting the deadline;
and performance per carbon of a plan."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd


class PowerChoice(NamedTuple):
    setting: float
    kgco2e: float
    duration_s: float


def _cumulative(intensity: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(intensity)])


def window_intensity_integral(intensity_by_hour, start_hour, duration_h) -> np.ndarray:
    """∫ intensity dt over [start, start + duration] in (g/kWh)·h, intensity piecewise constant per hour from
    hour 0 of the array; beyond the array the last hour's value holds. Broadcasts start and duration."""
    intensity = np.asarray(intensity_by_hour, dtype=float)
    if intensity.ndim != 1 or len(intensity) == 0 or not np.all(np.isfinite(intensity)):
        raise ValueError("intensity_by_hour must be a non-empty 1-d array of finite g/kWh values")
    cum = _cumulative(intensity)
    n = len(intensity)

    def integral_to(t):
        t = np.asarray(t, dtype=float)
        inside = np.clip(t, 0.0, n)
        hour = np.minimum(np.floor(inside).astype(int), n - 1)
        within = cum[hour] + (inside - hour) * intensity[hour]
        return within + np.maximum(t - n, 0.0) * intensity[-1]

    start = np.asarray(start_hour, dtype=float)
    return integral_to(start + np.asarray(duration_h, dtype=float)) - integral_to(start)


def carbon_kg(options: pd.DataFrame, intensity_by_hour, start_hour_offset=0.0, pue: float = 1.0) -> np.ndarray:
    """kgCO2e of every option (energy spread evenly over its duration). start_hour_offset may be an array of
    start hours: the result then has shape (len(starts), len(options))."""
    duration_h = options["duration_s"].to_numpy(dtype=float) / 3600.0
    energy_kwh = options["energy_j"].to_numpy(dtype=float) / 3.6e6
    starts = np.asarray(start_hour_offset, dtype=float)
    integral = window_intensity_integral(intensity_by_hour, starts[..., None], duration_h)
    mean_intensity = integral / np.where(duration_h > 0, duration_h, 1.0)
    return energy_kwh * pue * mean_intensity / 1000.0


def setting_column(options: pd.DataFrame) -> str:
    for column in ("power_limit_w", "sm_clock_mhz"):
        if column in options.columns:
            return column
    raise ValueError("options need a power_limit_w or sm_clock_mhz column")


def choose_power_setting(
    options: pd.DataFrame,
    intensity_by_hour,
    start_hour_offset: float = 0.0,
    deadline_s: float = math.inf,
    pue: float = 1.0,
) -> PowerChoice:
    """The setting with the least carbon among those finishing within `deadline_s` of the start. Ties go to the
    faster setting. If no setting meets the deadline, the fastest setting is returned (its duration_s > deadline_s
    tells the caller). Returns (setting, kgco2e, duration_s)."""
    if options.empty:
        raise ValueError("no options")
    column = setting_column(options)
    kg = carbon_kg(options, intensity_by_hour, start_hour_offset, pue)
    duration = options["duration_s"].to_numpy(dtype=float)
    feasible = duration <= deadline_s * (1 + 1e-12)
    if not feasible.any():
        i = int(np.argmin(duration))
    else:
        score = np.where(feasible, kg, np.inf)
        best = np.flatnonzero(score <= score.min() * (1 + 1e-9))
        i = int(best[np.argmin(duration[best])])
    return PowerChoice(float(options[column].iloc[i]), float(kg[i]), float(duration[i]))


def perf_per_carbon(work_units, kgco2e) -> np.ndarray:
    """Work done per gCO2e (work units / gram)."""
    kg = np.asarray(kgco2e, dtype=float)
    return np.asarray(work_units, dtype=float) / np.where(kg > 0, kg * 1000.0, np.nan)


def plan_perf_per_carbon(plan: pd.DataFrame, work_column: str = "work_units", carbon_column: str = "kgco2e") -> dict:
    """Plan-level performance per carbon: total work / total gCO2e (and per-job values)."""
    total_work = float(plan[work_column].sum())
    total_g = float(plan[carbon_column].sum()) * 1000.0
    return {
        "total_work_units": total_work,
        "total_gco2e": total_g,
        "work_per_gco2e": total_work / total_g if total_g > 0 else None,
        "per_job": perf_per_carbon(plan[work_column], plan[carbon_column]).tolist(),
    }
