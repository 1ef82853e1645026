"""The intake's checks of parsed jobs against the fleet they will run on (`scheduling.domain.fleet.load_fleet`).

A job is refused, with the field named, when its home or an allowed region is not a fleet region, a GPU model
it names is on no cluster, it asks for more GPUs (or CPU, memory) than any node has, no cluster can host it at
all (GPU model, node shape and allowed regions together), its workload_class contradicts a known job type (or is
missing for an unknown one), or its deadline leaves less time than its fastest run on the fleet. An unknown
job type is not refused: the class profile stands in and the job is flagged (`scheduling.queue.estimate`).

Flags set on accepted jobs: `unknown_job_type`, `estimated_duration` (no est_duration_h), `default_deadline`
(neither deadline nor flexibility), `no_payload` (no image, command or script: the executors have nothing to run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from scheduling.domain.jobs import SpeedModel
from scheduling.queue.estimate import DurationProfile, derive, known_class
from scheduling.queue.spec import FieldError, JobSpec


@dataclass
class FleetFacts:
    """What the checks need of a fleet, computed once per intake."""

    fleet: object
    regions: tuple[str, ...]
    gpu_models: tuple[str, ...]
    max_node_gpus: int
    max_node_cpu_milli: int
    max_node_memory_mib: int
    speed_model: SpeedModel
    profile: DurationProfile

    @classmethod
    def of(cls, fleet, speed_model: SpeedModel | None = None, data_dir=None) -> FleetFacts:
        nodes = [c.nodes for c in fleet.clusters]
        return cls(
            fleet=fleet,
            regions=tuple(fleet.regions),
            gpu_models=tuple(dict.fromkeys(c.config.gpu_model for c in fleet.clusters)),
            max_node_gpus=max((int(n["gpu"].max()) for n in nodes if len(n)), default=0),
            max_node_cpu_milli=max((int(n["cpu_milli"].max()) for n in nodes if len(n)), default=0),
            max_node_memory_mib=max((int(n["memory_mib"].max()) for n in nodes if len(n)), default=0),
            speed_model=speed_model or SpeedModel(data_dir),
            profile=DurationProfile(data_dir),
        )


def check_jobs(specs: Sequence[JobSpec], facts: FleetFacts) -> list[tuple[JobSpec, list[FieldError]]]:
    """For each spec: (the spec with its workload class resolved and its flags set, its errors; empty = accepted)."""
    resolved, errors = [], []
    for spec in specs:
        spec, errs = _check_fields(spec, facts)
        resolved.append(spec)
        errors.append(errs)
    ok = [i for i, errs in enumerate(errors) if not errs]
    if ok:
        derived, _ = derive([resolved[i] for i in ok], facts.fleet, facts.speed_model, facts.profile)
        for row, i in zip(derived.itertuples(index=False), ok):
            resolved[i], errors[i] = _check_derived(resolved[i], row, facts)
    return list(zip(resolved, errors))


def _check_fields(spec: JobSpec, facts: FleetFacts) -> tuple[JobSpec, list[FieldError]]:
    errors: list[FieldError] = []
    known = known_class(spec.job_type)
    flags = []
    if known is None:
        flags.append("unknown_job_type")
        if spec.workload_class is None:
            errors.append(FieldError("workload_class", None, f"is required: job type {spec.job_type!r} is unknown"))
    elif spec.workload_class is None:
        spec = replace(spec, workload_class=known)
    elif spec.workload_class != known:
        errors.append(FieldError("workload_class", spec.workload_class, f"job type {spec.job_type!r} is a {known} job"))
    regions = ", ".join(facts.regions)
    if spec.home_region not in facts.regions:
        errors.append(FieldError("home_region", spec.home_region, f"is not a fleet region ({regions})"))
    unknown = [r for r in spec.allowed_regions if r not in facts.regions]
    if unknown:
        errors.append(
            FieldError("allowed_regions", list(spec.allowed_regions), f"{unknown} not fleet regions ({regions})")
        )
    missing = [m for m in spec.gpu_models if m not in facts.gpu_models]
    if missing:
        have = ", ".join(facts.gpu_models)
        errors.append(FieldError("gpu_models", list(spec.gpu_models), f"no cluster has {missing} (fleet: {have})"))
    if spec.gpus > facts.max_node_gpus:
        errors.append(
            FieldError("gpus", spec.gpus, f"more GPUs than any node of the fleet has ({facts.max_node_gpus})")
        )
    if spec.cpu_milli > facts.max_node_cpu_milli:
        errors.append(
            FieldError("cpu_milli", spec.cpu_milli, f"more than any node of the fleet has ({facts.max_node_cpu_milli})")
        )
    if spec.memory_mib > facts.max_node_memory_mib:
        errors.append(
            FieldError(
                "memory_mib", spec.memory_mib, f"more than any node of the fleet has ({facts.max_node_memory_mib})"
            )
        )
    if spec.image is None and spec.command is None and spec.script is None:
        flags.append("no_payload")
    return spec.with_flags(*flags), errors


def _check_derived(spec: JobSpec, row, facts: FleetFacts) -> tuple[JobSpec, list[FieldError]]:
    if not row.hostable_any:
        if spec.allowed_regions:
            what = "allowed_regions", list(spec.allowed_regions), "no cluster in these regions can host the job"
        elif spec.gpu_models:
            what = (
                "gpu_models",
                list(spec.gpu_models),
                "no node with these GPU models holds the job's GPUs, CPU and memory",
            )
        else:
            what = "gpus", spec.gpus, "no node of the fleet holds the job's GPUs, CPU and memory together"
        name, value, reason = what
        return spec, [FieldError(name, value, reason + _shape(spec))]
    flags = []
    if row.estimated_duration:
        flags.append("estimated_duration")
    if row.default_deadline:
        flags.append("default_deadline")
    if spec.deadline is not None:
        window_h = (pd.Timestamp(spec.deadline) - pd.Timestamp(spec.submitted_at)).total_seconds() / 3600.0
        if window_h < row.fastest_h - 1e-9:
            reason = (
                f"leaves {window_h:.2f} h after submission; the fastest run on the fleet takes "
                f"{row.fastest_h:.2f} h (cluster {row.fastest_cluster})"
            )
            return spec, [FieldError("deadline", spec.deadline.isoformat(), reason)]
    if not np.isfinite(row.duration_h_ref):
        return spec, [FieldError("est_duration_h", spec.est_duration_h, "no run time could be estimated")]
    return spec.with_flags(*flags), []


def _shape(spec: JobSpec) -> str:
    return f" ({spec.gpus} x {spec.gpu_milli} milli-GPU, {spec.cpu_milli} milli-CPU, {spec.memory_mib} MiB)"
