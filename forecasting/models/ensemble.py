"""A weighted ensemble of any forecasters, with conformal calibration of its P10–P90 band.

`EnsembleForecaster(members)` accepts any `Forecaster` (Prophet and TFT included). `fit(history, target)`:

1. fits a copy of every member on the history before the validation window (the last `validation_days` of history),
2. issues daily forecasts over the validation window with those copies (rolling origin, masked data) and scores them,
3. fits non-negative weights summing to one per (region, horizon bucket) by linear programming, minimising the
   validation MAPE (carbon intensity) or MAE (solar, wind) of the combined P50; the combined P10/P90 are the same
   weighted averages of the members' quantiles (quantile averaging),
4. calibrates the P10/P90 band per (region, bucket) by split-conformal quantile regression (CQR, each tail separately,
   scores normalised by the band width) to 10 % / 90 %,
5. refits the members on the whole history (`refit=True`).

With `weighting="static"` those weights and calibrations are used for every forecast. With `weighting="rolling"` the
same fit is repeated at every issue time on the `rolling_days` before it (the validation forecasts first, then the
members' own forecasts of the issues since), so the weights follow what was learnt before `issued_at` and never what
comes after. The rolling mode exists because some inputs only exist in the test period: the operators' published
day-ahead forecasts start on 2021-07-01, so a member that uses them cannot be weighed on any window before it.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from common.timeutil import HOUR
from forecasting.base import HORIZON_BUCKETS, OUTPUT_COLUMNS, Forecaster, target_column
from forecasting.data import issue_hour, issue_times, mask_known
from forecasting.models.blend import PublishedBlendForecaster  # noqa: F401 - older pickled artifacts name it here
from forecasting.models.frames import ForecastMemory, HourlyArray, bucket_of

DAY = pd.Timedelta(days=1)


def fit_weights(F: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    """Non-negative weights summing to one minimising Σ|y − F·w| (÷ y when `relative`), by linear programming."""
    n, m = F.shape
    if m == 1:
        return np.ones(1)

    scale = 1.0 / np.maximum(np.abs(y), 1e-9) if relative else np.full(n, 1.0 / max(np.mean(np.abs(y)), 1e-9))
    # variables: w (m), u (n), v (n);  F w − y = u − v;  minimise Σ scale·(u + v)
    c = np.concatenate([np.zeros(m), scale, scale])
    A_eq = np.hstack([F, -np.eye(n), np.eye(n)])
    A_eq = np.vstack([A_eq, np.concatenate([np.ones(m), np.zeros(2 * n)])])
    b_eq = np.concatenate([y, [1.0]])
    res = linprog(c, A_eq=A_eq, b_eq=b_eq, bounds=[(0, None)] * (m + 2 * n), method="highs")
    if not res.success:
        return np.full(m, 1.0 / m)
    w = np.clip(res.x[:m], 0, None)
    return w / w.sum() if w.sum() > 0 else np.full(m, 1.0 / m)


def conformal_offsets(p10, p50, p90, y, level: float = 0.8, floor: float = 1e-6) -> tuple[float, float]:
    """CQR per tail with width-normalised scores: offsets (lo, hi) so that P10' = P10 − lo·w and P90' = P90 + hi·w
    leave ~10 % of the calibration actuals below and above (finite-sample corrected); w = max(P90 − P10, floor)."""
    w = np.maximum(p90 - p10, floor)
    tail = (1 - level) / 2
    n = len(y)
    q = min(1.0, np.ceil((n + 1) * (1 - tail)) / n) if n else 1.0
    lo = float(np.quantile((p10 - y) / w, q)) if n else 0.0
    hi = float(np.quantile((y - p90) / w, q)) if n else 0.0
    return lo, hi


def apply_offsets(p10, p50, p90, lo, hi, floor, nonnegative=True):
    w = np.maximum(p90 - p10, floor)
    a = np.minimum(p10 - lo * w, p50)
    b = np.maximum(p90 + hi * w, p50)
    if nonnegative:
        a = np.clip(a, 0, None)
    return a, b


def _simplex_grid(m: int, step: float = 0.05) -> np.ndarray:
    k = int(round(1 / step))
    if m == 1:
        return np.ones((1, 1))
    rows = []

    def rec(prefix, left, depth):
        if depth == m - 1:
            rows.append(prefix + [left])
            return
        for i in range(left + 1):
            rec(prefix + [i], left - i, depth + 1)

    rec([], k, 0)
    return np.array(rows, dtype=float) / k


def fit_weights_fast(F: np.ndarray, y: np.ndarray, relative: bool) -> np.ndarray:
    """`fit_weights` by exhaustive search on a 5 % simplex grid for up to 4 members (LP beyond)."""
    m = F.shape[1]
    if m > 4:
        return fit_weights(F, y, relative)
    grid = _simplex_grid(m)
    pred = F @ grid.T  # n × g
    err = np.abs(pred - y[:, None])
    if relative:
        err = err / np.maximum(np.abs(y), 1e-9)[:, None]
    return grid[int(np.argmin(err.mean(axis=0)))]


def same_params(a: Forecaster, b: Forecaster) -> bool:
    """Same constructor parameters (fitted attributes, which end in `_`, ignored). Values without a stable repr
    (objects at an address) compare unequal, so doubt means "fit it again"."""

    def params(model):
        return json.dumps(
            {k: v for k, v in model.get_params().items() if not k.endswith("_")}, sort_keys=True, default=repr
        )

    try:
        return params(a) == params(b)
    except (TypeError, ValueError):
        return False


class EnsembleForecaster(Forecaster):
    """Weighted combination of any forecasters; weights and P10–P90 calibration fitted on a validation window."""

    name = "ensemble"

    def __init__(
        self,
        members: list[Forecaster],
        validation_days: int = 56,
        weighting: str = "rolling",
        rolling_days: int = 28,
        refit: bool = True,
        calibrate: bool = True,
        horizon: int = 96,
        issue_hour: int = 0,
        min_rows: int = 24,
        level: float = 0.82,
        name: str | None = None,
    ):
        self.members = list(members)
        # Calibration aims a little above the nominal 80 %: split-conformal on a few weeks of a drifting series
        # under-covers the weeks that follow by a few points.
        self.level = level
        self.validation_days = validation_days
        self.weighting = weighting
        self.rolling_days = rolling_days
        self.refit = refit
        self.calibrate = calibrate
        self.horizon = horizon
        self.issue_hour = issue_hour
        self.min_rows = min_rows
        if name:
            self.name = name
        self._fitted: list[Forecaster] = []
        self._memory: list[ForecastMemory] = []
        self._static: dict = {}
        self._val_issues: list = []
        self._target = None
        self._cutoff = None

    @property
    def member_names(self) -> list[str]:
        return [getattr(m, "name", type(m).__name__) for m in self.members]

    def _relative(self) -> bool:
        return str(self._target).startswith("carbon_intensity")

    def _col(self) -> str:
        return target_column(self._target)

    def fit(self, history: pd.DataFrame, target: str) -> EnsembleForecaster:
        self._target = target
        col = self._col()
        end = history["hour_utc"].max() + HOUR
        self._cutoff = end
        val_start = (end - pd.Timedelta(days=self.validation_days)).floor("D")
        train = history[history["hour_utc"] < val_start]
        self._memory = [ForecastMemory() for _ in self.members]
        issues = [T for T in issue_times(val_start, end - DAY, self.issue_hour) if T < end]
        self._val_issues = issues
        fitted_val = []
        for member, memory in zip(self.members, self._memory):
            m = copy.deepcopy(member).fit(train, target)
            fitted_val.append(m)
            for T in issues:
                window = history[
                    (history["hour_utc"] >= T - pd.Timedelta(days=40))
                    & (history["hour_utc"] < T + (self.horizon + 24) * HOUR)
                ]
                memory.put(T, m.predict(T, self.horizon, mask_known(window, T)))
        self._static = self._fit_combination(issues, history, col, before=end, H=self.horizon)
        if self.refit:
            self._fitted, self.reused_members_ = [], []
            for member in self.members:
                reused = self._offered_fit(member, target, end)
                if reused is not None:
                    self.reused_members_.append(getattr(member, "name", type(member).__name__))
                self._fitted.append(reused if reused is not None else copy.deepcopy(member).fit(history, target))
        else:
            self._fitted = fitted_val
        self._offered = []  # not part of the fitted model (nor of its artifact)
        return self

    def offer_fitted(self, fitted: list[tuple[Forecaster, str, pd.Timestamp]]) -> None:
        """Models already fitted, as (model, target, first hour not seen), e.g. by `forecasting.service.train` in
        the same run on the same frame. At the refit, a member of the same class and parameters fitted on the same
        history (same target, same end) is taken as is instead of being fitted again: single-threaded LightGBM is
        deterministic, so the ensemble is the same, and training all models costs one fit of each member less."""
        self._offered = list(fitted)

    def _offered_fit(self, member: Forecaster, target: str, end: pd.Timestamp) -> Forecaster | None:
        for model, model_target, model_end in getattr(self, "_offered", []):
            if (
                type(model) is type(member)
                and model_target == target
                and model_end == end
                and same_params(model, member)
            ):
                return copy.deepcopy(model)
        return None

    # ------------------------------------------------------------------------------------------- combination fit
    def _fit_combination(self, issues, data, col, before, H) -> dict:
        """Weights and conformal offsets per (region, bucket) from the members' forecasts of `issues`, scored on the
        actuals known before `before`."""
        out = {}
        issues = [T for T in issues if all(T in mem for mem in self._memory)]
        if not issues:
            return out
        rel = self._relative()
        M = len(self._memory)
        h = np.arange(1, H + 1)
        buckets = bucket_of(h)
        for region, part in data.groupby("region", sort=True):
            ya = HourlyArray(part[part["hour_utc"] < before], col)
            F = np.stack(
                [np.stack([mem.array(T, region, H) for mem in self._memory], axis=1) for T in issues]
            )  # W,H,M,3
            Y = np.stack([ya.take(ya.index(T) + h - 1) for T in issues])  # W,H
            for b in np.unique(buckets):
                sel = buckets == b
                f = F[:, sel].reshape(-1, M, 3)
                y = Y[:, sel].reshape(-1)
                ok = np.isfinite(y) & np.isfinite(f).all(axis=(1, 2))
                if ok.sum() < self.min_rows:
                    continue
                f, y = f[ok], y[ok]
                w = fit_weights_fast(f[:, :, 1], y, rel)
                p10, p50, p90 = f[:, :, 0] @ w, f[:, :, 1] @ w, f[:, :, 2] @ w
                floor = 0.01 * max(float(np.mean(np.abs(y))), 1e-6)
                lo, hi = (
                    conformal_offsets(p10, p50, p90, y, level=self.level, floor=floor) if self.calibrate else (0.0, 0.0)
                )
                out[(region, int(b))] = {"w": w, "lo": lo, "hi": hi, "floor": floor, "n": int(ok.sum())}
        return out

    def weights(self) -> pd.DataFrame:
        """The static (validation-window) weights per region and horizon bucket."""
        rows = []
        for (region, b), p in sorted(self._static.items()):
            lo, hi = HORIZON_BUCKETS[b]
            rows.append(
                {
                    "region": region,
                    "bucket": f"{lo}-{hi}",
                    **dict(zip(self.member_names, np.round(p["w"], 3))),
                    "conformal_lo": round(p["lo"], 3),
                    "conformal_hi": round(p["hi"], 3),
                    "n": p["n"],
                }
            )
        return pd.DataFrame(rows)

    # --------------------------------------------------------------------------------------------------- predict
    def predict(self, issued_at, horizon: int, data: pd.DataFrame) -> pd.DataFrame:
        T0 = issue_hour(issued_at)
        data = mask_known(data, T0)
        col = self._col()
        preds = []
        for m, memory in zip(self._fitted, self._memory):
            p = memory.get(m, T0, horizon, data)
            preds.append(p[p["horizon_h"] <= horizon])
        params = self._static
        if self.weighting == "rolling":
            past = [T0 - k * DAY for k in range(self.rolling_days, 0, -1)]
            for T in past:
                if T >= self._cutoff:
                    for m, mem in zip(self._fitted, self._memory):
                        mem.get(m, T, horizon, data)
            rolling = self._fit_combination(past, data, col, before=T0, H=horizon)
            params = {**self._static, **rolling}
        return self._combine(preds, params, T0, horizon)

    def _combine(self, preds: list[pd.DataFrame], params: dict, T0, horizon) -> pd.DataFrame:
        M = len(preds)
        regions = sorted(set().union(*[set(p["region"]) for p in preds if len(p)])) if preds else []
        h = np.arange(1, horizon + 1)
        buckets = bucket_of(h)
        out = []
        tmp = [ForecastMemory() for _ in preds]
        for mem, p in zip(tmp, preds):
            mem.put(T0, p)
        for region in regions:
            F = np.stack([mem.array(T0, region, horizon) for mem in tmp], axis=1)  # H,M,3
            res = np.full((horizon, 3), np.nan)
            for b in np.unique(buckets):
                rows = buckets == b
                prm = params.get((region, int(b)))
                w = prm["w"] if prm is not None else np.full(M, 1.0 / M)
                vals = F[rows]  # r,M,3
                avail = np.isfinite(vals).all(axis=2)
                ww = np.where(avail, w, 0.0)
                tot = ww.sum(axis=1, keepdims=True)
                eq = avail / np.maximum(avail.sum(axis=1, keepdims=True), 1)
                # A member without a forecast for a row: the others' weights renormalised (or an equal split).
                ww = np.where(tot > 0, ww / np.maximum(tot, 1e-12), eq)
                res[rows] = np.einsum("rm,rmq->rq", ww, np.where(np.isfinite(vals), vals, 0.0))
                res[np.flatnonzero(rows)[~avail.any(axis=1)]] = np.nan
                if prm is not None and self.calibrate:
                    lo, hi = apply_offsets(res[rows, 0], res[rows, 1], res[rows, 2], prm["lo"], prm["hi"], prm["floor"])
                    res[rows, 0], res[rows, 2] = lo, hi
            out.append(
                pd.DataFrame(
                    {
                        "region": region,
                        "issued_at": T0,
                        "target_time": T0 + (h - 1) * HOUR,
                        "horizon_h": h,
                        "p10": res[:, 0],
                        "p50": res[:, 1],
                        "p90": res[:, 2],
                        "model": self.name,
                    }
                )
            )
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=list(OUTPUT_COLUMNS))
