"""The registered versions of the performance predictor and the power model (trained by `scheduling.tasks`).

    load_latest_good(name, as_of=None, db_path=None)
        The newest good version: for "gpu-predictor" the numpy `PredictorRuntime` of the registered
        PerformancePredictor (what the plan predicts with, no torch import), a PowerModel for "gpu-power".
    resolve_registered(name, as_of=None, db_path=None) -> (model | None, info)
        The same with the version used (or why none was), for the planner to record in its explanations.

Registry rows: model_name "gpu-predictor" target "steps_per_s"; model_name "gpu-power" target
"energy_per_epoch_j". trained_at = `as_of` (the data cut-off; default: now, UTC).
"""

from __future__ import annotations

import pandas as pd

from common.timeutil import utc
from scheduling.models.performance.inference import PredictorRuntime
from warehouse import model_registry

PREDICTOR_NAME = "gpu-predictor"
PREDICTOR_TARGET = "steps_per_s"
POWER_NAME = "gpu-power"
POWER_TARGET = "energy_per_epoch_j"
TARGETS = {PREDICTOR_NAME: PREDICTOR_TARGET, POWER_NAME: POWER_TARGET}


_LOADED: dict = {}  # artifact path -> loaded model (an artifact never changes once registered)


# model name -> artifact loader other than the manifest's class: the predictor as its numpy runtime (no torch)
LOADERS = {PREDICTOR_NAME: PredictorRuntime.load}


def resolve_registered(name: str, as_of=None, db_path=None) -> tuple[object | None, dict]:
    """(model, info) for the newest good version of `name` whose cut-off (trained_at) is at or before `as_of`
    (a replay never uses a model newer than its planning time) and whose artifact loads. Good versions whose
    artifact is missing or corrupted are skipped and listed in info["skipped"]; failed versions are never used.
    info: {name, version, trained_at, source: "registry"} or, when there is none, {name, version: None,
    source: None, reason}, so the caller can fall back and say so."""
    if name not in TARGETS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(TARGETS)}")
    info: dict = {"name": name, "version": None, "trained_at": None, "source": None, "skipped": []}
    try:
        records = model_registry.list_models(name, TARGETS[name], "good", db_path)
    except Exception as exc:  # noqa: BLE001 - an unreadable registry must not stop the plan; the caller falls back
        info["reason"] = f"registry unreadable ({type(exc).__name__}: {exc})"
        return None, info
    cutoff = None if as_of is None else utc(as_of)
    for record in records:
        if cutoff is not None and record.trained_at > cutoff:
            continue
        try:
            model = _LOADED.get(record.artifact_path)
            if model is None:
                model = record.load(LOADERS.get(name))
                _LOADED[record.artifact_path] = model
        except model_registry.ArtifactError as exc:
            info["skipped"].append({"version": record.version, "error": str(exc)})
            continue
        info.update(version=record.version, trained_at=record.trained_at.isoformat(), source="registry")
        return model, info
    info["reason"] = (
        "no good version registered"
        if not records
        else "no good version with a loadable artifact trained at or before " + str(cutoff)
    )
    return None, info


def load_latest_good(name: str, as_of=None, db_path=None):
    """The newest good model of `name` ("gpu-predictor" or "gpu-power"), loaded; None when there is none."""
    return resolve_registered(name, as_of=as_of, db_path=db_path)[0]


def predictor_speed_table(
    predictor, job_types, observations: pd.DataFrame | None = None, gpu_types=("k80", "p100", "v100")
) -> pd.DataFrame:
    """job_type x gpu_type speeds relative to a V100 at the default power limit, the table
    `scheduling.domain.jobs.SpeedModel(table=..., absolute=True)` reads: isolated throughput (network 1 + network 2,
    with the runtime `observations` conditioned on; `scheduling.models.performance.runs`) divided by the version's
    own isolated V100 throughput T0. Without observations the v100 column is exactly 1 and the others are the
    version's throughput ratios. The registered `predictor` is never changed: the observations go to a copy."""
    types = sorted(set(job_types))
    raw = _throughputs(predictor, types, gpu_types)
    t0 = raw["v100"]
    if observations is not None and len(observations):
        refined = predictor.copy()
        refined.observe(observations)
        raw = _throughputs(refined, types, gpu_types)
    return raw.div(t0, axis=0)


def _throughputs(predictor, types: list[str], gpu_types) -> pd.DataFrame:
    out = pd.DataFrame(index=pd.Index(types, name="job_type"))
    for gpu in gpu_types:
        out[gpu] = predictor.isolated(pd.DataFrame({"job_type": types}), gpu)
    return out
