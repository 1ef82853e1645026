"""Training, evaluation and registration of the predictor and the power model (called by dags/predictor.py).

    train_and_register(db_path=None, as_of=None) -> dict
        Reads marts.gpu_throughput / marts.gpu_energy_profiles (falling back to the shared files while the marts do
        not exist), trains network 1 + network 2 and the power model, evaluates them, and registers one version of
        each in model.registry through forecasting.registry (artifacts under var/models/<name>/<target>/<version>/,
        i.e. MODELS_DIR). A failing training is registered with status 'failed' and the error in its metrics.
    load_latest_good(name, as_of=None, db_path=None)
        The newest good version: a PerformancePredictor for "gpu-predictor", a PowerModel for "gpu-power".
    resolve_registered(name, as_of=None, db_path=None) -> (model | None, info)
        The same with the version used (or why none was), for the planner to record in its explanations.

Registry rows: model_name "gpu-predictor" target "steps_per_s"; model_name "gpu-power" target
"energy_per_epoch_j". trained_at = `as_of` (the data cut-off; default: now, UTC).
"""
from __future__ import annotations

import time
import traceback

import pandas as pd

PREDICTOR_NAME = "gpu-predictor"
PREDICTOR_TARGET = "steps_per_s"
POWER_NAME = "gpu-power"
POWER_TARGET = "energy_per_epoch_j"
TARGETS = {PREDICTOR_NAME: PREDICTOR_TARGET, POWER_NAME: POWER_TARGET}


def _registry():
    from forecasting import registry

    return registry


def _now_utc() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC").floor("s")


def train_and_register(db_path=None, as_of=None, evaluate: bool = True, eval_config=None, log=None) -> dict:
    """Train, evaluate and register both models; returns {name: {version, status, metrics, artifact_path}}."""
    import torch

    from scheduling.models.measured import load_energy_profiles, load_throughput
    from scheduling.models.power import PowerModel, power_eval
    from scheduling.evaluation.predictor_eval import EvalConfig, environment, run_all
    from scheduling.models.performance.predictor import PerformancePredictor

    torch.set_num_threads(1)
    log = log or (lambda message: None)
    registry = _registry()
    trained_at = pd.Timestamp(as_of) if as_of is not None else _now_utc()
    if trained_at.tzinfo is None:
        trained_at = trained_at.tz_localize("UTC")
    result: dict = {}

    # --- predictor ---
    t0 = time.perf_counter()
    try:
        throughput = load_throughput(db_path)
        cfg = eval_config or EvalConfig()
        predictor = PerformancePredictor.train(throughput, cfg.prior, cfg.refiner)
        metrics = {"training": predictor.metadata, "train_s": round(time.perf_counter() - t0, 1)}
        if evaluate:
            log("evaluating the predictor (3 protocols)")
            evaluation = run_all(throughput, cfg, log=log)
            metrics.update({k: evaluation[k] for k in evaluation if k.startswith("protocol") or k in ("targets", "timings")})
        metrics["environment"] = environment()
        params = {"prior": cfg.prior.__dict__, "refiner": cfg.refiner.__dict__, "rows": int(len(throughput))}
        record = registry.register_model(predictor, PREDICTOR_NAME, PREDICTOR_TARGET, trained_at, params=params,
                                         metrics=metrics, db_path=db_path)
    except Exception as exc:  # noqa: BLE001 - recorded as a failed version, then re-raised after the power model
        log(f"predictor training failed: {exc}")
        record = registry.register_model(None, PREDICTOR_NAME, PREDICTOR_TARGET, trained_at, status="failed",
                                         metrics={"error": f"{type(exc).__name__}: {exc}",
                                                  "traceback": traceback.format_exc()[-4000:]}, db_path=db_path)
    result[PREDICTOR_NAME] = _summary(record)

    # --- power model ---
    t0 = time.perf_counter()
    try:
        profiles = load_energy_profiles(db_path)
        power = PowerModel(profiles)
        metrics = {"power_eval": power_eval(profiles) if evaluate else None, "train_s": round(time.perf_counter() - t0, 1)}
        record = registry.register_model(power, POWER_NAME, POWER_TARGET, trained_at,
                                         params={"rows": int(len(profiles)), "gpu_types": sorted(profiles.gpu_type.unique())},
                                         metrics=metrics, db_path=db_path)
    except Exception as exc:  # noqa: BLE001
        log(f"power model failed: {exc}")
        record = registry.register_model(None, POWER_NAME, POWER_TARGET, trained_at, status="failed",
                                         metrics={"error": f"{type(exc).__name__}: {exc}",
                                                  "traceback": traceback.format_exc()[-4000:]}, db_path=db_path)
    result[POWER_NAME] = _summary(record)
    return result


def _summary(record) -> dict:
    metrics = record.metrics or {}
    headline = {}
    if "targets" in metrics:
        headline["targets"] = metrics["targets"]
    if metrics.get("power_eval"):
        headline["power_overall"] = metrics["power_eval"].get("overall")
    if "error" in metrics:
        headline["error"] = metrics["error"]
    return {"version": record.version, "status": record.status, "artifact_path": record.artifact_path,
            "trained_at": record.trained_at.isoformat(), "headline": headline}


_LOADED: dict = {}  # artifact path -> loaded model (an artifact never changes once registered)


def resolve_registered(name: str, as_of=None, db_path=None) -> tuple[object | None, dict]:
    """(model, info) for the newest good version of `name` whose cut-off (trained_at) is at or before `as_of`
    (a replay never uses a model newer than its planning time) and whose artifact loads. Good versions whose
    artifact is missing or corrupted are skipped and listed in info["skipped"]; failed versions are never used.
    info: {name, version, trained_at, source: "registry"} or, when there is none, {name, version: None,
    source: None, reason}, so the caller can fall back and say so."""
    if name not in TARGETS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(TARGETS)}")
    registry = _registry()
    info: dict = {"name": name, "version": None, "trained_at": None, "source": None, "skipped": []}
    try:
        records = registry.list_models(name, TARGETS[name], "good", db_path)
    except Exception as exc:  # noqa: BLE001 - an unreadable registry must not stop the plan; the caller falls back
        info["reason"] = f"registry unreadable ({type(exc).__name__}: {exc})"
        return None, info
    cutoff = None if as_of is None else pd.Timestamp(as_of)
    if cutoff is not None and cutoff.tzinfo is None:
        cutoff = cutoff.tz_localize("UTC")
    for record in records:
        if cutoff is not None and record.trained_at > cutoff:
            continue
        try:
            model = _LOADED.get(record.artifact_path)
            if model is None:
                model = record.load()
                _LOADED[record.artifact_path] = model
        except registry.ArtifactError as exc:
            info["skipped"].append({"version": record.version, "error": str(exc)})
            continue
        info.update(version=record.version, trained_at=record.trained_at.isoformat(), source="registry")
        return model, info
    info["reason"] = ("no good version registered" if not records else
                      "no good version with a loadable artifact trained at or before " + str(cutoff))
    return None, info


def load_latest_good(name: str, as_of=None, db_path=None):
    """The newest good model of `name` ("gpu-predictor" or "gpu-power"), loaded; None when there is none."""
    return resolve_registered(name, as_of=as_of, db_path=db_path)[0]


def predictor_speed_table(predictor, job_types, gpu_types=("k80", "p100", "v100")) -> pd.DataFrame:
    """job_type x gpu_type isolated steps/s from a registered predictor (network 1 + network 2, so feedback the
    version has absorbed counts): the table `scheduling.domain.jobs.SpeedModel(table=...)` turns into speeds."""
    types = sorted(set(job_types))
    out = pd.DataFrame(index=pd.Index(types, name="job_type"))
    for gpu in gpu_types:
        out[gpu] = predictor.isolated(pd.DataFrame({"job_type": types}), gpu)
    return out
