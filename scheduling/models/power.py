"""GPU power model (CA-RM style power/frequency scaling) and the carbon-optimal setting.

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

GPU types outside Zeus are mapped through GPU_MAP (the project's only GPU -> curve mapping, below) onto a profiled type's *relative* curve and
rescaled to their own power-limit range; types without a sensible match use the default curve (median of all
four profiled GPU types).

Clock-indexed variant: `fit_clock_model(telemetry)` fits the same decision inputs indexed by SM clock from
raw.gpu_telemetry-shaped frames (power vs clock, and time vs clock where a work-rate column exists):
  power(f) = p_static + p_dyn (f/f_max)^gamma,  time(f)/time(f_max) = alpha f_max/f + (1 - alpha).

Decision: `choose_power_setting(options, intensity_by_hour, start_hour_offset, deadline_s, pue)` picks the setting
with the least carbon (energy x PUE x grid intensity over the job's own window) among those meeting the deadline.
"""
from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

ZEUS_GPU_TYPES = ("a40", "p100", "rtx6000", "v100")
DEFAULT_CURVE = "default"


@dataclass(frozen=True)
class GpuSpec:
    """How a GPU model is modelled: the Zeus type whose relative curves it borrows (or 'default') and its own
    power-limit range in W (per GPU as the scheduler sees it)."""

    curve: str
    min_limit_w: float
    max_limit_w: float
    note: str


# THE GPU-model -> power-curve mapping of the project (single source of truth: the planner's power options and
# the fleet's `GpuModel.power_profile` read it from here; fleet.yaml no longer names curves). It lives here rather than
# in fleet.yaml because the power model must map any GPU name it meets (telemetry, job specs, models outside the
# fleet), not only the fleet's models. Nearest Zeus-profiled type by architecture / class. Limits: vendor board
# power; the minimum settable limit where known, else ~40 % of max (the Zeus sweeps span 33-50 % .. 100 %).
GPU_MAP: dict[str, GpuSpec] = {
    "a40": GpuSpec("a40", 100, 300, "profiled (Zeus)"),
    "v100": GpuSpec("v100", 100, 250, "profiled (Zeus, PCIe 250 W)"),
    "rtx6000": GpuSpec("rtx6000", 100, 260, "profiled (Zeus, Quadro RTX 6000)"),
    "p100": GpuSpec("p100", 125, 250, "profiled (Zeus)"),
    "v100m16": GpuSpec("v100", 150, 300, "V100 SXM2 16 GB (openb/PAI) -> V100 curve, 300 W board"),
    "v100m32": GpuSpec("v100", 150, 300, "V100 SXM2 32 GB (openb/PAI) -> V100 curve, 300 W board"),
    "v100-sxm2": GpuSpec("v100", 150, 300, "V100 SXM2 -> V100 curve"),
    "k80": GpuSpec("p100", 100, 150, "Kepler K80 (one GK210 of the board) -> P100 curve (nearest older datacenter type)"),
    "k40m": GpuSpec("p100", 180, 235, "Kepler K40m -> P100 curve"),
    "m60": GpuSpec("p100", 112, 150, "Maxwell M60 (one GPU of the board) -> P100 curve"),
    "misc": GpuSpec("p100", 100, 150, "PAI MISC (K40m/K80/M60) -> P100 curve"),
    "t4": GpuSpec("rtx6000", 60, 70, "Turing T4 -> Quadro RTX 6000 curve (same architecture)"),
    "rtx2080ti": GpuSpec("rtx6000", 100, 250, "Turing RTX 2080 Ti -> Quadro RTX 6000 curve"),
    "a10": GpuSpec("a40", 100, 150, "Ampere A10 (GA102, as A40) -> A40 curve"),
    "a100": GpuSpec("a40", 150, 400, "Ampere A100 SXM -> A40 curve (nearest architecture)"),
    "a100-80gb": GpuSpec("a40", 150, 400, "Ampere A100 80 GB -> A40 curve"),
    "h100": GpuSpec("a40", 200, 700, "Hopper H100 SXM -> A40 curve (no Hopper profile; approximate)"),
    "g1": GpuSpec(DEFAULT_CURVE, 100, 250, "openb undisclosed model -> default curve, 250 W assumed"),
    # G2/G3 are undisclosed too, but fleet.yaml already describes them as V100-class (300 W, speed 1.0) and
    # A100-class (400 W, speed 1.3); their curves follow the same assumption so one GPU is not two different GPUs.
    "g2": GpuSpec("v100", 150, 300, "openb undisclosed model, V100-class in fleet.yaml -> V100 curve, 300 W"),
    "g3": GpuSpec("a40", 150, 400, "openb undisclosed model, A100-class in fleet.yaml -> A40 curve (as a100), 400 W"),
}
UNKNOWN_SPEC = GpuSpec(DEFAULT_CURVE, 100, 250, "unknown model -> default curve, 100-250 W assumed")


def normalize_gpu_name(gpu_type: str) -> str:
    name = str(gpu_type).strip().lower().replace("nvidia ", "").replace("tesla ", "").replace("quadro ", "")
    name = name.replace(" ", "").replace("_", "-")
    aliases = {"v100-16gb": "v100m16", "v100-32gb": "v100m32", "rtx-6000": "rtx6000", "rtx6000-24gb": "rtx6000",
               "a100-sxm4-40gb": "a100", "a100-sxm4-80gb": "a100-80gb", "h100-80gbhbm3": "h100", "h100-sxm": "h100"}
    return aliases.get(name, name)


def map_gpu_type(gpu_type: str) -> GpuSpec:
    """The spec (curve source, limit range) for any GPU model name; unknown names get the default curve."""
    return GPU_MAP.get(normalize_gpu_name(gpu_type), UNKNOWN_SPEC)


def gpu_map_table() -> pd.DataFrame:
    rows = [dict(gpu_type=k, curve=v.curve, min_limit_w=v.min_limit_w, max_limit_w=v.max_limit_w, note=v.note)
            for k, v in GPU_MAP.items()]
    return pd.DataFrame(rows)


def energy_profiles(db_path=None, data_dir=None) -> pd.DataFrame:
    """marts.gpu_energy_profiles (file fallback): the sweep table the model is built from."""
    from scheduling.models.measured import load_energy_profiles

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
    from scipy.optimize import nnls

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
        coef = _three_term_fit(bs[lo:lo + 3], y[lo:lo + 3])
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
        values = [lvl + _extrap(x0, np.log2(bs), shape[pl].to_numpy(), flat_ends=True)
                  if pl in shape.columns else np.nan for pl in limits]
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
    clock_model: "ClockModel | None" = None
    default_curves: dict = field(default_factory=dict)

    def __post_init__(self):
        frame = self.profiles.copy()
        frame["gpu_type"] = frame["gpu_type"].str.lower()
        frame["workload"] = frame["workload"].str.lower()
        self.profiles = frame
        self.default_curves = self._default_curves()

    @classmethod
    def from_files(cls, data_dir=None) -> "PowerModel":
        from scheduling.models.measured import energy_profiles_from_files

        return cls(energy_profiles_from_files(data_dir))

    @classmethod
    def from_warehouse(cls, db_path=None) -> "PowerModel":
        from scheduling.models.measured import load_energy_profiles

        return cls(load_energy_profiles(db_path))

    # relative curves: limit fraction -> (time ratio, power fraction of max limit)
    def _relative(self, frame: pd.DataFrame) -> pd.DataFrame:
        key = ["gpu_type", "workload", "optimizer", "batch_size"]
        frame = frame.copy()
        frame["frac"] = frame.power_limit_w / frame.max_power_limit_w
        at_max = frame[frame.power_limit_w == frame.max_power_limit_w].set_index(key).time_per_epoch_s
        frame["time_ratio"] = frame.time_per_epoch_s.to_numpy() / at_max.reindex(
            pd.MultiIndex.from_frame(frame[key])).to_numpy()
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
            return {"frac": grid.tolist(), "time_ratio": np.median(t, axis=0).tolist(),
                    "power_frac": np.median(p, axis=0).tolist(), "min_frac": float(part.frac.min())}

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
        frame = self.profiles if gpu_type is None else self.profiles[self.profiles.gpu_type == map_gpu_type(gpu_type).curve]
        return sorted(frame.workload.unique())

    def curve(self, gpu_type: str, workload: str, batch_size: float | None = None,
              optimizer: str | None = None) -> pd.DataFrame:
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
            out = part[part.batch_size == batch_size][["power_limit_w", "time_per_epoch_s", "avg_power_w",
                                                         "energy_per_epoch_j"]].sort_values("power_limit_w")
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

    def default_options(self, gpu_type: str, work_units: float, time_per_unit_at_max_s: float,
                        power_at_max_w: float | None = None) -> pd.DataFrame:
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
        return pd.DataFrame({"power_limit_w": np.round(frac * spec.max_limit_w, 1), "duration_s": duration,
                             "energy_j": duration * power, "avg_power_w": power})

    def options(self, gpu_type: str, workload: str | None = None, work_units: float = 1.0,
                batch_size: float | None = None, optimizer: str | None = None,
                time_per_unit_at_max_s: float | None = None, power_at_max_w: float | None = None,
                index: str = "power_limit_w") -> pd.DataFrame:
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
            return self.clock_model.options(gpu_type, work_units, time_per_unit_at_max_s,
                                            workload=workload)
        if index != "power_limit_w":
            raise ValueError(f"unknown index {index!r} (power_limit_w or sm_clock_mhz)")
        known = workload is not None and _workload_name(workload) in self.workloads(gpu_type)
        if not known:
            if time_per_unit_at_max_s is None:
                raise ValueError(f"workload {workload!r} is not profiled for {gpu_type!r}: pass time_per_unit_at_max_s "
                                 "(duration of one work unit at the maximum limit) to use the default curve")
            return self.default_options(gpu_type, work_units, time_per_unit_at_max_s, power_at_max_w)
        curve = self.curve(gpu_type, workload, batch_size, optimizer)
        time = curve.time_per_epoch_s.to_numpy()
        if time_per_unit_at_max_s is not None:
            time = time / time[-1] * time_per_unit_at_max_s
        duration = work_units * time
        return pd.DataFrame({"power_limit_w": curve.power_limit_w.to_numpy(dtype=float), "duration_s": duration,
                             "energy_j": duration * curve.avg_power_w.to_numpy(), "avg_power_w": curve.avg_power_w.to_numpy()})

    def attach_clock_model(self, clock_model: "ClockModel") -> "PowerModel":
        self.clock_model = clock_model
        return self

    def to_dict(self) -> dict:
        return {"default_curves": self.default_curves, "gpu_map": gpu_map_table().to_dict(orient="records"),
                "clock_model": None if self.clock_model is None else self.clock_model.to_dict()}

    def save(self, directory) -> "Path":
        from pathlib import Path

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.profiles.to_csv(directory / "power_profiles.csv", index=False)
        (directory / "power_model.json").write_text(json.dumps(self.to_dict(), indent=2, default=float))
        return directory

    @classmethod
    def load(cls, directory) -> "PowerModel":
        from pathlib import Path

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

    def options(self, gpu_type: str, work_units: float, time_per_unit_at_max_s: float,
                workload: str | None = None) -> pd.DataFrame:
        curve = self.curve_for(gpu_type, workload)
        clocks = np.asarray(curve.clocks_mhz, dtype=float)
        duration = work_units * time_per_unit_at_max_s * curve.time_ratio(clocks)
        power = curve.power(clocks)
        return pd.DataFrame({"sm_clock_mhz": clocks, "duration_s": duration, "energy_j": duration * power,
                             "avg_power_w": power})

    def to_dict(self) -> dict:
        return {f"{g}|{w or '*'}": c.__dict__ for (g, w), c in self.curves.items()}


def fit_clock_model(telemetry: pd.DataFrame, throughput_column: str | None = None, workload_column: str | None = None,
                    min_util_pct: float = 50.0, clock_step_mhz: float = 15.0, min_levels: int = 3) -> ClockModel:
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
            a = np.c_[np.ones_like(x), x ** gamma]
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
            f_max_mhz=f_max, clocks_mhz=sorted(f.tolist()), p_static_w=float(coef[0]), p_dyn_w=float(coef[1]),
            gamma=float(gamma), alpha=alpha, alpha_source=source, n_samples=int(levels.n.sum()))
    if not curves:
        raise ValueError(f"no GPU model has {min_levels}+ clock levels with busy samples")
    return ClockModel(curves)


# --- carbon decision ----------------------------------------------------------------------------------------------

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


def choose_power_setting(options: pd.DataFrame, intensity_by_hour, start_hour_offset: float = 0.0,
                         deadline_s: float = math.inf, pue: float = 1.0) -> PowerChoice:
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
    return {"total_work_units": total_work, "total_gco2e": total_g,
            "work_per_gco2e": total_work / total_g if total_g > 0 else None,
            "per_job": perf_per_carbon(plan[work_column], plan[carbon_column]).tolist()}


# --- evaluation --------------------------------------------------------------------------------------------------

def power_eval(profiles: pd.DataFrame) -> dict:
    """Leave-one-batch-size-out: every (GPU type, workload, optimizer, batch size) is predicted from the same
    workload's other batch sizes. Reports the energy-per-epoch MAPE per GPU type (also time, power) and the energy
    saved by running at the limit the *predicted* curve says is energy-optimal, measured on the real curve,
    against running at the maximum limit (and the saving of the true optimum)."""
    frame = profiles.copy()
    frame["gpu_type"] = frame.gpu_type.str.lower()
    rows, savings = [], []
    for (gpu, workload, optimizer), part in frame.groupby(["gpu_type", "workload", "optimizer"], sort=True):
        sizes = sorted(part.batch_size.unique())
        if len(sizes) < 3:
            continue
        for bs in sizes:
            train = part[part.batch_size != bs]
            truth = part[part.batch_size == bs].set_index("power_limit_w").sort_index()
            pred = interpolate_batch_size(train, float(bs)).set_index("power_limit_w").reindex(truth.index)
            ok = pred.energy_per_epoch_j.notna()
            edge = "smallest" if bs == sizes[0] else "largest" if bs == sizes[-1] else "interior"
            for pl in truth.index[ok.to_numpy()]:
                rows.append(dict(gpu_type=gpu, workload=workload, optimizer=optimizer, batch_size=bs, edge=edge,
                                 power_limit_w=pl,
                                 ape_energy=abs(pred.energy_per_epoch_j[pl] / truth.energy_per_epoch_j[pl] - 1),
                                 ape_time=abs(pred.time_per_epoch_s[pl] / truth.time_per_epoch_s[pl] - 1),
                                 ape_power=abs(pred.avg_power_w[pl] / truth.avg_power_w[pl] - 1)))
            e_max = truth.energy_per_epoch_j.iloc[-1]
            t_max = truth.time_per_epoch_s.iloc[-1]
            chosen = pred.energy_per_epoch_j[ok].idxmin()
            best = truth.energy_per_epoch_j.idxmin()
            savings.append(dict(gpu_type=gpu, chosen_limit_w=chosen, max_limit_w=truth.index[-1],
                                saving=1 - truth.energy_per_epoch_j[chosen] / e_max,
                                oracle_saving=1 - truth.energy_per_epoch_j[best] / e_max,
                                slowdown=truth.time_per_epoch_s[chosen] / t_max - 1))
    errors = pd.DataFrame(rows)
    saved = pd.DataFrame(savings)
    sparse = _sparse_grid_errors(frame)
    per_gpu = {}
    for gpu in sorted(errors.gpu_type.unique()):
        e = errors[errors.gpu_type == gpu]
        s = saved[saved.gpu_type == gpu]
        per_gpu[gpu] = {
            "lobo_energy_mape_pct": round(100 * e.ape_energy.mean(), 2),
            "lobo_energy_median_ape_pct": round(100 * e.ape_energy.median(), 2),
            "lobo_time_mape_pct": round(100 * e.ape_time.mean(), 2),
            "lobo_power_mape_pct": round(100 * e.ape_power.mean(), 2),
            "lobo_energy_mape_interior_bs_pct": round(100 * e[e.edge == "interior"].ape_energy.mean(), 2),
            "meets_5pct_target": bool(e.ape_energy.mean() < 0.05),
            "n_points": int(len(e)),
            "n_configs": int(len(s)),
            "energy_saved_vs_max_limit_pct": round(100 * s.saving.mean(), 2),
            "energy_saved_vs_max_limit_median_pct": round(100 * s.saving.median(), 2),
            "oracle_energy_saved_pct": round(100 * s.oracle_saving.mean(), 2),
            "slowdown_at_chosen_limit_pct": round(100 * s.slowdown.mean(), 2),
            "sparse_grid_energy_mape_pct": round(100 * sparse[sparse.gpu_type == gpu].ape_energy.mean(), 2),
        }
    return {
        "protocol": "leave-one-batch-size-out within (GPU type, workload, optimizer); energy per epoch at every "
                    "power limit; savings = measured energy at the limit the predicted curve says is "
                    "energy-optimal vs at the maximum limit",
        "per_gpu": per_gpu,
        "overall": {
            "lobo_energy_mape_pct": round(100 * errors.ape_energy.mean(), 2),
            "lobo_energy_mape_by_edge_pct": {k: round(100 * v, 2) for k, v in
                                             errors.groupby("edge").ape_energy.mean().items()},
            "energy_saved_vs_max_limit_pct": round(100 * saved.saving.mean(), 2),
            "target_lt_5pct_met": bool(errors.ape_energy.mean() < 0.05),
            "sparse_grid_energy_mape_pct": round(100 * sparse.ape_energy.mean(), 2),
        },
        "sparse_grid_protocol": "robustness check (not the target): as above, but the held-out batch size's next "
                                "larger neighbour (the next smaller at the largest size) is hidden too, so the "
                                "prediction bridges a gap twice as wide",
        "by_workload_energy_mape_pct": {f"{g}|{w}": round(100 * v, 2) for (g, w), v in
                                         errors.groupby(["gpu_type", "workload"]).ape_energy.mean().items()},
        "gpu_map": gpu_map_table().to_dict(orient="records"),
        "environment": {"python": platform.python_version(), "numpy": np.__version__, "pandas": pd.__version__},
    }


def _sparse_grid_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Energy APE per point when the held-out batch size and one neighbour are both hidden (see power_eval)."""
    rows = []
    for (gpu, _workload, _optimizer), part in frame.groupby(["gpu_type", "workload", "optimizer"], sort=True):
        sizes = sorted(part.batch_size.unique())
        if len(sizes) < 4:
            continue
        for i, bs in enumerate(sizes):
            hidden = {bs, sizes[i + 1] if i + 1 < len(sizes) else sizes[i - 1]}
            truth = part[part.batch_size == bs].set_index("power_limit_w").sort_index()
            pred = interpolate_batch_size(part[~part.batch_size.isin(hidden)], float(bs))
            pred = pred.set_index("power_limit_w").reindex(truth.index).energy_per_epoch_j
            ape = (pred / truth.energy_per_epoch_j - 1).abs().dropna()
            rows += [{"gpu_type": gpu, "ape_energy": float(v)} for v in ape]
    return pd.DataFrame(rows, columns=["gpu_type", "ape_energy"])


def power_eval_markdown(result: dict) -> str:
    lines = ["# Power model evaluation (Zeus sweeps, leave-one-batch-size-out)", "",
             "Regenerate: `python -m scheduling power-eval --json`.", "",
             "| GPU | energy/epoch MAPE | (interior batch sizes) | time MAPE | power MAPE | < 5 %? | energy saved vs max limit "
             "(predicted optimum) | true optimum | slowdown at chosen limit | sparse-grid check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for gpu, r in result["per_gpu"].items():
        lines.append(f"| {gpu} | {r['lobo_energy_mape_pct']:.2f} % | {r['lobo_energy_mape_interior_bs_pct']:.2f} % | "
                     f"{r['lobo_time_mape_pct']:.2f} % | {r['lobo_power_mape_pct']:.2f} % | "
                     f"{'yes' if r['meets_5pct_target'] else 'no'} | {r['energy_saved_vs_max_limit_pct']:.1f} % | "
                     f"{r['oracle_energy_saved_pct']:.1f} % | {r['slowdown_at_chosen_limit_pct']:.1f} % | "
                     f"{r['sparse_grid_energy_mape_pct']:.2f} % |")
    o = result["overall"]
    lines += ["", f"Overall energy MAPE {o['lobo_energy_mape_pct']:.2f} % (by position of the held-out batch size: "
              f"{json.dumps(o['lobo_energy_mape_by_edge_pct'])}); target < 5 %: {'met' if o['target_lt_5pct_met'] else 'missed'}.",
              "", f"Sparse-grid check ({result['sparse_grid_protocol']}): {o['sparse_grid_energy_mape_pct']:.2f} %."]
    return "\n".join(lines) + "\n"
