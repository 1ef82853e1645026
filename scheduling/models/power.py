"""GPU power model (CA-RM style power/frequency scaling): time, power and energy per epoch of a job at each
power limit (or SM clock) of its GPU.

Data: Zeus power-limit sweeps (marts.gpu_energy_profiles): per GPU type x workload (network/dataset, batch size,
optimizer) the time per epoch and average power at every power limit (25 W steps).

Model. For a measured configuration the curve is the measurement. For a batch size that was not measured, the
curve is interpolated from the same workload's other batch sizes (`interpolate_batch_size`):
  * energy per epoch is modelled directly, as level (geometric mean over the limits) x shape (over the limits).
    Between measured sizes the level follows E(bs) = c0/bs + c1 + c2 bs per sample (per-step overhead,
    per-sample work, a per-sample cost growing with the batch), fitted exactly through the windows of 3
    consecutive sizes that bracket the new one, averaged in log; beyond them E(bs) = c0/bs + c1 through the 2
    nearest sizes. The shape is interpolated in log2 batch size (held flat at the ends);
  * average power: level linear in log2 batch size (extrapolated linearly), shape as for energy;
  * time per epoch = energy / power.
For a workload that was never profiled, the *default curve* of the GPU type is used: the median over its
profiled workloads of time/time-at-max-limit and power/max-limit as functions of limit/max-limit, scaled by the
job's duration at the maximum limit (which the caller passes, e.g. from the throughput predictor).

GPU types outside Zeus are mapped through `scheduling.domain.gpus.GPU_MAP` onto a profiled type's *relative* curve and
rescaled to their own power-limit range; types without a sensible match use the default curve (median of all
four profiled GPU types).

Clock-indexed variant: `fit_clock_model(telemetry)` fits the same decision inputs indexed by SM clock from
raw.gpu_telemetry-shaped frames (power vs clock, and time vs clock where a work-rate column exists):
  power(f) = p_static + p_dyn (f/f_max)^gamma,  time(f)/time(f_max) = alpha f_max/f + (1 - alpha).

The carbon-optimal setting of a job is chosen in `scheduling.planning.power_choice`; the model's evaluation is
`scheduling.evaluation.power_eval`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from scheduling.domain.gpus import DEFAULT_CURVE, GPU_MAP, GpuSpec, gpu_map_table, map_gpu_type, normalize_gpu_name
from scheduling.models.measured import energy_profiles_from_files, load_energy_profiles


def energy_profiles(db_path=None, data_dir=None) -> pd.DataFrame:
    """marts.gpu_energy_profiles (file fallback): the sweep table the model is built from."""
    return load_energy_profiles(db_path, fallback=True, data_dir=data_dir)


# --- interpolation over batch sizes ----------------------------------------------------------------------------


def _extrap(x0: float, xs: np.ndarray, ys: np.ndarray, flat_ends: bool = False) -> float:
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    if len(xs) == 1:
        return float(ys[0])
    if x0 < xs[0]:
        return float(ys[0] if flat_ends else ys[0] + (ys[1] - ys[0]) / (xs[1] - xs[0]) * (x0 - xs[0]))
    if x0 > xs[-1]:
        return float(ys[-1] if flat_ends else ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x0 - xs[-1]))
    return float(np.interp(x0, xs, ys))


def _three_term_fit(bs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative c in y(bs) = c0/bs + c1 + c2*bs, least squares in relative error (exact through 3 points when
    the exact solution is non-negative)."""
    a = np.c_[1.0 / bs, np.ones_like(bs), bs] / y[:, None]
    coef, _ = nnls(a, np.ones_like(bs))
    return coef


def _three_term_level(batch_size: float, bs: np.ndarray, level: np.ndarray) -> float:
    """Log level (geometric mean over the limits) of energy per epoch at `batch_size` from the other batch sizes.

    Inside the measured range an epoch of N samples costs N (c0/bs + c1 + c2 bs): per-step overhead, per-sample
    work, and a per-sample cost that grows with the batch (memory pressure; Zeus' deepspeech2 and shufflenet
    curves turn up at large batches). The form is fitted exactly through each of the (up to two) windows of 3
    consecutive measured sizes that bracket `batch_size`, averaged in log. Outside the range only the two-term
    law c0/bs + c1 (linear in 1/bs through the 2 nearest sizes): the third term extrapolates wildly where sizes
    are far apart (leave-two-out check in power_eval). Chosen over linear-in-1/bs everywhere (the previous
    model), log-log, PCHIP/Akima/cubic and global 2-3 term fits on both protocols of power_eval."""
    order = np.argsort(bs, kind="stable")
    bs, y = bs[order], np.exp(level[order])
    n = len(bs)
    j = int(np.searchsorted(bs, batch_size))  # sizes below batch_size
    if n < 3 or not 0 < j < n:  # extrapolation (or too few sizes): linear in 1/bs
        value = _extrap(1.0 / batch_size, 1.0 / bs, y)
        return math.log(max(value, 1e-3 * float(y.min())))
    logs = []
    for lo in (j - 2, j - 1):
        if lo < 0 or lo + 3 > n:
            continue
        coef = _three_term_fit(bs[lo : lo + 3], y[lo : lo + 3])
        value = float(coef @ np.array([1.0 / batch_size, 1.0, batch_size]))
        if value > 0:
            logs.append(math.log(value))
    if not logs:  # nnls found only the zero solution: linear in 1/bs between the neighbours
        return math.log(max(_extrap(1.0 / batch_size, 1.0 / bs, y), 1e-3 * float(y.min())))
    return float(np.mean(logs))


def interpolate_batch_size(sweep: pd.DataFrame, batch_size: float) -> pd.DataFrame:
    """Time, power and energy per limit for `batch_size` from one workload's sweeps at other batch sizes.

    Energy per epoch is modelled directly (its errors are what the carbon decision pays for; modelling time and
    power separately and multiplying compounds two level errors): log energy = level + shape(limit), the level
    from the three-term batch-size law (`_three_term_level`), the shape interpolated linearly in log2 batch size
    (flat beyond the measured sizes). Average power: level linear in log2 batch size (extrapolated linearly), shape
    as for energy. Time per epoch = energy / power.

    sweep: batch_size, power_limit_w, time_per_epoch_s, avg_power_w (one GPU type, workload, optimizer)."""
    limits = sorted(sweep.power_limit_w.unique())
    out = pd.DataFrame({"power_limit_w": np.array(limits, dtype=float)})
    sweep = sweep.assign(energy_per_epoch_j=sweep.time_per_epoch_s * sweep.avg_power_w)
    x0 = math.log2(batch_size)
    for column in ("energy_per_epoch_j", "avg_power_w"):
        wide = sweep.pivot_table(index="batch_size", columns="power_limit_w", values=column).dropna()
        if wide.empty:
            raise ValueError("no batch size has a complete power-limit sweep")
        log_wide = np.log(wide)
        level = log_wide.mean(axis=1)
        shape = log_wide.sub(level, axis=0)
        bs = wide.index.to_numpy(dtype=float)
        if column == "energy_per_epoch_j":
            lvl = _three_term_level(float(batch_size), bs, level.to_numpy())
        else:
            lvl = _extrap(x0, np.log2(bs), level.to_numpy())
        values = [
            lvl + _extrap(x0, np.log2(bs), shape[pl].to_numpy(), flat_ends=True) if pl in shape.columns else np.nan
            for pl in limits
        ]
        out[column] = np.exp(values)
    out["time_per_epoch_s"] = out.energy_per_epoch_j / out.avg_power_w
    return out[["power_limit_w", "time_per_epoch_s", "avg_power_w", "energy_per_epoch_j"]]


# --- the model -------------------------------------------------------------------------------------------------


def _workload_name(workload: str | None) -> str | None:
    return None if workload is None else str(workload).strip().lower()


@dataclass
class PowerModel:
    """Energy/duration per power limit for (GPU type, workload). Build with `PowerModel(profiles)` where profiles
    is marts.gpu_energy_profiles (or `PowerModel.from_files()` / `PowerModel.from_warehouse()`)."""

    profiles: pd.DataFrame
    clock_model: ClockModel | None = None
    default_curves: dict = field(default_factory=dict)

    def __post_init__(self):
        frame = self.profiles.copy()
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        frame["workload"] = frame["workload"].str.lower()
        self.profiles = frame
        self.default_curves = self._default_curves()

    @classmethod
    def from_files(cls, data_dir=None) -> PowerModel:
        return cls(energy_profiles_from_files(data_dir))

    @classmethod
    def from_warehouse(cls, db_path=None) -> PowerModel:
        return cls(load_energy_profiles(db_path))

    # relative curves: limit fraction -> (time ratio, power fraction of max limit)
    def _relative(self, frame: pd.DataFrame) -> pd.DataFrame:
        key = ["gpu_type", "workload", "optimizer", "batch_size"]
        frame = frame.copy()
        frame["frac"] = frame.power_limit_w / frame.max_power_limit_w
        at_max = frame[frame.power_limit_w == frame.max_power_limit_w].set_index(key).time_per_epoch_s
        frame["time_ratio"] = (
            frame.time_per_epoch_s.to_numpy() / at_max.reindex(pd.MultiIndex.from_frame(frame[key])).to_numpy()
        )
        frame["power_frac"] = frame.avg_power_w / frame.max_power_limit_w
        return frame

    def _default_curves(self) -> dict:
        rel = self._relative(self.profiles)
        grid = np.round(np.linspace(0.3, 1.0, 15), 4)
        curves = {}

        def curve_of(part: pd.DataFrame) -> dict:
            t, p = [], []
            for _cfg, g in part.groupby(["workload", "optimizer", "batch_size"], sort=True):
                g = g.sort_values("frac")
                t.append(np.interp(grid, g.frac.to_numpy(), g.time_ratio.to_numpy()))
                p.append(np.interp(grid, g.frac.to_numpy(), g.power_frac.to_numpy()))
            return {
                "frac": grid.tolist(),
                "time_ratio": np.median(t, axis=0).tolist(),
                "power_frac": np.median(p, axis=0).tolist(),
                "min_frac": float(part.frac.min()),
            }

        for gpu, part in rel.groupby("gpu_type"):
            curves[gpu] = curve_of(part)
        # the default curve: median over the per-GPU curves
        curves[DEFAULT_CURVE] = {
            "frac": grid.tolist(),
            "time_ratio": np.median([curves[g]["time_ratio"] for g in curves], axis=0).tolist(),
            "power_frac": np.median([curves[g]["power_frac"] for g in curves], axis=0).tolist(),
            "min_frac": float(np.median([curves[g]["min_frac"] for g in curves])),
        }
        return curves

    def workloads(self, gpu_type: str | None = None) -> list[str]:
        frame = (
            self.profiles if gpu_type is None else self.profiles[self.profiles.gpu_type == map_gpu_type(gpu_type).curve]
        )
        return sorted(frame.workload.unique())

    def curve(
        self, gpu_type: str, workload: str, batch_size: float | None = None, optimizer: str | None = None
    ) -> pd.DataFrame:
        """Per-epoch time/power/energy per limit of a profiled workload on a profiled (or mapped) GPU type.
        A batch size without a measurement is interpolated (see module docstring); None = the workload's median
        batch size. Raises KeyError when the workload was never profiled on that curve's GPU type."""
        spec = map_gpu_type(gpu_type)
        source = spec.curve
        wl = _workload_name(workload)
        part = self.profiles[(self.profiles.gpu_type == source) & (self.profiles.workload == wl)]
        if part.empty:
            raise KeyError(f"workload {workload!r} not profiled on {source!r}")
        if optimizer is not None:
            part = part[part.optimizer == optimizer]
        else:
            part = part[part.optimizer == sorted(part.optimizer.unique())[0]]
        sizes = np.sort(part.batch_size.unique())
        if batch_size is None:
            batch_size = float(sizes[len(sizes) // 2])
        if float(batch_size) in set(sizes.astype(float)):
            out = part[part.batch_size == batch_size][
                ["power_limit_w", "time_per_epoch_s", "avg_power_w", "energy_per_epoch_j"]
            ].sort_values("power_limit_w")
            out = out.reset_index(drop=True)
            out["source"] = "measured"
        else:
            out = interpolate_batch_size(part, float(batch_size))
            out["source"] = "interpolated_batch_size"
        if source != normalize_gpu_name(gpu_type):
            out = self._rescale(out, source, spec)
        return out

    def _rescale(self, curve: pd.DataFrame, source: str, spec: GpuSpec) -> pd.DataFrame:
        """A profiled curve moved onto another GPU's limit range by limit fraction (time ratios kept)."""
        source_max = GPU_MAP[source].max_limit_w
        frac = curve.power_limit_w / source_max
        out = curve.copy()
        out["power_limit_w"] = np.round(frac * spec.max_limit_w, 1)
        out["avg_power_w"] = curve.avg_power_w / source_max * spec.max_limit_w
        out = out[out.power_limit_w >= spec.min_limit_w - 1e-9].reset_index(drop=True)
        out["energy_per_epoch_j"] = out.time_per_epoch_s * out.avg_power_w
        out["source"] = out["source"] + f"|mapped:{source}"
        return out

    def default_options(
        self, gpu_type: str, work_units: float, time_per_unit_at_max_s: float, power_at_max_w: float | None = None
    ) -> pd.DataFrame:
        """Options from the GPU type's default (median) relative curve for a workload never profiled."""
        spec = map_gpu_type(gpu_type)
        curve = self.default_curves.get(spec.curve, self.default_curves[DEFAULT_CURVE])
        frac = np.asarray(curve["frac"])
        keep = frac >= max(curve["min_frac"], spec.min_limit_w / spec.max_limit_w) - 1e-9
        frac = frac[keep]
        time_ratio = np.asarray(curve["time_ratio"])[keep]
        power_frac = np.asarray(curve["power_frac"])[keep]
        power = power_frac * spec.max_limit_w
        if power_at_max_w is not None:  # the job's own power at full limit: scale, never above the limit
            power = np.minimum(power * power_at_max_w / (power_frac[-1] * spec.max_limit_w), frac * spec.max_limit_w)
        duration = work_units * time_per_unit_at_max_s * time_ratio
        return pd.DataFrame(
            {
                "power_limit_w": np.round(frac * spec.max_limit_w, 1),
                "duration_s": duration,
                "energy_j": duration * power,
                "avg_power_w": power,
            }
        )

    def options(
        self,
        gpu_type: str,
        workload: str | None = None,
        work_units: float = 1.0,
        batch_size: float | None = None,
        optimizer: str | None = None,
        time_per_unit_at_max_s: float | None = None,
        power_at_max_w: float | None = None,
        index: str = "power_limit_w",
    ) -> pd.DataFrame:
        """Every supported setting of a job: DataFrame(<index>, duration_s, energy_j, avg_power_w), one row per
        setting, ascending. `work_units` are epochs of a profiled workload, or units of `time_per_unit_at_max_s`
        (duration of one unit at the maximum limit) otherwise. If `time_per_unit_at_max_s` is given for a profiled
        workload, the curve's shape is kept and its duration rescaled to it. index="sm_clock_mhz" uses the clock
        model fitted from telemetry (`attach_clock_model`)."""
        if index == "sm_clock_mhz":
            if self.clock_model is None:
                raise ValueError("no clock model: fit one with fit_clock_model(telemetry) and attach_clock_model()")
            if time_per_unit_at_max_s is None:
                raise ValueError("the clock-indexed options need time_per_unit_at_max_s")
            return self.clock_model.options(gpu_type, work_units, time_per_unit_at_max_s, workload=workload)
        if index != "power_limit_w":
            raise ValueError(f"unknown index {index!r} (power_limit_w or sm_clock_mhz)")
        known = workload is not None and _workload_name(workload) in self.workloads(gpu_type)
        if not known:
            if time_per_unit_at_max_s is None:
                raise ValueError(
                    f"workload {workload!r} is not profiled for {gpu_type!r}: pass time_per_unit_at_max_s "
                    "(duration of one work unit at the maximum limit) to use the default curve"
                )
            return self.default_options(gpu_type, work_units, time_per_unit_at_max_s, power_at_max_w)
        curve = self.curve(gpu_type, workload, batch_size, optimizer)
        time = curve.time_per_epoch_s.to_numpy()
        if time_per_unit_at_max_s is not None:
            time = time / time[-1] * time_per_unit_at_max_s
        duration = work_units * time
        return pd.DataFrame(
            {
                "power_limit_w": curve.power_limit_w.to_numpy(dtype=float),
                "duration_s": duration,
                "energy_j": duration * curve.avg_power_w.to_numpy(),
                "avg_power_w": curve.avg_power_w.to_numpy(),
            }
        )

    def attach_clock_model(self, clock_model: ClockModel) -> PowerModel:
        self.clock_model = clock_model
        return self

    def to_dict(self) -> dict:
        return {
            "default_curves": self.default_curves,
            "gpu_map": gpu_map_table().to_dict(orient="records"),
            "clock_model": None if self.clock_model is None else self.clock_model.to_dict(),
        }

    def save(self, directory) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.profiles.to_csv(directory / "power_profiles.csv", index=False)
        (directory / "power_model.json").write_text(json.dumps(self.to_dict(), indent=2, default=float))
        return directory

    @classmethod
    def load(cls, directory) -> PowerModel:
        directory = Path(directory)
        model = cls(pd.read_csv(directory / "power_profiles.csv"))
        meta = json.loads((directory / "power_model.json").read_text())
        if meta.get("clock_model"):
            curves = {}
            for name, params in meta["clock_model"].items():
                gpu, workload = name.split("|", 1)
                curves[(gpu, None if workload == "*" else workload)] = ClockCurve(**params)
            model.clock_model = ClockModel(curves)
        return model


# --- clock-indexed variant from telemetry ------------------------------------------------------------------------


@dataclass
class ClockCurve:
    f_max_mhz: float
    clocks_mhz: list
    p_static_w: float
    p_dyn_w: float
    gamma: float
    alpha: float
    alpha_source: str
    n_samples: int

    def power(self, f) -> np.ndarray:
        return self.p_static_w + self.p_dyn_w * (np.asarray(f, dtype=float) / self.f_max_mhz) ** self.gamma

    def time_ratio(self, f) -> np.ndarray:
        return self.alpha * self.f_max_mhz / np.asarray(f, dtype=float) + (1 - self.alpha)


DEFAULT_ALPHA = 0.9  # compute-bound share of a training step when telemetry has no work rate (documented guess)


@dataclass
class ClockModel:
    curves: dict  # (gpu_model, workload or None) -> ClockCurve

    def curve_for(self, gpu_type: str, workload: str | None = None) -> ClockCurve:
        name = normalize_gpu_name(gpu_type)
        for key in ((name, workload), (name, None)):
            if key in self.curves:
                return self.curves[key]
        candidates = [c for (g, _w), c in self.curves.items() if g == name]
        if candidates:
            return candidates[0]
        raise KeyError(f"no clock curve for {gpu_type!r}")

    def options(
        self, gpu_type: str, work_units: float, time_per_unit_at_max_s: float, workload: str | None = None
    ) -> pd.DataFrame:
        curve = self.curve_for(gpu_type, workload)
        clocks = np.asarray(curve.clocks_mhz, dtype=float)
        duration = work_units * time_per_unit_at_max_s * curve.time_ratio(clocks)
        power = curve.power(clocks)
        return pd.DataFrame(
            {"sm_clock_mhz": clocks, "duration_s": duration, "energy_j": duration * power, "avg_power_w": power}
        )

    def to_dict(self) -> dict:
        return {f"{g}|{w or '*'}": c.__dict__ for (g, w), c in self.curves.items()}


def fit_clock_model(
    telemetry: pd.DataFrame,
    throughput_column: str | None = None,
    workload_column: str | None = None,
    min_util_pct: float = 50.0,
    clock_step_mhz: float = 15.0,
    min_levels: int = 3,
) -> ClockModel:
    """Fit power(clock) and time(clock) per GPU model (and workload, if `workload_column`) from telemetry.

    telemetry: raw.gpu_telemetry-shaped rows (gpu_model, power_w, sm_clock_mhz, gpu_util_pct, ...). Only busy
    samples (gpu_util_pct >= min_util_pct) are used; clocks are binned to `clock_step_mhz`. `throughput_column`
    (e.g. samples/s or steps/s of the job) gives the time-vs-clock curve; without it alpha = DEFAULT_ALPHA."""
    needed = ["gpu_model", "power_w", "sm_clock_mhz"]
    missing = [c for c in needed if c not in telemetry.columns]
    if missing:
        raise ValueError(f"telemetry lacks column(s) {missing}")
    frame = telemetry.dropna(subset=needed).copy()
    if "gpu_util_pct" in frame:
        frame = frame[frame.gpu_util_pct >= min_util_pct]
    frame = frame[(frame.sm_clock_mhz > 0) & (frame.power_w > 0)]
    frame["clock_bin"] = (frame.sm_clock_mhz / clock_step_mhz).round() * clock_step_mhz
    frame["gpu_key"] = frame.gpu_model.map(normalize_gpu_name)
    group_cols = ["gpu_key"] + ([workload_column] if workload_column else [])
    curves = {}
    for key, part in frame.groupby(group_cols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        levels = part.groupby("clock_bin").agg(power=("power_w", "median"), n=("power_w", "size"))
        if throughput_column and throughput_column in part:
            levels["rate"] = part.groupby("clock_bin")[throughput_column].median()
        if len(levels) < min_levels:
            continue
        f = levels.index.to_numpy(dtype=float)
        f_max = float(f.max())
        x = f / f_max
        best = None
        for gamma in np.linspace(1.0, 3.5, 26):  # least squares in (p_static, p_dyn) for each gamma
            a = np.c_[np.ones_like(x), x**gamma]
            coef, *_ = np.linalg.lstsq(a, levels.power.to_numpy(), rcond=None)
            err = float(np.sum((a @ coef - levels.power.to_numpy()) ** 2))
            if coef[1] > 0 and (best is None or err < best[0]):
                best = (err, gamma, coef)
        if best is None:
            continue
        _err, gamma, coef = best
        if "rate" in levels and levels.rate.notna().sum() >= 2:
            ratio = levels.rate.max() / levels.rate.to_numpy()  # time ratio vs the fastest level
            ratio = ratio / ratio[np.argmax(f)]
            u = f_max / f - 1.0
            alpha = float(np.clip(np.sum(u * (ratio - 1.0)) / max(np.sum(u * u), 1e-12), 0.0, 1.0))
            source = f"fitted from {throughput_column}"
        else:
            alpha, source = DEFAULT_ALPHA, "default (no work-rate column)"
        curves[(key[0], key[1] if len(key) > 1 else None)] = ClockCurve(
            f_max_mhz=f_max,
            clocks_mhz=sorted(f.tolist()),
            p_static_w=float(coef[0]),
            p_dyn_w=float(coef[1]),
            gamma=float(gamma),
            alpha=alpha,
            alpha_source=source,
            n_samples=int(levels.n.sum()),
        )
    if not curves:
        raise ValueError(f"no GPU model has {min_levels}+ clock levels with busy samples")
    return ClockModel(curves)
