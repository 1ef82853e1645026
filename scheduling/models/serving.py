"""Serving model: for a language model served on a GPU type with a tensor-parallel width and a batch cap, the output
tokens per second, the energy per output token and the latency per output token.

Data: the ML.ENERGY leaderboards (`energy/mlenergy_leaderboard_v2/llm_runs.csv`: A100-40GB and H100, vLLM with a
maximum batch size, mean time per output token; `energy/mlenergy_leaderboard_v3/llm_mllm_configurations.csv`: H100
and B200, `max_num_seqs`, p90 inter-token latency). One *curve* is one (source, task, model, GPU, GPUs, tensor
parallelism) over the batch caps it was run with (`ServingKey`); energy per token is the run's energy per request
over its mean output tokens (v2) or as published (v3).

Model. At a measured batch cap the point is the measurement. Between two measured caps of the same curve each
quantity is interpolated linearly in log(value) over log(batch cap) (energy per token falls and latency rises
smoothly with the cap; the log-log line is exact for a power law). A configuration the data lacks -- an unknown
model, GPU or parallelism, a cap outside the measured range, a power limit other than the runs' default -- raises
`UnknownServingConfiguration` naming it: nothing is invented. Its error (leave one configuration out) is
`scheduling.evaluation.serving_eval`. `at_load` places a replica on its curve at a demand below its cap (the point
whose throughput the demand fills), the execution model of an hour of serving.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from warehouse.config import data_dir as configured_data_dir

V2_RUNS = Path("energy/mlenergy_leaderboard_v2/llm_runs.csv")
V3_RUNS = Path("energy/mlenergy_leaderboard_v3/llm_mllm_configurations.csv")
KEY = ("source", "task", "model", "gpu", "num_gpus", "tensor_parallel", "expert_parallel")
QUANTITIES = ("tokens_per_s", "joules_per_token", "latency_ms")
LATENCY_KIND = {"mlenergy-v2": "mean_tpot", "mlenergy-v3": "p90_itl"}  # what `latency_ms` is, per source
GPU_NAMES = {"NVIDIA A100-SXM4-40GB": "A100", "NVIDIA H100 80GB HBM3": "H100", "H100": "H100", "B200": "B200"}


class UnknownServingConfiguration(ValueError):
    """A configuration the serving data does not cover; the message names what is missing."""


@dataclass(frozen=True)
class ServingKey:
    """One measured curve: a model served on `num_gpus` GPUs of one type with `tensor_parallel`, for one task."""

    source: str
    task: str
    model: str
    gpu: str
    num_gpus: int
    tensor_parallel: int
    expert_parallel: int = 1


@dataclass(frozen=True)
class ServingPoint:
    """What one replica does at a batch cap: output tokens/s, J per output token, latency per output token (ms;
    `latency_kind` mean_tpot or p90_itl), the replica's mean draw (W = tokens/s x J/token) and whether the point was
    measured (else interpolated)."""

    tokens_per_s: float
    joules_per_token: float
    latency_ms: float
    latency_kind: str
    power_w: float
    measured: bool


def load_serving_runs(data_dir: Path | str | None = None) -> pd.DataFrame:
    """Every ML.ENERGY LLM configuration as one row: KEY columns, batch_cap, QUANTITIES, latency_kind (a
    configuration run twice: the mean of the runs). ValueError naming a run without its numbers."""
    root = Path(data_dir or configured_data_dir())
    for rel in (V2_RUNS, V3_RUNS):
        if not (root / rel).is_file():
            raise FileNotFoundError(f"serving data: {root / rel} is missing (DATA_DIR={root})")
    v2 = pd.read_csv(root / V2_RUNS)
    v3 = pd.read_csv(root / V3_RUNS)
    a = pd.DataFrame(
        {
            "source": "mlenergy-v2",
            "task": v2["task"],
            "model": v2["Model"],
            "gpu": v2["GPU"].map(GPU_NAMES),
            "num_gpus": v2["TP"] * v2["PP"],
            "tensor_parallel": v2["TP"],
            "expert_parallel": 1,
            "batch_cap": v2["Max BS (reqs)"],
            "tokens_per_s": v2["Token tput (tok/s)"],
            "joules_per_token": v2["Energy/req (J)"] / v2["Avg Output Tokens"],
            "latency_ms": 1000.0 * v2["Avg TPOT (s)"],
        }
    )
    b = pd.DataFrame(
        {
            "source": "mlenergy-v3",
            "task": v3["task"],
            "model": v3["model_id"],
            "gpu": v3["gpu_model"].map(GPU_NAMES),
            "num_gpus": v3["num_gpus"],
            "tensor_parallel": v3["tensor_parallel"],
            "expert_parallel": v3["expert_parallel"],
            "batch_cap": v3["max_num_seqs"],
            "tokens_per_s": v3["output_throughput_tokens_per_sec"],
            "joules_per_token": v3["energy_per_token_joules"],
            "latency_ms": v3["p90_itl_ms"],
        }
    )
    runs = pd.concat([a, b], ignore_index=True)
    if runs["gpu"].isna().any():
        raise ValueError(f"serving data: unknown GPU name(s) {sorted(set(v2['GPU']) | set(v3['gpu_model']))}")
    runs["latency_kind"] = runs["source"].map(LATENCY_KIND)
    ints = ["num_gpus", "tensor_parallel", "expert_parallel", "batch_cap"]
    runs[ints] = runs[ints].astype("int64")
    bad = ~(np.isfinite(runs[list(QUANTITIES)].to_numpy(float)).all(axis=1) & (runs[list(QUANTITIES)] > 0).all(axis=1))
    if bad.any():
        raise ValueError(f"serving data: {int(bad.sum())} run(s) without positive finite {QUANTITIES}")
    # a configuration run twice: the mean of its runs
    runs = runs.groupby([*KEY, "batch_cap", "latency_kind"], as_index=False, sort=True)[list(QUANTITIES)].mean()
    return runs.reset_index(drop=True)


class ServingModel:
    """`fit(runs)` on `load_serving_runs`' frame, then `predict(key, batch_cap)`; `keys(...)` finds the curves."""

    def __init__(self) -> None:
        # per curve: the caps, their logs and each quantity's logs (what `predict` interpolates), the latency kind
        self._arrays: dict[ServingKey, tuple] = {}
        self._points: dict[tuple[ServingKey, float], ServingPoint] = {}  # predict's answers (planning asks often)
        self.derived: dict[str, dict] = {}  # callers' memos of answers derived from the curves (cleared by `fit`)

    def fit(self, runs: pd.DataFrame) -> ServingModel:
        caps = runs["batch_cap"].to_numpy(float)
        logs = {q: np.log(runs[q].to_numpy(float)) for q in QUANTITIES}
        kinds = runs["latency_kind"].astype(str).to_numpy()
        self._arrays = {
            ServingKey(*k): (
                caps[rows],
                np.log(caps[rows]),
                {q: v[rows] for q, v in logs.items()},
                str(kinds[rows[0]]),
            )
            for k, rows in sorted(runs.groupby(list(KEY), sort=True).indices.items())
        }
        self._points = {}
        self.derived = {}
        return self

    def keys(self, model: str | None = None, gpu: str | None = None, task: str | None = None) -> list[ServingKey]:
        """The measured curves, optionally of one model, GPU type or task."""
        return [
            k
            for k in self._arrays
            if (model is None or k.model == model)
            and (gpu is None or k.gpu == gpu)
            and (task is None or k.task == task)
        ]

    def batch_caps(self, key: ServingKey) -> list[int]:
        """The measured batch caps of a curve (ascending)."""
        return [int(c) for c in self._curve(key)[0]]

    def predict(self, key: ServingKey, batch_cap: float, power_limit_w: float | None = None) -> ServingPoint:
        """The curve's point at `batch_cap` (see the module doc); refused outside the data."""
        if power_limit_w is not None:
            raise UnknownServingConfiguration(
                f"{key.model} on {key.gpu}: power limit {power_limit_w} W: the serving runs are at the GPUs' default "
                "limit only"
            )
        cap = float(batch_cap)
        known = self._points.get((key, cap))
        if known is not None:
            return known
        caps, log_caps, logs, kind = self._curve(key)  # refuses an unknown curve, naming what is measured
        if not (caps[0] <= cap <= caps[-1]):
            raise UnknownServingConfiguration(
                f"{key.model} on {key.num_gpus}x {key.gpu} (TP {key.tensor_parallel}, {key.task}): batch cap "
                f"{batch_cap} is outside the measured {int(caps[0])}..{int(caps[-1])}"
            )
        x = np.log(cap)
        values = {q: float(np.exp(np.interp(x, log_caps, logs[q]))) for q in QUANTITIES}
        point = ServingPoint(
            values["tokens_per_s"],
            values["joules_per_token"],
            values["latency_ms"],
            kind,
            values["tokens_per_s"] * values["joules_per_token"],
            bool(np.isclose(caps, cap).any()),
        )
        if point.measured:  # measured caps recur; interpolated ones (at_load's) rarely do
            self._points[(key, cap)] = point
        return point

    def _curve(self, key: ServingKey) -> tuple:
        curve = self._arrays.get(key)
        if curve is None:
            known = sorted({(k.model, k.gpu) for k in self._arrays if k.model == key.model or k.gpu == key.gpu})
            raise UnknownServingConfiguration(
                f"no serving data for {key}; measured for this model or GPU: {known[:10]}"
                + (" ..." if len(known) > 10 else "")
            )
        return curve


@dataclass(frozen=True)
class LoadPoint:
    """One replica at a demand (output tokens/s) under a batch cap: the tokens/s it serves, J per token, draw (W),
    latency per output token (ms), its utilisation (demand / the cap's throughput) and whether it is saturated (the
    demand reaches the cap's throughput: a queue builds, so no latency target holds)."""

    served_tokens_per_s: float
    joules_per_token: float
    power_w: float
    latency_ms: float
    utilization: float
    saturated: bool


def at_load(model: ServingModel, key: ServingKey, tokens_per_s: float, batch_cap: float) -> LoadPoint:
    """Where a replica of `key` capped at `batch_cap` runs when asked for `tokens_per_s`. Below the cap's throughput
    continuous batching fills only the batch that the demand needs, so the replica runs at the curve's point whose
    throughput is the demand (the smallest such cap; throughput taken as its running maximum over the caps, since it
    can dip where the runs saturate) and has that point's latency and energy per token. Below the smallest measured
    cap's throughput the replica still draws that cap's power and has its latency (nothing lighter was measured:
    the energy per token then grows as the demand falls). At or above the cap's throughput it is saturated."""
    demand = float(tokens_per_s)
    if not np.isfinite(demand) or demand < 0:
        raise ValueError(f"{key.model}: demand {tokens_per_s!r} tokens/s must be a non-negative number")
    top = model.predict(key, batch_cap)
    if demand >= top.tokens_per_s:
        return LoadPoint(
            top.tokens_per_s, top.joules_per_token, top.power_w, top.latency_ms, demand / top.tokens_per_s, True
        )
    caps = [c for c in model.batch_caps(key) if c < float(batch_cap)] + [float(batch_cap)]
    points = [model.predict(key, c) for c in caps]
    reach = np.maximum.accumulate([p.tokens_per_s for p in points])
    if demand <= reach[0]:
        low = points[0]
        return LoadPoint(
            demand, low.power_w / max(demand, 1e-12), low.power_w, low.latency_ms, demand / top.tokens_per_s, False
        )
    i = int(np.searchsorted(reach, demand))  # reach[i - 1] < demand <= reach[i]
    x0, x1 = np.log(caps[i - 1]), np.log(caps[i])
    y0, y1 = np.log(reach[i - 1]), np.log(reach[i])
    cap = float(np.exp(x0 + (x1 - x0) * (np.log(demand) - y0) / (y1 - y0))) if y1 > y0 else float(caps[i])
    p = model.predict(key, min(max(cap, caps[0]), float(batch_cap)))
    return LoadPoint(
        demand, p.joules_per_token, demand * p.joules_per_token, p.latency_ms, demand / top.tokens_per_s, False
    )


def fit_serving_model(data_dir: Path | str | None = None) -> ServingModel:
    """The serving model fitted on every ML.ENERGY LLM run."""
    return ServingModel().fit(load_serving_runs(data_dir))


@functools.lru_cache(maxsize=4)
def _cached(data_dir: str | None) -> ServingModel:
    return fit_serving_model(data_dir)


def serving_model(data_dir: Path | str | None = None) -> ServingModel:
    """`fit_serving_model`, fitted once per data directory and shared (read-only) by whoever plans or serves."""
    return _cached(None if data_dir is None else str(data_dir))


def curve_id(key: ServingKey) -> str:
    """A curve's key as one text (what plans and executors store)."""
    return "|".join(str(getattr(key, f.name)) for f in fields(ServingKey))


def key_of(curve: str) -> ServingKey:
    """The ServingKey of a `curve_id` text."""
    parts = str(curve).split("|")
    names = [f.name for f in fields(ServingKey)]
    if len(parts) != len(names):
        raise ValueError(f"serving curve {curve!r}: expected {len(names)} fields ({', '.join(names)})")
    values = dict(zip(names, parts))
    for name in ("num_gpus", "tensor_parallel", "expert_parallel"):
        values[name] = int(values[name])
    return ServingKey(**values)
