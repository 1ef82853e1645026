"""Power-limit options per GPU model for the planner: (limit, time factor, average board power).

Source, in order:
1. the project's power model (`scheduling.power.PowerModel`, when present): its `options(gpu_type, workload,
   work_units)` rows give the limits, times and energies;
2. the Zeus power-limit sweeps (`marts.gpu_energy_profiles`, or the files through `scheduling.perfdata`): for
   each GPU type and workload the time and energy at each limit relative to the maximum limit; the medians over
   workloads per limit give the model's options.

Of the limits, the planner keeps at most three: the default (maximum) limit, the limit with the lowest median
energy among those slowing jobs by at most `max_slowdown` (default 25 %), and the lowest-energy limit that slows
by at most 7 %. Which one a job gets is decided per job by the coordinator (the one whose window costs least
carbon and still meets the deadline). Average power at the maximum limit is `peak_w` x the sweep's median
avg_power / max_limit; a model without a profile has only its default limit (average power = 0.7 x peak_w).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

DEFAULT_UTILISATION = 0.70  # avg board power / peak at the default limit when no sweep exists


@dataclass(frozen=True)
class PowerOption:
    limit_w: float  # per-GPU power limit
    time_factor: float  # run time relative to the default limit
    power_w: float  # average board power per (whole) GPU at this limit

    @property
    def energy_factor(self) -> float:
        return self.time_factor * self.power_w


class PowerTable:
    """`options(model_name) -> list[PowerOption]` (first = default limit) for the fleet's GPU models."""

    def __init__(self, fleet, profiles: pd.DataFrame | None = None, max_slowdown: float = 0.25,
                 source: str = "zeus-sweep"):
        self.max_slowdown = max_slowdown
        self.source = source
        self._curves = _curves(profiles) if profiles is not None and len(profiles) else {}
        self._options: dict[str, list[PowerOption]] = {}
        for name, model in fleet.gpu_models.items():
            self._options[name] = self._build(model)

    def _build(self, model) -> list[PowerOption]:
        curve = self._curves.get(str(model.power_profile)) if model.power_profile else None
        if curve is None:
            return [PowerOption(model.peak_w, 1.0, DEFAULT_UTILISATION * model.peak_w)]
        p_default = curve["p0"] * model.peak_w
        opts = [PowerOption(model.peak_w, 1.0, p_default)]
        cand = curve["table"]
        ok = cand[(cand["frac"] < 0.999) & (cand["t"] <= 1.0 + self.max_slowdown)]
        picks = []
        if len(ok):
            picks.append(ok.loc[ok["e"].idxmin()])
            mild = ok[ok["t"] <= 1.07]
            if len(mild):
                picks.append(mild.loc[mild["e"].idxmin()])
        seen = set()
        for row in picks:
            frac = round(float(row["frac"]), 3)
            if frac in seen or float(row["e"]) >= 0.999:
                continue
            seen.add(frac)
            t, e = float(row["t"]), float(row["e"])
            opts.append(PowerOption(round(frac * model.peak_w, 1), t, p_default * e / t))
        return opts

    def options(self, model_name: str) -> list[PowerOption]:
        return self._options[model_name]

    def describe(self) -> dict:
        return {
            "source": self.source,
            "models": {m: [{"limit_w": o.limit_w, "time_factor": round(o.time_factor, 4),
                            "power_w": round(o.power_w, 1)} for o in opts] for m, opts in self._options.items()},
        }


def _curves(profiles: pd.DataFrame) -> dict:
    """Per GPU type: median over workloads of time and energy relative to the max limit, per limit fraction."""
    need = {"gpu_type", "power_limit_w", "time_per_epoch_s", "avg_power_w", "energy_per_epoch_j", "max_power_limit_w"}
    if not need.issubset(profiles.columns):
        return {}
    keys = [c for c in ("workload", "dataset", "network", "batch_size", "optimizer") if c in profiles.columns]
    f = profiles[list(need) + keys].copy()
    f["_key"] = f[keys].astype(str).agg("|".join, axis=1) if keys else "all"
    g = f.groupby(["gpu_type", "_key", "power_limit_w"], sort=False).agg(
        t=("time_per_epoch_s", "mean"), e=("energy_per_epoch_j", "mean"), p=("avg_power_w", "mean"),
        mx=("max_power_limit_w", "first")).reset_index()
    ref = g[g["power_limit_w"] == g["mx"]][["gpu_type", "_key", "t", "e", "p", "mx"]]
    ref = ref.rename(columns={"t": "t0", "e": "e0", "p": "p0w"}).drop(columns="mx")
    g = g.merge(ref, on=["gpu_type", "_key"], how="inner")
    g["frac"] = (g["power_limit_w"] / g["mx"]).round(3)
    g["t"] = g["t"] / g["t0"]
    g["e"] = g["e"] / g["e0"]
    g["p0"] = g["p0w"] / g["mx"]
    out = {}
    for gpu, part in g.groupby("gpu_type"):
        table = part.groupby("frac")[["t", "e"]].median().reset_index()
        p0 = part.drop_duplicates("_key")["p0"].median()
        out[str(gpu)] = {"p0": float(p0), "table": table}
    return out


_TABLE_CACHE: dict = {}


def load_power_table(fleet, data_dir=None, db_path=None, max_slowdown: float = 0.25) -> PowerTable:
    """The fleet's power options: from the project's power model when it exposes its sweep, else from the Zeus
    profiles (warehouse mart, files as fallback), else default limits only. Cached per process and GPU models."""
    key = (tuple(sorted((m.name, m.peak_w, m.power_profile) for m in fleet.gpu_models.values())), str(data_dir),
           str(db_path), max_slowdown)
    if key in _TABLE_CACHE:
        return _TABLE_CACHE[key]
    table = _load_power_table(fleet, data_dir, db_path, max_slowdown)
    _TABLE_CACHE[key] = table
    return table


def _load_power_table(fleet, data_dir, db_path, max_slowdown) -> PowerTable:
    profiles = None
    source = "default-limit-only"
    try:  # the power model's own profile table, if the module exists and exposes one
        from scheduling import power as power_model  # type: ignore

        getter = getattr(power_model, "energy_profiles", None) or getattr(power_model, "load_profiles", None)
        if callable(getter):
            profiles = getter()
            source = "scheduling.power"
    except Exception:  # noqa: BLE001 - optional component
        profiles = None
    if profiles is None:
        try:
            from scheduling.perfdata import load_energy_profiles

            profiles = load_energy_profiles(db_path=db_path, fallback=True, data_dir=data_dir)
            source = "zeus-sweep (marts.gpu_energy_profiles or files)"
        except Exception:  # noqa: BLE001
            profiles = None
    if profiles is None or not len(profiles):
        return PowerTable(fleet, None, max_slowdown, source="default-limit-only")
    return PowerTable(fleet, profiles, max_slowdown, source=source)


def option_arrays(fleet, table: PowerTable, power_aware: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(K, C) arrays over the fleet's clusters: time factor (inf where a cluster has fewer options), average
    power per GPU (W), power limit (W). K = 1 when not power-aware."""
    per = [table.options(c.config.gpu_model) for c in fleet.clusters]
    K = max(len(p) for p in per) if power_aware else 1
    C = len(per)
    tf = np.full((K, C), np.inf)
    pw = np.zeros((K, C))
    lw = np.full((K, C), np.nan)
    for c, opts in enumerate(per):
        for k, o in enumerate(opts[:K]):
            tf[k, c], pw[k, c], lw[k, c] = o.time_factor, o.power_w, o.limit_w
    return tf, pw, lw
