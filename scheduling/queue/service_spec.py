"""The spec of an inference service, as submitted beside jobs: its fields, their parsing and the checks against
the serving data and the fleet (`parse_service`, `check_service`).

A service has no deadline: it has a load to serve every hour within its latency target. Its model must be one the
serving data knows (`scheduling.models.serving`), on GPU models that data has for it; its request rate comes from
ServeGen's trace (`servegen:<model>`), a CSV file of hourly rates (`file:<path>`, columns hour_utc, requests_per_s
and mean_output_tokens) or its own history in the warehouse (`history`). Errors name the service and the field,
like a job's (`JobSpecError`).
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path

from scheduling.queue.spec import (
    _DNS_LABEL,
    _NAME,
    MAX_NAME_CHARS,
    MAX_TENANT_CHARS,
    FieldError,
    JobSpecError,
    _enum,
    _float,
    _int,
    _names,
    _plain,
    _text,
    field_taker,
    is_missing,
    parse_time,
)

LATENCY_KINDS = ("p90_itl", "mean_tpot")  # what the target bounds, as the serving data measures it
DEFAULT_TASK = {"p90_itl": "lm-arena-chat", "mean_tpot": "chat"}
MAX_SLO_MS = 10_000.0
MAX_REPLICAS = 1_000
RATE_SOURCES = ("servegen:<model>", "file:<path>", "history")
MAX_RATE_SCALE = 1000.0

SERVICE_FIELD_DOCS: dict[str, str] = {
    "tenant": "Owning team (lower-case DNS label); the submission's tenant when left out.",
    "service_id": "Service name, unique per tenant (letters, digits, . _ -).",
    "submitted_at": "When the service was submitted (ISO UTC); default: the submission time.",
    "model": "Served model: a model id of the serving data, e.g. 'meta-llama/Llama-3.1-8B-Instruct'.",
    "gpu_models": "GPU models its replicas may use (e.g. H100); empty = every GPU the serving data has for the model.",
    "latency_slo_ms": f"Latency target per output token in ms (0 < ms <= {MAX_SLO_MS:g}).",
    "latency_kind": f"What the target bounds: {' | '.join(LATENCY_KINDS)} (default p90_itl).",
    "task": "Workload of the serving data's runs (default lm-arena-chat for p90_itl, chat for mean_tpot).",
    "home_region": "Fleet region the service belongs to (its static provisioning's).",
    "allowed_regions": "Regions its replicas may run in; empty = any.",
    "min_replicas": f"Replicas it keeps at any load (0..{MAX_REPLICAS}); default 1.",
    "rate_source": f"Where its request rate comes from: {', '.join(RATE_SOURCES)}.",
    "rate_scale": f"Share of the rate source's requests it serves (0 < x <= {MAX_RATE_SCALE:g}; default 1): a trace's "
    "shape at another size.",
}
SERVICE_FIELDS = tuple(SERVICE_FIELD_DOCS)


@dataclass(frozen=True)
class ServiceSpec:
    tenant: str
    service_id: str
    submitted_at: datetime
    model: str
    gpu_models: tuple[str, ...]
    latency_slo_ms: float
    latency_kind: str
    task: str
    home_region: str
    allowed_regions: tuple[str, ...]
    min_replicas: int
    rate_source: str
    rate_scale: float = 1.0

    @property
    def planner_id(self) -> str:
        return f"{self.tenant}/{self.service_id}"

    def user_values(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gpu_models"], out["allowed_regions"] = list(self.gpu_models), list(self.allowed_regions)
        return out

    def spec_hash(self) -> str:
        """SHA-256 of the fields except `submitted_at`: the same service submitted again is a no-op."""
        # rate_scale at its default is left out: services stored before the field keep their hash
        values = {
            k: _plain(v)
            for k, v in asdict(self).items()
            if k != "submitted_at" and not (k == "rate_scale" and v == 1.0)
        }
        return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def service_label(raw) -> str:
    """How errors name a service: `service 'tenant/id'`."""
    sid = raw.get("service_id") if isinstance(raw, Mapping) else None
    tenant = raw.get("tenant") if isinstance(raw, Mapping) else None
    return f"service {f'{tenant}/' if tenant else ''}{sid or '?'}"


def parse_service(raw, *, where: str | None = None, default_tenant=None, default_submitted_at=None) -> ServiceSpec:
    """A ServiceSpec from one submitted mapping; JobSpecError naming `where` and every bad field."""
    if not isinstance(raw, Mapping):
        raise JobSpecError(where or "service", [FieldError(None, None, "a service must be a mapping of fields")])
    where = where or service_label({**raw, "tenant": raw.get("tenant") or default_tenant})
    errors: list[FieldError] = []
    values: dict = {}
    for key in raw:
        if key not in SERVICE_FIELD_DOCS:
            errors.append(FieldError(str(key), None, f"unknown field; fields: {', '.join(SERVICE_FIELDS)}"))

    take = field_taker(raw, values, errors)

    take("tenant", lambda v: _text(v, MAX_TENANT_CHARS, _DNS_LABEL, "a lower-case DNS label"), default_tenant, True)
    take("service_id", lambda v: _text(v, MAX_NAME_CHARS, _NAME, "letters, digits, . _ -"), None, True)
    take("submitted_at", parse_time, parse_time(default_submitted_at) if default_submitted_at else None, True)
    take("model", lambda v: _text(v, 200, None), None, True)
    take("gpu_models", _names, ())
    take("latency_slo_ms", lambda v: _float(v, 0.0, MAX_SLO_MS, lo_open=True), None, True)
    take("latency_kind", lambda v: _enum(v, LATENCY_KINDS), "p90_itl")
    take("task", lambda v: _text(v, 64, _NAME, "letters, digits, . _ -"), DEFAULT_TASK.get(values["latency_kind"]))
    take("home_region", lambda v: _text(v, MAX_NAME_CHARS, _NAME, "a region name"), None, True)
    take("allowed_regions", _names, ())
    take("min_replicas", lambda v: _int(v, 0, MAX_REPLICAS), 1)
    take("rate_source", lambda v: _text(v, 1000, None), None, True)
    take("rate_scale", lambda v: _float(v, 0.0, MAX_RATE_SCALE, lo_open=True), 1.0)
    allowed, home = values["allowed_regions"], values["home_region"]
    if allowed and home and home not in allowed:
        errors.append(FieldError("home_region", home, f"is outside allowed_regions {list(allowed)}"))
    if errors:
        raise JobSpecError(where, errors)
    return ServiceSpec(**values)


def check_service(values, serving, regions, servegen_models=(), base_dir: Path | None = None, skip=()) -> list:
    """The FieldErrors of a service against the serving model (`serving`: a fitted ServingModel), the fleet's
    `regions` and the rate sources (ServeGen's model names; `file:` paths relative to `base_dir`). `values`: a
    ServiceSpec, or the raw mapping of one that did not parse (its fields in `skip`, already wrong, and those not
    given are left out), so that every bad field is reported at once."""
    v = values.user_values() if isinstance(values, ServiceSpec) else dict(values)
    errors = []

    def given(name) -> bool:
        return name not in skip and not is_missing(v.get(name))

    kind = v.get("latency_kind") if given("latency_kind") else "p90_itl"
    task = v.get("task") if given("task") else DEFAULT_TASK.get(kind)
    if given("model") and isinstance(v["model"], str):
        model = v["model"]
        curves = [k for k in serving.keys(model=model) if k.task == task]
        kinds = {serving.predict(k, serving.batch_caps(k)[0]).latency_kind for k in curves}
        if not serving.keys(model=model):
            known = sorted({k.model for k in serving.keys()})
            errors.append(
                FieldError("model", model, f"the serving data does not know it ({len(known)} models, e.g. {known[:3]})")
            )
        elif not curves:
            tasks = sorted({k.task for k in serving.keys(model=model)})
            errors.append(FieldError("task", task, f"the serving data has {model} only for {tasks}"))
        elif kind not in kinds:
            errors.append(FieldError("latency_kind", kind, f"{model} ({task}) is measured as {sorted(kinds)}"))
        elif given("gpu_models"):
            gpus = sorted({k.gpu for k in curves})
            unknown = [g for g in _listed(v["gpu_models"]) if g not in gpus]
            if unknown:
                errors.append(FieldError("gpu_models", v["gpu_models"], f"no serving data on {unknown}; has {gpus}"))
    named = ([("home_region", v["home_region"])] if given("home_region") else []) + (
        [("allowed_regions", r) for r in _listed(v["allowed_regions"])] if given("allowed_regions") else []
    )
    for name, region in named:
        if region not in regions:
            errors.append(FieldError(name, region, f"is not a fleet region; regions: {sorted(regions)}"))
    if given("rate_source") and isinstance(v["rate_source"], str):
        errors += _check_rate_source(v["rate_source"], servegen_models, base_dir)
    return errors


def _listed(value) -> list[str]:
    """A list field as given (a list, or `|`-separated text)."""
    if isinstance(value, str):
        return [x for x in value.split("|") if x]
    return [str(x) for x in value] if isinstance(value, (list, tuple)) else []


def _check_rate_source(source: str, servegen_models, base_dir: Path | None) -> list:
    kind, _, rest = source.partition(":")
    if source == "history":
        return []
    if kind == "servegen" and rest in servegen_models:
        return []
    if kind == "servegen":
        return [FieldError("rate_source", source, f"ServeGen has no model {rest!r}; it has {sorted(servegen_models)}")]
    if kind == "file":
        path = Path(rest) if Path(rest).is_absolute() or base_dir is None else base_dir / rest
        if not path.is_file():
            return [FieldError("rate_source", source, f"no such file {path}")]
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        missing = {"hour_utc", "requests_per_s", "mean_output_tokens"} - set(header)
        return [FieldError("rate_source", source, f"{path} lacks column(s) {sorted(missing)}")] if missing else []
    return [FieldError("rate_source", source, f"must be one of {', '.join(RATE_SOURCES)}")]
