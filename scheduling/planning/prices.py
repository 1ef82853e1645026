"""Capacity prices learned from the recent past (an addition to the priority policy).

Why: a job that arrives first takes the cleanest cluster's capacity even when its carbon saving there is small,
and a later job with a large saving is pushed to a dirty region. The offline optimum avoids that because it knows
all jobs. Online, the coordinator charges each candidate window the *value of the capacity it uses*: the shadow
price (LP dual) of cluster capacity, learned from the jobs that arrived recently.

How: every `refresh_h` hours (default 24) at planning hour t, the LP relaxation of `optimum.py` is solved for the
jobs submitted in [t - window_h, t) (default 72 h), on an empty fleet, with the actual intensity of the hours
before t and the forecast known at t for later hours. The capacity duals of GPU-milli (kgCO2e per GPU-milli-hour)
of the hours before t are averaged per hour of day and cluster; until the next refresh a candidate window
[s, s + occ) on cluster c costs, in the policy's score, sum_h price[hour_of_day(h), c] x g_j on top of its
carbon. A job then takes scarce clean capacity only where its saving beats what that capacity typically saves.
Nothing after t is used: jobs are those already submitted, intensities after t are forecasts.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from scheduling.planning.lp import solve_lp

HOUR_NS = 3_600_000_000_000


class PriceLearner:
    def __init__(
        self,
        window_h: int = 72,
        refresh_h: int = 24,
        min_jobs: int = 20,
        time_limit_s: float = 60.0,
        scale: float = 1.0,
        capacity_factor: float = 1.0,
    ):
        self.scale = scale
        self.capacity_factor = capacity_factor
        self.window_h = window_h
        self.refresh_h = refresh_h
        self.min_jobs = min_jobs
        self.time_limit_s = time_limit_s
        self.profile: np.ndarray | None = None  # (24, C) kg per GPU-milli-hour by hour of day
        self.last_refresh: int | None = None
        self.history: list[dict] = []

    def prices(self, now_h: int, hours: int) -> np.ndarray | None:
        if self.profile is None:
            return None
        return self.scale * self.profile[(now_h + np.arange(hours)) % 24]

    def maybe_refresh(self, now_h: int, table, forecast_at, actual_ci) -> None:
        """`forecast_at(now, hours) -> (hours, C)`; `actual_ci(start_h, hours) -> (hours, C)` (hours < now only
        are requested)."""
        if self.last_refresh is not None and now_h - self.last_refresh < self.refresh_h:
            return
        self.last_refresh = now_h
        t0 = time.perf_counter()
        ts = now_h - self.window_h
        idx = np.flatnonzero((table.submit_h >= ts) & (table.submit_h < now_h))
        if len(idx) < self.min_jobs:
            return
        dmax = float(np.where(np.isfinite(table.dur[idx]), table.dur[idx], 0).max())
        H = int(self.window_h + np.ceil(dmax) + 24)
        past = actual_ci(ts, self.window_h)
        future = forecast_at(pd.Timestamp(now_h * HOUR_NS, tz="UTC"), H - self.window_h)
        ci = np.vstack([past, future])
        free = np.repeat((table.fleet.capacity_milli * self.capacity_factor).astype(np.int64)[None, :], H, axis=0)
        prob = table.problem(
            pd.Timestamp(ts * HOUR_NS, tz="UTC"),
            idx,
            free,
            ci,
            power_aware=True,
            release=np.maximum(table.submit_h[idx] - ts, 0),
            forecast_version="price-learning",
        )
        lp = solve_lp(prob, time_limit_s=self.time_limit_s)
        if lp.duals is None or lp.status != "optimal":
            self.history.append({"hour": int(now_h), "status": lp.status, "jobs": int(len(idx))})
            return
        du = lp.duals[0][: self.window_h]  # (W, C) kg per GPU-milli-hour
        hod = (ts + np.arange(self.window_h)) % 24
        prof = np.zeros((24, du.shape[1]))
        for h in range(24):
            sel = hod == h
            if sel.any():
                prof[h] = du[sel].mean(axis=0)
        self.profile = np.maximum(prof, 0.0)
        self.history.append(
            {
                "hour": int(now_h),
                "status": lp.status,
                "jobs": int(len(idx)),
                "solve_s": round(time.perf_counter() - t0, 3),
                "mean_price_kg_per_gpu_h": (1000 * self.profile.mean(axis=0)).round(5).tolist(),
            }
        )
