"""Power-limit options per GPU model for the planner: (limit, time factor, average board power).

Source, in order:
1. the latest good registered power model (`model.registry`, name "gpu-power", cut-off at or before the planning
   time; see scheduling/models/registered.py and dags/predictor.py): its Zeus sweep table (`PowerModel.profiles`);
2. fallback, flagged in `PowerTable.model_info` ("fallback": true): the Zeus power-limit sweeps fitted on the fly
   (`marts.gpu_energy_profiles`, or the files through `scheduling.models.measured`).
For each Zeus GPU type and workload the time and energy at each limit relative to the maximum limit; the medians
over workloads per limit give the model's options. Which curve a fleet GPU model borrows, and its minimum
settable limit, come from the one mapping `scheduling.domain.gpus.GPU_MAP` (through `map_gpu_type`).

Of the limits, the planner keeps at most three: the default (maximum) limit, the limit with the lowest median
energy among those slowing jobs by at most `max_slowdown` (default 25 %), and the lowest-energy limit that slows
by at most 7 %; limits below the GPU's minimum settable limit are never offered. Which one a job gets is decided
per job by the coordinator (the one whose window costs least carbon and still meets the deadline). Average power
at the maximum limit is `peak_w` x the sweep's median avg_power / max_limit; a model without a profile has only
its default limit (average power = 0.7 x peak_w).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from scheduling.domain.gpus import DEFAULT_CURVE, map_gpu_type
from scheduling.models.power import energy_profiles
from scheduling.models.registered import POWER_NAME, resolve_registered

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

    def __init__(
        self,
        fleet,
        profiles: pd.DataFrame | None = None,
        max_slowdown: float = 0.25,
        source: str = "zeus-sweep",
        model_info: dict | None = None,
    ):
        self.max_slowdown = max_slowdown
        self.source = source
        # which power-model version the options come from (registry) or that none did (fallback: true)
        self.model_info = dict(model_info or {"version": None, "source": source, "fallback": True})
        self._curves = _curves(profiles) if profiles is not None and len(profiles) else {}
        self._models = dict(fleet.gpu_models)
        self._options: dict[str, list[PowerOption]] = {}
        for name, model in fleet.gpu_models.items():
            self._options[name] = self._build(model)

    def _curve_rows(self, model) -> tuple[float, pd.DataFrame] | None:
        """(average power at the default limit, the curve's rows below it that the GPU can be set to), or None
        without a curve."""
        spec = map_gpu_type(model.name)
        curve = self._curves.get(spec.curve)
        if curve is None:
            return None
        cand = curve["table"]
        settable = cand["frac"] * model.peak_w >= spec.min_limit_w - 1e-6  # e.g. a T4 cannot go below 60 W
        return curve["p0"] * model.peak_w, cand[(cand["frac"] < 0.999) & settable]

    def _build(self, model) -> list[PowerOption]:
        rows = self._curve_rows(model)
        if rows is None:
            return [PowerOption(model.peak_w, 1.0, DEFAULT_UTILISATION * model.peak_w)]
        p_default, settable = rows
        opts = [PowerOption(model.peak_w, 1.0, p_default)]
        ok = settable[settable["t"] <= 1.0 + self.max_slowdown]
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

    def curve_options(self, model_name: str) -> list[PowerOption]:
        """Every limit of the GPU model's measured curve it can be set to (the default first), not only the
        planner's picks: what the best hourly limit schedule could choose from (`bench-recap`'s frontier)."""
        model = self._models[model_name]
        rows = self._curve_rows(model)
        if rows is None:
            return self.options(model_name)
        p_default, settable = rows
        return [PowerOption(model.peak_w, 1.0, p_default)] + [
            PowerOption(round(float(r.frac) * model.peak_w, 1), float(r.t), p_default * float(r.e) / float(r.t))
            for r in settable.itertuples(index=False)
        ]

    def options(self, model_name: str) -> list[PowerOption]:
        return self._options[model_name]

    def describe(self) -> dict:
        return {
            "source": self.source,
            "model": self.model_info,
            "models": {
                m: [
                    {"limit_w": o.limit_w, "time_factor": round(o.time_factor, 4), "power_w": round(o.power_w, 1)}
                    for o in opts
                ]
                for m, opts in self._options.items()
            },
        }


def _curves(profiles: pd.DataFrame) -> dict:
    """Per GPU type: median over workloads of time and energy relative to the max limit, per limit fraction."""
    need = {"gpu_type", "power_limit_w", "time_per_epoch_s", "avg_power_w", "energy_per_epoch_j", "max_power_limit_w"}
    if not need.issubset(profiles.columns):
        return {}
    keys = [c for c in ("workload", "dataset", "network", "batch_size", "optimizer") if c in profiles.columns]
    f = profiles[list(need) + keys].copy()
    f["_key"] = f[keys].astype(str).agg("|".join, axis=1) if keys else "all"
    g = (
        f.groupby(["gpu_type", "_key", "power_limit_w"], sort=False)
        .agg(
            t=("time_per_epoch_s", "mean"),
            e=("energy_per_epoch_j", "mean"),
            p=("avg_power_w", "mean"),
            mx=("max_power_limit_w", "first"),
        )
        .reset_index()
    )
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
        out[str(gpu).lower()] = {"p0": float(p0), "table": table}
    if out:  # GPU_MAP's "default" curve (undisclosed models): the median over the profiled types, per limit fraction
        tables = pd.concat([c["table"] for c in out.values()])
        out[DEFAULT_CURVE] = {
            "p0": float(np.median([c["p0"] for c in out.values()])),
            "table": tables.groupby("frac")[["t", "e"]].median().reset_index(),
        }
    return out


_TABLE_CACHE: dict = {}


def load_power_table(fleet, data_dir=None, db_path=None, max_slowdown: float = 0.25, as_of=None) -> PowerTable:
    """The fleet's power options from the latest good registered power model (cut-off at or before `as_of`;
    None = the newest), else, flagged, from the Zeus profiles fitted on the fly (warehouse mart, files as
    fallback), else default limits only. Cached per process, GPU models and model version."""
    model, info = resolve_registered(POWER_NAME, as_of=as_of, db_path=db_path)
    key = (
        tuple(sorted((m.name, m.peak_w, m.power_profile) for m in fleet.gpu_models.values())),
        str(data_dir),
        str(db_path),
        max_slowdown,
        info.get("version"),
    )
    if key in _TABLE_CACHE:
        return _TABLE_CACHE[key]
    if model is not None:
        table = PowerTable(
            fleet,
            model.profiles,
            max_slowdown,
            source=f"registry:{POWER_NAME}@{info['version']}",
            model_info={**info, "fallback": False},
        )
    else:
        table = _fallback_power_table(fleet, data_dir, db_path, max_slowdown, info)
    _TABLE_CACHE[key] = table
    return table


def _fallback_power_table(fleet, data_dir, db_path, max_slowdown, info: dict) -> PowerTable:
    """No registered version: fit from marts.gpu_energy_profiles (files when the mart is missing), flagged."""
    profiles = None
    try:
        profiles = energy_profiles(db_path=db_path, data_dir=data_dir)
    except Exception:  # noqa: BLE001 - neither mart nor files: default limits only
        profiles = None
    flagged = {**info, "fallback": True}
    if profiles is None or not len(profiles):
        flagged["source"] = "default-limit-only"
        return PowerTable(fleet, None, max_slowdown, source="default-limit-only", model_info=flagged)
    flagged["source"] = "fitted-on-the-fly (marts.gpu_energy_profiles or files)"
    return PowerTable(fleet, profiles, max_slowdown, source=flagged["source"], model_info=flagged)


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
