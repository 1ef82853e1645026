"""The job spec of the queue: its user fields, how each is parsed, and the checks that need no fleet.

`parse_job(mapping, default_tenant=..., default_submitted_at=...)` turns one submitted mapping (a YAML/JSON
object, a CSV row, a `queue.submissions` row, a DAG form) into a `JobSpec`, or raises `JobSpecError` with one
`FieldError` per bad field, each naming the field, the value and why. The contract (every field, its type, bound
and default) is docs/data-contracts.md, "Job queue"; the checks against the fleet are `scheduling.queue.checks`.

Pure Python, no numpy/pandas: the DAG form imports the enums, bounds and field descriptions from here while
Airflow parses DAG files.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, date, datetime

WORKLOAD_CLASSES = ("language", "vision", "rl", "recommendation")
STATES = ("queued", "planned", "dispatched", "running", "preempted", "finished", "failed", "cancelled")
TERMINAL_STATES = ("finished", "failed", "cancelled")
SYSTEM_COLUMNS = (
    "state",
    "state_changed_at",
    "attempts",
    "flags",
    "spec_hash",
    "created_from",
    "cancel_requested_at",
)
DEFAULT_PRIORITY_CLASS = "normal"

# Bounds. Strings longer than these, lists with more entries, numbers outside them are rejected (never cut).
MAX_TENANT_CHARS = 63  # a DNS label: a tenant may become a Kubernetes namespace
MAX_JOB_ID_CHARS = 128
MAX_NAME_CHARS = 64  # region and GPU model names
MAX_JOB_TYPE_CHARS = 128
MAX_IMAGE_CHARS = 512
MAX_TEXT_CHARS = 65_536  # a command (all its parts together) or a script
MAX_COMMAND_PARTS = 1024
MAX_LIST_ITEMS = 64  # gpu_models, allowed_regions
MAX_GPUS = 1024
MIN_CPU_MILLI = 1  # a job asks for some CPU and memory (a pod that requests none still uses them)
MIN_MEMORY_MIB = 1
MAX_CPU_MILLI = 10_000_000
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_DURATION_H = 720.0  # 30 days
MAX_FLEXIBILITY = 10.0  # a deadline at most 11 x the run time after submission
MAX_CHECKPOINT_INTERVAL_MIN = 10_080  # a week
MAX_CHECKPOINT_OVERHEAD_MIN = 120
MAX_PREEMPTIONS = 20
MAX_INPUT_GB = 1_000_000.0
MAX_RETRIES = 10
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_WHITESPACE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# One line per user field: the DAG form's Param descriptions and the CLI's help come from here.
FIELD_DOCS: dict[str, str] = {
    "tenant": f"Owner of the job (lower-case DNS label, at most {MAX_TENANT_CHARS} characters).",
    "job_id": f"Id of the job, unique per tenant (letters, digits, . _ : @ + -; at most {MAX_JOB_ID_CHARS}).",
    "submitted_at": "When the job entered the queue (ISO UTC); default: the intake's as_of time.",
    "gpus": f"GPUs per job (1..{MAX_GPUS}); a share of one GPU (gpu_milli < 1000) needs gpus 1.",
    "gpu_milli": "Share of each GPU in milli-GPU, in (0, 1000]; default 1000 (whole GPUs).",
    "gpu_models": "GPU models the job may run on (the fleet's names, e.g. V100M32); empty = any.",
    "cpu_milli": f"CPU request in milli-cores ({MIN_CPU_MILLI}..{MAX_CPU_MILLI}).",
    "memory_mib": f"Memory request in MiB ({MIN_MEMORY_MIB}..{MAX_MEMORY_MIB}).",
    "workload_class": "language | vision | rl | recommendation; derived from a known job_type when left out.",
    "job_type": "Model and batch size as the profiles know them, e.g. 'ResNet-50 (batch size 64)'.",
    "est_duration_h": f"Run time in hours on the home cluster at full power (0 < h <= {MAX_DURATION_H:g}); "
    "empty = estimated from the job profiles.",
    "deadline": "Absolute deadline (ISO UTC); give deadline or flexibility, not both.",
    "flexibility": f"Deadline slack as a fraction of the run time (0..{MAX_FLEXIBILITY:g}); "
    "neither: the class default.",
    "checkpoint_interval_min": f"Minutes between checkpoints (1..{MAX_CHECKPOINT_INTERVAL_MIN}); "
    "empty = not checkpointing.",
    "checkpoint_overhead_min": "Minutes to write a checkpoint, and as long to read it back "
    f"(0..{MAX_CHECKPOINT_OVERHEAD_MIN}); checkpointing jobs only; empty = 5.",
    "max_preemptions": f"Times the planner may stop the job at a checkpoint (0..{MAX_PREEMPTIONS}); checkpointing jobs "
    "only; empty = the planner's setting (2).",
    "home_region": "Fleet region where the job's data lives.",
    "input_gb": f"GB moved when the job runs outside its home region (0..{MAX_INPUT_GB:g}); default 0.",
    "allowed_regions": "Regions the job may run in (data residency); empty = any.",
    "priority_class": f"Executor priority class (DNS label); default {DEFAULT_PRIORITY_CLASS!r}.",
    "max_retries": f"Times the executor may restart a failed run (0..{MAX_RETRIES}); default 0.",
    "image": f"Container image for Kubernetes (at most {MAX_IMAGE_CHARS} characters, no spaces).",
    "command": "Command: a list of arguments (Kubernetes) or one shell string (Slurm); carried unchanged.",
    "script": f"Slurm batch script body (at most {MAX_TEXT_CHARS} characters); carried unchanged.",
}
USER_FIELDS = tuple(FIELD_DOCS)
# left empty, these fields are not hashed: a stored job's spec_hash stays what it was before they existed
HASH_SKIPS_EMPTY = ("checkpoint_overhead_min", "max_preemptions")
LIST_FIELDS = ("gpu_models", "allowed_regions")


@dataclass(frozen=True)
class FieldError:
    """One bad field of one job."""

    field: str | None
    value: object
    reason: str

    def message(self, where: str) -> str:
        shown = _shown(self.value)
        return f"{where}: field {self.field!r}: {self.reason}" + (f" (got {shown})" if shown else "")


class JobSpecError(ValueError):
    """Every bad field of one job; `str()` names the job and each field."""

    def __init__(self, where: str, errors: list[FieldError]):
        self.where = where
        self.errors = errors
        super().__init__("; ".join(e.message(where) for e in errors))


@dataclass(frozen=True)
class JobSpec:
    """One job as the operator specified it, parsed and normalised (lists sorted and de-duplicated, times UTC)."""

    tenant: str
    job_id: str
    submitted_at: datetime
    gpus: int
    gpu_milli: int
    gpu_models: tuple[str, ...]
    cpu_milli: int
    memory_mib: int
    workload_class: str | None
    job_type: str
    est_duration_h: float | None
    deadline: datetime | None
    flexibility: float | None
    checkpoint_interval_min: int | None
    checkpoint_overhead_min: float | None
    max_preemptions: int | None
    home_region: str
    input_gb: float
    allowed_regions: tuple[str, ...]
    priority_class: str
    max_retries: int
    image: str | None
    command: str | tuple[str, ...] | None
    script: str | None
    flags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def planner_id(self) -> str:
        """The planner's job id: `tenant/job_id` (neither part may contain '/')."""
        return f"{self.tenant}/{self.job_id}"

    def with_flags(self, *flags: str) -> JobSpec:
        return replace(self, flags=tuple(sorted(set(self.flags) | set(flags))))

    def user_values(self) -> dict:
        """The user fields as stored in queue.jobs (lists, UTC datetimes, the command as JSON text)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in USER_FIELDS}
        for name in LIST_FIELDS:
            out[name] = list(out[name])
        out["command"] = None if self.command is None else json.dumps(_plain(self.command), ensure_ascii=False)
        return out

    def spec_hash(self) -> str:
        """SHA-256 of the user fields except `submitted_at` (when a job entered the queue is not part of what it
        is): the same job submitted again hashes the same and is a no-op."""
        values = {
            k: _plain(v)
            for k, v in asdict(self).items()
            if k in USER_FIELDS and k != "submitted_at" and not (v is None and k in HASH_SKIPS_EMPTY)
        }
        text = json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _plain(value):
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _shown(value) -> str:
    if value is None:
        return ""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------------------------ field parsers
class _Bad(Exception):
    def __init__(self, reason: str):
        self.reason = reason


def is_missing(value) -> bool:
    """None, an empty string, pandas' NA or NaT: the field was not given. A NaN is a value (YAML `.nan`, JSON
    `NaN`), not an absence: the field's parser rejects it as not a finite number."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() == ""
    return type(value).__name__ in ("NAType", "NaTType")  # pandas' NA and NaT (no pandas import here)


def _check_text(text: str, max_chars: int, multiline: bool) -> str:
    if "\ufffd" in text:
        raise _Bad("not valid UTF-8 (holds a replacement character)")
    if len(text) > max_chars:
        raise _Bad(f"longer than {max_chars} characters ({len(text)})")
    bad = (_CONTROL_BUT_WHITESPACE if multiline else _CONTROL).search(text)
    if bad:
        raise _Bad(f"holds a control character ({bad.group()!r})")
    return text


def _text(value, max_chars: int, pattern: re.Pattern | None = None, what: str = "", multiline=False) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise _Bad(f"must be a string, not {type(value).__name__}")
    text = str(value)
    if not multiline:
        text = text.strip()
    _check_text(text, max_chars, multiline)
    if pattern is not None and not pattern.match(text):
        raise _Bad(f"must be {what}")
    return text


def _int(value, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise _Bad("must be an integer, not a boolean")
    if isinstance(value, numbers.Integral):
        out = int(value)
    elif isinstance(value, numbers.Real):
        out = _whole(float(value))
    elif isinstance(value, str):
        text = value.strip()
        try:
            out = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                raise _Bad("must be an integer") from None
            out = _whole(f)
    else:
        raise _Bad(f"must be an integer, not {type(value).__name__}")
    if not lo <= out <= hi:
        raise _Bad(f"must be in [{lo}, {hi}]")
    return out


def _whole(f: float) -> int:
    if not math.isfinite(f):
        raise _Bad("must be a finite number")
    if f != int(f):
        raise _Bad("must be a whole number")
    return int(f)


def _float(value, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool):
        raise _Bad("must be a number, not a boolean")
    if isinstance(value, numbers.Real):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise _Bad("must be a number") from None
    else:
        raise _Bad(f"must be a number, not {type(value).__name__}")
    if not math.isfinite(out):
        raise _Bad("must be a finite number")
    if (out <= lo if lo_open else out < lo) or out > hi:
        raise _Bad(f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return out


def parse_time(value) -> datetime:
    """A UTC datetime from an ISO string, a datetime (naive = UTC) or a date (its midnight, UTC)."""
    if isinstance(value, datetime):
        ts = value
    elif isinstance(value, date):
        ts = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = _check_text(value.strip(), 64, multiline=False)
        try:
            ts = datetime.fromisoformat(text)
        except ValueError:
            raise _Bad("must be an ISO date/time such as 2021-07-15T12:00Z") from None
    else:
        raise _Bad(f"must be an ISO date/time, not {type(value).__name__}")
    if hasattr(ts, "to_pydatetime"):  # a pandas Timestamp: drop nanoseconds
        ts = ts.to_pydatetime()
    ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    if not EARLIEST <= ts < LATEST:
        raise _Bad(f"must be in [{EARLIEST.year}, {LATEST.year})")
    return ts


def _names(value) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.split("|")
    elif isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, (bytes, str))):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
    else:
        raise _Bad(f"must be a list of names (or 'a|b'), not {type(value).__name__}")
    if len(items) > MAX_LIST_ITEMS:
        raise _Bad(f"more than {MAX_LIST_ITEMS} entries ({len(items)})")
    out = []
    for item in items:
        if isinstance(item, str) and item.strip() == "" and isinstance(value, str):
            continue  # 'a||b' in CSV
        name = _text(item, MAX_NAME_CHARS, _NAME, "a name of letters, digits, '.', '_' or '-'")
        out.append(name)
    return tuple(sorted(set(out)))


def _command(value) -> str | tuple[str, ...]:
    if isinstance(value, str):
        return _check_text(value, MAX_TEXT_CHARS, multiline=True)
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        parts = list(value.tolist() if hasattr(value, "tolist") else value)
        if not parts:
            raise _Bad("is an empty list")
        if len(parts) > MAX_COMMAND_PARTS:
            raise _Bad(f"more than {MAX_COMMAND_PARTS} arguments ({len(parts)})")
        out = []
        for part in parts:
            if isinstance(part, bool) or not isinstance(part, (str, numbers.Real)):
                raise _Bad(f"arguments must be strings, not {type(part).__name__}")
            out.append(_check_text(str(part), MAX_TEXT_CHARS, multiline=True))
        if sum(map(len, out)) > MAX_TEXT_CHARS:
            raise _Bad(f"longer than {MAX_TEXT_CHARS} characters in all")
        return tuple(out)
    raise _Bad(f"must be a string or a list of strings, not {type(value).__name__}")


# ------------------------------------------------------------------------------------------------ one job
def field_taker(raw: Mapping, values: dict, errors: list):
    """take(name, parse, default=None, required=False): `values[name]` = `parse` of the raw field, `default` when it
    is missing; a missing required field or a value `parse` refuses appends its FieldError (the value is then None)."""

    def take(name: str, parse, default=None, required: bool = False) -> None:
        value = raw.get(name)
        if is_missing(value):
            if required and default is None:
                errors.append(FieldError(name, None, "is required"))
            values[name] = default
            return
        try:
            values[name] = parse(value)
        except _Bad as bad:
            errors.append(FieldError(name, value, bad.reason))
            values[name] = None

    return take


def job_label(raw, row: str | None = None) -> str:
    """How errors name a job: `job 'tenant/id'` (what is known of it) and where it came from."""
    job = raw.get("job_id") if isinstance(raw, Mapping) else None
    tenant = raw.get("tenant") if isinstance(raw, Mapping) else None
    name = None
    if not is_missing(job):
        name = f"{tenant}/{job}" if not is_missing(tenant) else str(job)
    label = f"job {_shown(name)}" if name is not None else "job (no job_id)"
    return f"{row}, {label}" if row else label


def parse_job(
    raw,
    *,
    default_tenant: str | None = None,
    default_submitted_at=None,
    where: str | None = None,
) -> JobSpec:
    """One job from a mapping of user fields (see the module doc). `default_tenant` is used when the job names
    none (a job naming another tenant is an error); `default_submitted_at` likewise (the intake's as_of).
    Raises JobSpecError naming `where` (or the job) and every bad field."""
    if not isinstance(raw, Mapping):
        reason = f"a job must be a mapping of fields, not {type(raw).__name__}"
        raise JobSpecError(where or "job", [FieldError(None, None, reason)])
    if where is None:
        where = job_label({**raw, "tenant": default_tenant} if is_missing(raw.get("tenant")) else raw)
    default_at = None
    if default_submitted_at is not None:
        try:
            default_at = parse_time(default_submitted_at)
        except _Bad as bad:
            raise ValueError(f"as_of {default_submitted_at!r}: {bad.reason}") from None
    errors: list[FieldError] = []
    values: dict = {}
    for key in raw:
        if not isinstance(key, str):
            errors.append(FieldError(str(key), None, "field names must be strings"))
        elif key in SYSTEM_COLUMNS:
            errors.append(FieldError(key, None, "is a system column, set by the queue"))
        elif key not in FIELD_DOCS:
            errors.append(FieldError(key, None, f"unknown field; fields: {', '.join(USER_FIELDS)}"))

    take = field_taker(raw, values, errors)

    tenant_value = raw.get("tenant")
    if not is_missing(tenant_value) and default_tenant and str(tenant_value).strip() != default_tenant:
        reason = f"differs from the tenant of this submission ({default_tenant!r})"
        errors.append(FieldError("tenant", tenant_value, reason))
    take("tenant", lambda v: _text(v, MAX_TENANT_CHARS, _DNS_LABEL, "a lower-case DNS label"), default_tenant, True)
    take("job_id", lambda v: _text(v, MAX_JOB_ID_CHARS, _JOB_ID, "letters, digits and . _ : @ + -"), None, True)
    if is_missing(raw.get("submitted_at")) and default_at is None:
        errors.append(FieldError("submitted_at", None, "is required (give it, or an as_of time for the submission)"))
        values["submitted_at"] = None
    else:
        take("submitted_at", parse_time, default_at)
    take("gpus", lambda v: _int(v, 1, MAX_GPUS), None, True)
    take("gpu_milli", lambda v: _int(v, 1, 1000), 1000)
    take("gpu_models", _names, ())
    take("cpu_milli", lambda v: _int(v, MIN_CPU_MILLI, MAX_CPU_MILLI), None, True)
    take("memory_mib", lambda v: _int(v, MIN_MEMORY_MIB, MAX_MEMORY_MIB), None, True)
    take("workload_class", lambda v: _enum(v, WORKLOAD_CLASSES))
    take("job_type", lambda v: _text(v, MAX_JOB_TYPE_CHARS, None), None, True)
    take("est_duration_h", lambda v: _float(v, 0.0, MAX_DURATION_H, lo_open=True))
    take("deadline", parse_time)
    take("flexibility", lambda v: _float(v, 0.0, MAX_FLEXIBILITY))
    take("checkpoint_interval_min", lambda v: _int(v, 1, MAX_CHECKPOINT_INTERVAL_MIN))
    take("checkpoint_overhead_min", lambda v: _float(v, 0.0, MAX_CHECKPOINT_OVERHEAD_MIN))
    take("max_preemptions", lambda v: _int(v, 0, MAX_PREEMPTIONS))
    take("home_region", lambda v: _text(v, MAX_NAME_CHARS, _NAME, "a region name"), None, True)
    take("input_gb", lambda v: _float(v, 0.0, MAX_INPUT_GB), 0.0)
    take("allowed_regions", _names, ())
    take("priority_class", lambda v: _text(v, 63, _DNS_LABEL, "a lower-case DNS label"), DEFAULT_PRIORITY_CLASS)
    take("max_retries", lambda v: _int(v, 0, MAX_RETRIES), 0)
    take("image", lambda v: _text(v, MAX_IMAGE_CHARS, re.compile(r"^\S+$"), "one word without spaces"))
    take("command", _command)
    take("script", lambda v: _text(v, MAX_TEXT_CHARS, None, multiline=True))

    bad = {e.field for e in errors}
    if "gpu_milli" not in bad and "gpus" not in bad and values["gpu_milli"] < 1000 and (values["gpus"] or 1) > 1:
        errors.append(FieldError("gpu_milli", raw.get("gpu_milli"), "a share of one GPU (< 1000) needs gpus 1"))
    if values["deadline"] is not None and values["flexibility"] is not None:
        errors.append(FieldError("flexibility", raw.get("flexibility"), "give deadline or flexibility, not both"))
    if values["deadline"] is not None and values["submitted_at"] is not None:
        if values["deadline"] <= values["submitted_at"]:
            errors.append(
                FieldError("deadline", raw.get("deadline"), f"is not after submitted_at ({values['submitted_at']})")
            )
    for name in ("checkpoint_overhead_min", "max_preemptions"):
        if (
            values[name] is not None
            and values["checkpoint_interval_min"] is None
            and "checkpoint_interval_min" not in bad
        ):
            errors.append(FieldError(name, raw.get(name), "is for checkpointing jobs: set checkpoint_interval_min"))
    allowed, home = values["allowed_regions"], values["home_region"]
    if allowed and home and home not in allowed:
        errors.append(FieldError("home_region", home, f"is outside allowed_regions {list(allowed)}"))
    if errors:
        raise JobSpecError(where, errors)
    return JobSpec(**values)


def _enum(value, choices: tuple[str, ...]) -> str:
    text = _text(value, 64, None)
    if text not in choices:
        raise _Bad(f"must be one of {', '.join(choices)}")
    return text
