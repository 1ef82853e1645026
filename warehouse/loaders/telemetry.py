"""GPU telemetry logs -> raw.gpu_telemetry: node logs (`nvidia-smi --query-gpu=... --format=csv`, DCGM-exporter CSV
exports) and the energy meters a job runs itself (CodeCarbon emissions.csv, ZeusMonitor log files).

Four log formats, told apart by the header:

* nvidia-smi: `nvidia-smi --query-gpu=timestamp,index,uuid,name,power.draw,power.limit,clocks.sm,utilization.gpu,
  temperature.gpu --format=csv -l 1` writes a header like `timestamp, index, uuid, name, power.draw [W], ...` and rows
  like `2024/03/01 12:00:00.123, 0, GPU-..., NVIDIA A100-SXM4-80GB, 245.31 W, 400.00 W, 1410 MHz, 87 %, 64`.
  `--format=csv,nounits` (no units in the values) works too; `[N/A]`/`[Not Supported]` are NULL. The timestamp is the
  machine's local time without a zone: pass `tz` (IANA name, default UTC); it is recorded in `source_tz` (NULL for
  rows whose timestamp carried its own zone or was a Unix epoch). The host is not in the log: pass `host` (default:
  the file name without extension).
* DCGM-exporter, exported to CSV (one row per scrape and GPU; labels and DCGM_FI_* fields as columns):
  `timestamp,gpu,UUID,device,modelName,Hostname,DCGM_FI_DEV_SM_CLOCK,DCGM_FI_DEV_GPU_TEMP,DCGM_FI_DEV_POWER_USAGE,
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,DCGM_FI_DEV_GPU_UTIL,...`; timestamp ISO-8601 (with zone) or Unix epoch
  (s or ms); DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is the cumulative energy counter in mJ since the driver loaded.
* CodeCarbon 3.x `emissions.csv` (`timestamp,project_name,run_id,experiment_id,duration,emissions,...,energy_consumed,
  ...,tracking_mode,...`): one row per `flush()`/`stop()` with the run's totals so far (duration s, energy_consumed
  kWh = CPU + GPU + RAM); the timestamp is local time without a zone (pass `tz`). One output row per input row:
  energy_j = energy_consumed since the run's previous row, over window_start_utc = timestamp - the duration since
  then; energy_counter_j = the run's total; energy_scope `machine`; gpu_index NULL.
* ZeusMonitor(log_file=...) (`start_time,window_name,elapsed_time,gpu<i>_energy,...`): one row per ended window
  (start Unix s, elapsed s, J per GPU). One output row per window x GPU: energy_j = the GPU's energy in
  [window_start_utc, ts_utc]; energy_scope `gpu`.

Meter rows are keyed to a job by `job_key`, the planner job id `<tenant>/<job_id>` (as in raw.job_events): the
CodeCarbon `project_name` (`EmissionsTracker(project_name="<tenant>/<job_id>")`), the Zeus window name
(`monitor.begin_window("<tenant>/<job_id>")`), or for every row of a file the sidecar's `job`. `meter_run_id` = the
CodeCarbon run_id / the Zeus window name; power_w = the mean power over the window. Node rows have job_key,
meter_run_id and window_start_utc NULL and energy_scope `gpu`.

Output `raw.gpu_telemetry(ts_utc TIMESTAMPTZ, host, gpu_index, gpu_uuid, gpu_model, power_w, sm_clock_mhz,
gpu_util_pct, energy_j, energy_source, energy_counter_j, power_limit_w, temperature_c, log_format, source_tz, job_key,
meter_run_id, window_start_utc TIMESTAMPTZ, energy_scope)`:

* Node logs: `energy_j` is the energy the GPU used since its previous sample in the same file (J), NULL at its first
  sample; so SUM(energy_j) over a time range is the energy in that range. `energy_source` = `measured` when it is the
  difference of the DCGM energy counter (a counter reset counts from 0), `integrated` when the log has no energy and
  it is the trapezoid of power over time; gaps longer than `max_gap_s` (default 300 s) are not integrated (NULL).
  `energy_counter_j` is the raw DCGM counter in J (NULL for integrated rows). Meter rows are all `measured`.
* Quarantined rows (with file, line, field, reason): missing/non-numeric/negative power and other negative or
  out-of-range values, wrong units, unparsable timestamps, timestamps without a zone when `tz=None` or when other rows
  of the same file carry a zone, local times that do not exist or are ambiguous in `tz` (DST), and duplicate
  (timestamp, host, gpu) rows (the first is kept). Meter rows besides: no job key, missing or negative energy,
  energy that implies an impossible mean power (a unit other than kWh / J), a CodeCarbon total that falls within
  its run or repeats its duration, a Zeus line with too few fields, a Zeus window overlapping an earlier one of the
  same job (nested windows would count twice). A repeated header line (a logger restarted onto the same file) is
  skipped. Whole-file problems (empty, binary, unknown header) raise LoadError.

`DATA_DIR/telemetry/**/*.csv` is the `telemetry` source (absent in the shared data: it yields nothing); a sidecar
`<file>.json` may give {"tz": "...", "host": "...", "job": "<tenant>/<job_id>"} for a log.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pandas as pd

from warehouse.db import Batch, Rejection
from warehouse.loaders.base import Column, LoadError, Source, _sniff_text, read_checked_csv
from warehouse.loaders.cluster import batch_id, glob_files

TABLE = "raw.gpu_telemetry"
SOURCE = "telemetry"
OUTPUT_COLUMNS = [
    "ts_utc",
    "host",
    "gpu_index",
    "gpu_uuid",
    "gpu_model",
    "power_w",
    "sm_clock_mhz",
    "gpu_util_pct",
    "energy_j",
    "energy_source",
    "energy_counter_j",
    "power_limit_w",
    "temperature_c",
    "log_format",
    "source_tz",
    "job_key",
    "meter_run_id",
    "window_start_utc",
    "energy_scope",
]
NA_TOKENS = {
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "[insufficient permissions]",
    "[gpu is lost]",
    "nan",
}
_NUMBER_WITH_UNIT = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)$")
_HAS_ZONE = re.compile(r"(?:Z|[+-]\d\d:?\d\d|\bUTC|\bGMT)$")
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")


@dataclass(frozen=True)
class Field:
    """One telemetry field: where it comes from in each format and how it is checked."""

    target: str
    kind: str  # float | int | str | ts
    nvidia_smi: tuple[str, ...] = ()
    dcgm: tuple[str, ...] = ()
    required: bool = False  # the column must be in the header and every row must have a value
    units: tuple[str, ...] = ()  # units allowed after the number ("" = none)
    min_value: float | None = None
    max_value: float | None = None


FIELDS = [
    Field("ts", "ts", ("timestamp",), ("timestamp", "time", "ts"), required=True),
    Field("gpu_index", "int", ("index",), ("gpu",), required=True, min_value=0),
    Field("gpu_uuid", "str", ("uuid", "gpu_uuid"), ("UUID", "uuid")),
    Field("gpu_model", "str", ("name", "gpu_name"), ("modelName",)),
    Field("host", "str", (), ("Hostname", "hostname", "host")),
    Field(
        "power_w",
        "float",
        ("power.draw", "power.draw.instant", "power.draw.average"),
        ("DCGM_FI_DEV_POWER_USAGE",),
        required=True,
        units=("W",),
        min_value=0,
        max_value=5000,
    ),
    Field(
        "sm_clock_mhz",
        "float",
        ("clocks.sm", "clocks.current.sm"),
        ("DCGM_FI_DEV_SM_CLOCK",),
        units=("MHz",),
        min_value=0,
        max_value=10000,
    ),
    Field(
        "gpu_util_pct",
        "float",
        ("utilization.gpu",),
        ("DCGM_FI_DEV_GPU_UTIL",),
        units=("%",),
        min_value=0,
        max_value=100,
    ),
    Field("energy_mj", "float", (), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), units=("mJ",), min_value=0),
    Field(
        "power_limit_w",
        "float",
        ("power.limit", "enforced.power.limit"),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT",),
        units=("W",),
        min_value=0,
        max_value=5000,
    ),
    Field(
        "temperature_c",
        "float",
        ("temperature.gpu",),
        ("DCGM_FI_DEV_GPU_TEMP",),
        units=("C",),
        min_value=-50,
        max_value=150,
    ),
]


def _header(text: str, path: Path) -> list[str]:
    # newline="": the csv module's own line-ending handling (a bare CR, as in old Mac logs, ends a row)
    try:
        for row in csv.reader(io.StringIO(text, newline="")):
            if any(cell.strip() for cell in row):
                return [cell.strip() for cell in row]
    except csv.Error as exc:
        raise LoadError(path, f"unreadable CSV header: {exc}", row=1) from exc
    raise LoadError(path, "no header row")


def _base_name(header_name: str) -> str:
    """'power.draw [W]' -> 'power.draw'."""
    return _HEADER_UNIT.sub("", header_name).strip()


def detect_format(header: list[str]) -> str:
    """'nvidia-smi', 'dcgm', 'codecarbon' or 'zeus' from a CSV header; '' when none."""
    bases = {_base_name(h) for h in header}
    if any(b.startswith("DCGM_FI_") for b in bases):
        return "dcgm"
    if "timestamp" in bases and bases & {"power.draw", "power.draw.instant", "power.draw.average"}:
        return "nvidia-smi"
    if {"project_name", "run_id", "duration", "energy_consumed"} <= bases:
        return "codecarbon"
    if header[:3] == ["start_time", "window_name", "elapsed_time"]:
        return "zeus"
    return ""


def _timezone(tz: str | None) -> ZoneInfo | None:
    if tz is None:
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {tz!r} (use an IANA name such as 'UTC' or 'Europe/Berlin')") from None


def _sidecar(path: Path) -> dict:
    side = path.with_suffix(".json")
    if not side.is_file():
        return {}
    try:
        meta = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoadError(side, f"unreadable sidecar: {exc}") from None
    if not isinstance(meta, dict):
        raise LoadError(
            side, 'sidecar must be a JSON object like {"tz": "Europe/Berlin", "host": "node-a", "job": "lab/job-1"}'
        )
    return meta


class _Rows:
    """Row-level rejections over a frame of raw strings, keeping the first reason per row."""

    def __init__(self, path: Path, raw: pd.DataFrame, lines: np.ndarray, header_names: dict[str, str]):
        self.path, self.raw, self.lines = path, raw, lines
        self.header_names = header_names  # warehouse name -> the log's column name, for the quarantined record
        self.bad = np.zeros(len(raw), dtype=bool)
        self.rejections: list[Rejection] = []

    def reject(self, mask: np.ndarray | pd.Series, field: str, values: pd.Series, reason: str) -> None:
        mask = np.asarray(mask, dtype=bool) & ~self.bad
        for idx in np.flatnonzero(mask):
            value = values.iloc[idx]
            self.rejections.append(
                Rejection(
                    reason=reason,
                    file=str(self.path),
                    row_number=int(self.lines[idx]),
                    field=field,
                    value=None if pd.isna(value) else str(value),
                    record={
                        self.header_names.get(k, k): (None if pd.isna(v) else str(v))
                        for k, v in self.raw.iloc[idx].items()
                    },
                )
            )
        self.bad |= mask


def _numbers(rows: _Rows, field: Field, header_name: str, unit_in_header: str | None, values: pd.Series) -> pd.Series:
    """Parse '245.31 W' / '245.31' into floats, quarantining bad values; returns float64 with NaN for NULL."""
    text = values.astype("string").str.strip()
    missing = (text.isna() | text.str.lower().isin(NA_TOKENS)).to_numpy(dtype=bool)
    if field.required:
        rows.reject(missing, header_name, values, "missing value")
    parts = text.where(~missing).str.extract(_NUMBER_WITH_UNIT)
    number = pd.to_numeric(parts[0], errors="coerce").astype("float64")
    unit = parts[1].fillna("")
    unparsable = ~missing & number.isna().to_numpy()
    rows.reject(unparsable, header_name, values, f"not a number (expected {field.kind})")
    allowed = set(field.units) | {""}
    if unit_in_header:
        allowed.add(unit_in_header)
    wrong_unit = ~missing & ~unparsable & ~unit.isin(allowed).to_numpy()
    rows.reject(
        wrong_unit,
        header_name,
        values,
        f"unexpected unit (expected {' or '.join(u for u in sorted(allowed) if u) or 'none'})",
    )
    finite = np.isfinite(number.to_numpy())
    rows.reject(~missing & ~unparsable & ~finite, header_name, values, "not a finite number")
    if field.kind == "int":
        rows.reject(
            finite & (number.to_numpy() != np.floor(np.where(finite, number, 0))), header_name, values, "not an integer"
        )
    if field.min_value is not None:
        below = finite & (number.to_numpy() < field.min_value)
        quantity = field.target.split("_")[0]
        rows.reject(
            below,
            header_name,
            values,
            f"negative {quantity}"
            if quantity in ("power", "energy") and field.min_value == 0
            else f"below minimum {field.min_value}",
        )
    if field.max_value is not None:
        rows.reject(
            finite & (number.to_numpy() > field.max_value), header_name, values, f"above maximum {field.max_value}"
        )
    return number.where(finite)


def _timestamps(
    rows: _Rows, header_name: str, values: pd.Series, zone: ZoneInfo | None, log_format: str
) -> tuple[pd.Series, np.ndarray]:
    """Parse timestamps to UTC; also returns which rows were zone-less. Zone-less ones are local time in `zone`
    (quarantined when zone is None or when other rows of the file have a zone); Unix epochs (s/ms/us/ns by
    magnitude) are UTC."""
    text = values.astype("string").str.strip()
    missing = (text.isna() | (text == "")).to_numpy(dtype=bool)
    rows.reject(missing, header_name, values, "missing value")
    out = pd.Series(pd.NaT, index=values.index, dtype="datetime64[ns, UTC]")
    epoch_num = pd.to_numeric(text.where(text.str.fullmatch(r"\d+(?:\.\d+)?").fillna(False)), errors="coerce")
    is_epoch = epoch_num.notna().to_numpy()
    if is_epoch.any():
        seconds = epoch_num[is_epoch].astype("float64")
        magnitude = np.select([seconds > 1e17, seconds > 1e14, seconds > 1e11], [1e9, 1e6, 1e3], 1.0)
        out.loc[is_epoch] = pd.to_datetime((seconds / magnitude * 1e9).round().astype("int64"), unit="ns", utc=True)
    has_zone = text.str.contains(_HAS_ZONE, na=False).to_numpy(dtype=bool) & ~is_epoch
    zoneless = ~missing & ~is_epoch & ~has_zone
    if has_zone.any():
        part = text[has_zone].str.replace(r"\s*(UTC|GMT)$", "+00:00", regex=True)
        parsed = pd.to_datetime(part, utc=True, errors="coerce", format="ISO8601")
        retry = parsed.isna()
        if retry.any():
            parsed[retry] = pd.to_datetime(part[retry], utc=True, errors="coerce", format="mixed")
        out.loc[has_zone] = parsed
    if zoneless.any():
        if zone is None:
            rows.reject(zoneless, header_name, values, "timestamp has no time zone (pass tz=...)")
        elif has_zone.any() or is_epoch.any():
            rows.reject(
                zoneless, header_name, values, "timestamp has no time zone while other rows of the file have one"
            )
        else:
            part = text[zoneless]
            fmt = "%Y/%m/%d %H:%M:%S.%f" if log_format == "nvidia-smi" else "ISO8601"
            naive = pd.to_datetime(part, errors="coerce", format=fmt)
            retry = naive.isna()
            if retry.any():
                naive[retry] = pd.to_datetime(part[retry], errors="coerce", format="mixed")
            unparsed = pd.Series(False, index=values.index)
            unparsed.loc[part.index] = naive.isna()
            rows.reject(unparsed.to_numpy(), header_name, values, "not a timestamp")
            local = naive.dt.tz_localize(zone, ambiguous="NaT", nonexistent="NaT")
            dst = pd.Series(False, index=values.index)
            dst.loc[part.index] = naive.notna() & local.isna()
            rows.reject(
                dst.to_numpy(),
                header_name,
                values,
                f"local time does not exist or is ambiguous in {zone.key} (daylight saving change)",
            )
            out.loc[part.index] = local.dt.tz_convert("UTC")
    rows.reject(~missing & out.isna().to_numpy(), header_name, values, "not a timestamp")
    return out, zoneless


def load_telemetry_file(
    path: Path | str,
    *,
    tz: str | None = "UTC",
    host: str | None = None,
    data_dir: Path | None = None,
    max_gap_s: float | None = 300.0,
    job: str | None = None,
) -> Batch:
    """One nvidia-smi, DCGM-exporter, CodeCarbon or Zeus CSV log as a Batch for raw.gpu_telemetry (see the module
    docstring).

    tz: zone of timestamps written without one (nvidia-smi and CodeCarbon local time); None quarantines such rows.
    host: host name when the log has no Hostname column (default: the file name without extension).
    job: planner job id (`<tenant>/<job_id>`) of every row of a CodeCarbon or Zeus log, in place of the key the
    rows carry (CodeCarbon project_name, Zeus window name).
    """
    path = Path(path)
    zone = _timezone(tz)
    text = _sniff_text(path)
    header = _header(text, path)
    log_format = detect_format(header)
    if not log_format:
        raise LoadError(
            path,
            "not a GPU telemetry log: expected an nvidia-smi --query-gpu CSV (timestamp, index, power.draw [W], ...), "
            "a DCGM-exporter CSV (DCGM_FI_DEV_* columns), a CodeCarbon emissions.csv or a ZeusMonitor log "
            f"(start_time,window_name,elapsed_time,gpu<i>_energy); header is {header}",
            row=1,
        )
    root = Path(data_dir) if data_dir is not None else path.parent
    meta_host = host if host is not None else path.stem
    if job is not None and not JOB_KEY.fullmatch(job):
        raise ValueError(f"job {job!r} is not a planner job id '<tenant>/<job_id>'")
    if log_format in METER_FORMATS:
        load = _load_codecarbon if log_format == "codecarbon" else _load_zeus
        frame, rejections = load(path, text, header, zone, tz, meta_host, job)
        return Batch(TABLE, batch_id(SOURCE, path, root), SOURCE, _typed(frame, log_format), rejections)
    by_base: dict[str, str] = {}
    for name in header:
        by_base.setdefault(_base_name(name), name)
    columns: list[Column] = []
    chosen: dict[str, tuple[Field, str]] = {}
    for field in FIELDS:
        names = field.nvidia_smi if log_format == "nvidia-smi" else field.dcgm
        found = next((by_base[n] for n in names if n in by_base), None)
        if found is None:
            if field.required:
                raise LoadError(path, f"missing column; header is {header}", row=1, field=names[0])
            continue
        chosen[field.target] = (field, found)
        columns.append(Column(found, "str", nullable=True, rename=field.target))
    raw, _ = read_checked_csv(path, columns, line_column="_line")
    # A logger restarted onto the same file writes its header again: not data.
    ts_header = chosen["ts"][1]
    raw = raw.loc[raw["ts"].astype("string").str.strip() != ts_header].reset_index(drop=True)
    lines = raw.pop("_line").to_numpy()
    rows = _Rows(path, raw, lines, {target: name for target, (_, name) in chosen.items()})

    out = pd.DataFrame(index=raw.index)
    out["ts_utc"], zoneless = _timestamps(rows, ts_header, raw["ts"], zone, log_format)
    out["source_tz"] = pd.Series(np.where(zoneless, tz or "", ""), index=out.index).replace("", pd.NA)
    for target, (field, header_name) in chosen.items():
        if field.kind in ("float", "int"):
            unit = re.search(r"\[([^\]]*)\]", header_name)
            out[target] = _numbers(rows, field, header_name, unit.group(1) if unit else None, raw[target])
        elif field.kind == "str":
            values = raw[target].astype("string").str.strip()
            out[target] = values.where(~values.str.lower().isin(NA_TOKENS).fillna(True))
    if "host" not in out:
        out["host"] = meta_host
    out["host"] = out["host"].astype("string").fillna(meta_host)

    # Duplicate (timestamp, host, gpu) rows among the good ones: keep the first.
    good = ~rows.bad
    dup = np.zeros(len(out), dtype=bool)
    dup[good] = out.loc[good, ["ts_utc", "host", "gpu_index"]].duplicated(keep="first").to_numpy()
    rows.reject(dup, ts_header, raw["ts"], "duplicate (timestamp, gpu) row")

    frame = out.loc[~rows.bad].copy()
    frame = _energy(frame, max_gap_s)
    frame["energy_scope"] = "gpu"
    return Batch(TABLE, batch_id(SOURCE, path, root), SOURCE, _typed(frame, log_format), rows.rejections)


_DTYPES = {
    "host": "string",
    "gpu_index": "Int64",
    "gpu_uuid": "string",
    "gpu_model": "string",
    "power_w": "Float64",
    "sm_clock_mhz": "Float64",
    "gpu_util_pct": "Float64",
    "energy_j": "Float64",
    "energy_source": "string",
    "energy_counter_j": "Float64",
    "power_limit_w": "Float64",
    "temperature_c": "Float64",
    "log_format": "string",
    "source_tz": "string",
    "job_key": "string",
    "meter_run_id": "string",
    "window_start_utc": "datetime64[ns, UTC]",
    "energy_scope": "string",
}


def _typed(frame: pd.DataFrame, log_format: str) -> pd.DataFrame:
    """The output columns in order and type (absent ones NULL), sorted."""
    frame = frame.copy()
    frame["log_format"] = log_format
    for name in OUTPUT_COLUMNS:
        if name not in frame:
            frame[name] = (
                pd.Series(pd.NaT, index=frame.index, dtype="datetime64[ns, UTC]")
                if name == "window_start_utc"
                else np.nan
            )
    order = (
        ["host", "gpu_index", "ts_utc"]
        if log_format in NODE_FORMATS
        else ["job_key", "meter_run_id", "ts_utc", "gpu_index"]
    )
    frame = frame[OUTPUT_COLUMNS].sort_values(order, kind="stable").reset_index(drop=True)
    return frame.astype(_DTYPES)


def _energy(frame: pd.DataFrame, max_gap_s: float | None) -> pd.DataFrame:
    """energy_j per row = energy since the GPU's previous sample: counter difference (measured) or trapezoid of
    power over time (integrated)."""
    frame = frame.sort_values(["host", "gpu_index", "ts_utc"], kind="stable")
    counter_j = frame["energy_mj"] / 1000.0 if "energy_mj" in frame else pd.Series(np.nan, index=frame.index)
    frame = frame.drop(columns=["energy_mj"], errors="ignore")
    frame["energy_counter_j"] = counter_j
    group = frame.groupby(["host", "gpu_index"], sort=False, dropna=False)
    first = group.cumcount().to_numpy() == 0
    measured_gpu = group["energy_counter_j"].transform(lambda s: bool(s.notna().all())).astype(bool).to_numpy()
    # measured: counter differences; a drop means the counter was reset (driver reload) and restarted at 0
    delta = group["energy_counter_j"].diff().to_numpy()
    reset = delta < 0
    delta = np.where(reset, counter_j.to_numpy(), delta)
    # integrated: trapezoid over the interval since the previous sample
    dt = group["ts_utc"].diff().dt.total_seconds().to_numpy()
    power = frame["power_w"].to_numpy(dtype="float64")
    previous_power = group["power_w"].shift().to_numpy(dtype="float64")
    trapezoid = (power + previous_power) / 2.0 * dt
    if max_gap_s is not None:
        trapezoid = np.where(dt > max_gap_s, np.nan, trapezoid)
    energy = np.where(measured_gpu, delta, trapezoid)
    energy = np.where(first, np.nan, energy)
    frame["energy_j"] = energy
    frame["energy_source"] = np.where(measured_gpu, "measured", "integrated")
    frame.loc[~measured_gpu, "energy_counter_j"] = np.nan
    return frame


# --- energy meters a job runs itself: CodeCarbon emissions.csv, ZeusMonitor log files -----------------------------

NODE_FORMATS = ("nvidia-smi", "dcgm")
METER_FORMATS = ("codecarbon", "zeus")
JOB_KEY = re.compile(r"[^/\s]+/\S+")  # a planner job id: <tenant>/<job_id>
MAX_MACHINE_POWER_W = 100_000.0  # a CodeCarbon run measures one machine: a higher mean power is a unit error
CODECARBON_FIELDS = [
    Field("duration", "float", required=True, min_value=0),
    Field("energy_kwh", "float", required=True, min_value=0),
    Field("cpu_energy_kwh", "float", min_value=0),
    Field("gpu_energy_kwh", "float", min_value=0),
    Field("ram_energy_kwh", "float", min_value=0),
]
CODECARBON_COLUMNS = {  # emissions.csv column -> loader name
    "timestamp": "ts",
    "project_name": "project_name",
    "run_id": "run_id",
    "duration": "duration",
    "energy_consumed": "energy_kwh",
    "cpu_energy": "cpu_energy_kwh",
    "gpu_energy": "gpu_energy_kwh",
    "ram_energy": "ram_energy_kwh",
    "gpu_model": "gpu_model",
}


def _job_keys(rows: _Rows, values: pd.Series, field: str, job: str | None, how: str) -> pd.Series:
    """The planner job id of each row: `job` (a sidecar's) or the row's own value, quarantined when it is none."""
    if job is not None:
        return pd.Series(job, index=values.index, dtype="string")
    keys = values.astype("string").str.strip()
    unkeyed = ~keys.str.fullmatch(JOB_KEY).fillna(False).to_numpy(dtype=bool)
    rows.reject(
        unkeyed,
        field,
        values,
        f"cannot be keyed to a job: {field} is not a planner job id '<tenant>/<job_id>' ({how}, "
        'or give the file a sidecar {"job": "<tenant>/<job_id>"})',
    )
    return keys


def _reject_row(rows: _Rows, idx: int, field: str, values: pd.Series, reason: str) -> None:
    mask = np.zeros(len(rows.raw), dtype=bool)
    mask[idx] = True
    rows.reject(mask, field, values, reason)


def _load_codecarbon(
    path: Path, text: str, header: list[str], zone: ZoneInfo | None, tz: str | None, host: str, job: str | None
) -> tuple[pd.DataFrame, list[Rejection]]:
    """CodeCarbon emissions.csv: one row per flush()/stop() with the run's totals so far (kWh, s), per run_id.
    energy_j of a row = energy_consumed since the run's previous row (all of it at its first row), over
    [timestamp - the duration since then, timestamp]."""
    missing = [
        name for name in ("timestamp", "project_name", "run_id", "duration", "energy_consumed") if name not in header
    ]
    if missing:
        raise LoadError(path, f"missing column; header is {header}", row=1, field=missing[0])
    columns = [Column(name, "str", nullable=True, rename=target) for name, target in CODECARBON_COLUMNS.items()]
    raw, _ = read_checked_csv(path, columns, line_column="_line")
    raw = raw.loc[raw["ts"].astype("string").str.strip() != "timestamp"].reset_index(drop=True)
    lines = raw.pop("_line").to_numpy()
    names = {target: name for name, target in CODECARBON_COLUMNS.items()}
    rows = _Rows(path, raw, lines, names)
    out = pd.DataFrame(index=raw.index)
    out["job_key"] = _job_keys(rows, raw["project_name"], "project_name", job, "set EmissionsTracker(project_name=...)")
    run_id = raw["run_id"].astype("string").str.strip()
    rows.reject(
        run_id.isna().to_numpy() | (run_id == "").fillna(True).to_numpy(), "run_id", raw["run_id"], "missing value"
    )
    out["meter_run_id"] = run_id
    out["ts_utc"], zoneless = _timestamps(rows, "timestamp", raw["ts"], zone, "codecarbon")
    out["source_tz"] = pd.Series(np.where(zoneless, tz or "", ""), index=out.index).replace("", pd.NA)
    for field in CODECARBON_FIELDS:
        out[field.target] = _numbers(rows, field, names[field.target], None, raw[field.target])
    model = raw["gpu_model"].astype("string").str.strip()
    out["gpu_model"] = model.where(~model.str.lower().isin(NA_TOKENS).fillna(True))

    # Totals per run: each row's share is its difference to the run's previous good row.
    delta_kwh = pd.Series(np.nan, index=out.index)
    delta_s = pd.Series(np.nan, index=out.index)
    previous: dict[str, tuple[float, float, int]] = {}  # run_id -> duration, energy, line of its last good row
    good = out.loc[~rows.bad].sort_values(["meter_run_id", "duration"], kind="stable")
    for idx, run, duration, energy in zip(good.index, good["meter_run_id"], good["duration"], good["energy_kwh"]):
        last = previous.get(run)
        if last is not None and duration == last[0]:
            _reject_row(rows, idx, "duration", raw["duration"], f"duplicate (run_id, duration) row: as row {last[2]}")
        elif last is not None and energy < last[1]:
            _reject_row(
                rows,
                idx,
                "energy_consumed",
                raw["energy_kwh"],
                f"energy_consumed falls below row {last[2]} of the same run_id (a run's rows are running totals)",
            )
        else:
            delta_kwh[idx] = energy - (last[1] if last else 0.0)
            delta_s[idx] = duration - (last[0] if last else 0.0)
            previous[run] = (duration, energy, int(lines[idx]))
    mean_w = delta_kwh * 3.6e6 / delta_s.where(delta_s > 0)
    implausible = ((mean_w > MAX_MACHINE_POWER_W) | ((delta_s == 0) & (delta_kwh > 0))).to_numpy(dtype=bool)
    rows.reject(
        implausible,
        "energy_consumed",
        raw["energy_kwh"],
        f"implausible energy: a mean power above {MAX_MACHINE_POWER_W / 1000:g} kW over the interval "
        "(energy_consumed must be kWh)",
    )
    frame = out.loc[~rows.bad].copy()
    frame["energy_j"] = delta_kwh[~rows.bad] * 3.6e6
    frame["window_start_utc"] = frame["ts_utc"] - pd.to_timedelta(delta_s[~rows.bad], unit="s")
    frame["energy_counter_j"] = frame["energy_kwh"] * 3.6e6
    frame["power_w"] = mean_w[~rows.bad]
    frame["energy_source"] = "measured"
    frame["energy_scope"] = "machine"
    frame["host"] = host
    return frame, rows.rejections


def _load_zeus(
    path: Path, text: str, header: list[str], zone: ZoneInfo | None, tz: str | None, host: str, job: str | None
) -> tuple[pd.DataFrame, list[Rejection]]:
    """ZeusMonitor(log_file=...): `start_time,window_name,elapsed_time,gpu<i>_energy,...` per ended window (start
    Unix s, elapsed s, energy J per GPU). One row per window x GPU; energy_j = the GPU's energy in the window.
    The writer does not quote: commas in a window name split it, so the fields between start_time and the last
    ones are joined back into the name."""
    gpus = []
    for name in header[3:] if any(header[3:]) else []:  # no GPU monitored: the header ends in a comma
        match = re.fullmatch(r"gpu(\d+)_energy", name)
        if match is None:
            raise LoadError(
                path, f"not a ZeusMonitor energy column (gpu<i>_energy); header is {header}", row=1, field=name
            )
        gpus.append(int(match.group(1)))
    if not gpus:
        raise LoadError(path, "a ZeusMonitor log without GPU energy columns (gpu<i>_energy)", row=1)
    records, lines, short = [], [], []
    reader = csv.reader(io.StringIO(text, newline=""))
    next(reader)
    for cells in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in cells) or [c.strip() for c in cells] == header:
            continue
        if len(cells) < len(header):
            short.append((line, cells))
            continue
        extra = len(cells) - len(header)
        records.append([cells[0], ",".join(cells[1 : 2 + extra]), *cells[2 + extra :]])
        lines.append(line)
    energy_names = [f"gpu{i}_energy" for i in gpus]
    raw = pd.DataFrame(records, columns=["ts", "window_name", "elapsed_time", *energy_names], dtype="string")
    rows = _Rows(path, raw, np.array(lines, dtype="int64"), {"ts": "start_time"})
    for line, cells in short:
        rows.rejections.append(
            Rejection(
                reason=f"{len(cells)} fields, the header has {len(header)} (a truncated line?)",
                file=str(path),
                row_number=line,
                field=header[len(cells)] if len(cells) < len(header) else None,
                record=dict(zip(header, cells)),
            )
        )
    out = pd.DataFrame(index=raw.index)
    out["job_key"] = _job_keys(rows, raw["window_name"], "window_name", job, "name the job's window after it")
    out["meter_run_id"] = raw["window_name"]
    epoch = raw["ts"].str.strip().str.fullmatch(r"\d+(?:\.\d*)?").fillna(False).to_numpy(dtype=bool)
    rows.reject(~epoch, "start_time", raw["ts"], "not a Unix time in seconds")
    start, _ = _timestamps(rows, "start_time", raw["ts"].where(epoch, "0"), None, "zeus")
    elapsed = _numbers(
        rows, Field("elapsed_time", "float", required=True, min_value=0), "elapsed_time", None, raw["elapsed_time"]
    )
    energy = {}
    for i, name in zip(gpus, energy_names):
        energy[i] = _numbers(rows, Field("energy_j", "float", required=True, min_value=0), name, None, raw[name])
        mean_w = energy[i] / elapsed.where(elapsed > 0)
        implausible = ((mean_w > 5000) | ((elapsed == 0) & (energy[i] > 0))).to_numpy(dtype=bool)
        rows.reject(
            implausible,
            name,
            raw[name],
            "implausible energy: a mean power above 5000 W over the window (gpu<i>_energy must be J)",
        )
    end = start + pd.to_timedelta(elapsed, unit="s")
    # Nested or repeated windows of one job would count its energy twice: keep the first of overlapping ones.
    last_end: dict[str, tuple[pd.Timestamp, int]] = {}  # job -> end and line of its latest kept window
    good = pd.DataFrame({"job_key": out["job_key"], "start": start, "end": end}).loc[~rows.bad]
    for idx, key, begin, finish in good.sort_values(["job_key", "start"], kind="stable").itertuples():
        if key in last_end and begin < last_end[key][0]:
            reason = f"window overlaps the window of row {last_end[key][1]} for the same job (counted twice)"
            _reject_row(rows, idx, "start_time", raw["ts"], reason)
        else:
            last_end[key] = (finish, int(lines[idx]))
    keep = ~rows.bad
    parts = []
    for i in gpus:
        part = out.loc[keep, ["job_key", "meter_run_id"]].copy()
        part["gpu_index"] = i
        part["ts_utc"] = end[keep]
        part["window_start_utc"] = start[keep]
        part["energy_j"] = energy[i][keep]
        part["power_w"] = (energy[i] / elapsed.where(elapsed > 0))[keep]
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    frame["energy_source"] = "measured"
    frame["energy_scope"] = "gpu"
    frame["host"] = host
    return frame, rows.rejections


def _files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, ["telemetry/**/*.csv"])


def _batches(data_dir: Path) -> Iterator[Batch]:
    for path in _files(data_dir):
        meta = _sidecar(path)
        yield load_telemetry_file(
            path, tz=meta.get("tz", "UTC"), host=meta.get("host"), data_dir=data_dir, job=meta.get("job")
        )


telemetry = Source(
    SOURCE,
    "energy",
    "GPU telemetry logs (nvidia-smi --query-gpu CSV, DCGM-exporter CSV) and job energy meters (CodeCarbon "
    "emissions.csv, ZeusMonitor log) under DATA_DIR/telemetry -> raw.gpu_telemetry",
    _batches,
    _files,
)

SOURCES: list[Source] = [telemetry]
