"""GPU telemetry logs: `nvidia-smi --query-gpu=... --format=csv` and DCGM-exporter CSV exports -> raw.gpu_telemetry.

Two log formats, told apart by the header:

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

Output `raw.gpu_telemetry(ts_utc TIMESTAMPTZ, host, gpu_index, gpu_uuid, gpu_model, power_w, sm_clock_mhz,
gpu_util_pct, energy_j, energy_source, energy_counter_j, power_limit_w, temperature_c, log_format, source_tz)`:

* `energy_j` is the energy the GPU used since its previous sample in the same file (J), NULL at its first sample;
  so SUM(energy_j) over a time range is the energy in that range. `energy_source` = `measured` when it is the
  difference of the DCGM energy counter (a counter reset counts from 0), `integrated` when the log has no energy and
  it is the trapezoid of power over time; gaps longer than `max_gap_s` (default 300 s) are not integrated (NULL).
  `energy_counter_j` is the raw DCGM counter in J (NULL for integrated rows).
* Quarantined rows (with file, line, field, reason): missing/non-numeric/negative power and other negative or
  out-of-range values, wrong units, unparsable timestamps, timestamps without a zone when `tz=None` or when other rows
  of the same file carry a zone, local times that do not exist or are ambiguous in `tz` (DST), and duplicate
  (timestamp, host, gpu) rows (the first is kept). A repeated header line (a logger restarted onto the same file)
  is skipped. Whole-file problems (empty, binary, unknown header) raise LoadError.

`DATA_DIR/telemetry/**/*.csv` is the `telemetry` source (absent in the shared data: it yields nothing); a sidecar
`<file>.json` may give {"tz": "...", "host": "..."} for a log.
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
    """'nvidia-smi' or 'dcgm' from a CSV header; '' when neither."""
    bases = {_base_name(h) for h in header}
    if any(b.startswith("DCGM_FI_") for b in bases):
        return "dcgm"
    if "timestamp" in bases and bases & {"power.draw", "power.draw.instant", "power.draw.average"}:
        return "nvidia-smi"
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
        raise LoadError(side, 'sidecar must be a JSON object like {"tz": "Europe/Berlin", "host": "node-a"}')
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
        rows.reject(
            below,
            header_name,
            values,
            "negative power"
            if field.target == "power_w" and field.min_value == 0
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
) -> Batch:
    """One nvidia-smi or DCGM-exporter CSV log as a Batch for raw.gpu_telemetry (see the module docstring).

    tz: zone of timestamps written without one (nvidia-smi local time); None quarantines such rows.
    host: host name when the log has no Hostname column (default: the file name without extension).
    """
    path = Path(path)
    zone = _timezone(tz)
    text = _sniff_text(path)
    header = _header(text, path)
    log_format = detect_format(header)
    if not log_format:
        raise LoadError(
            path,
            "not a GPU telemetry log: expected an nvidia-smi --query-gpu CSV (timestamp, index, power.draw [W], ...) "
            f"or a DCGM-exporter CSV (DCGM_FI_DEV_* columns); header is {header}",
            row=1,
        )
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
    meta_host = host if host is not None else path.stem
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
    frame["log_format"] = log_format
    for name in OUTPUT_COLUMNS:
        if name not in frame:
            frame[name] = np.nan
    frame = frame[OUTPUT_COLUMNS].sort_values(["host", "gpu_index", "ts_utc"], kind="stable").reset_index(drop=True)
    frame = frame.astype(
        {
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
        }
    )
    root = Path(data_dir) if data_dir is not None else path.parent
    return Batch(TABLE, batch_id(SOURCE, path, root), SOURCE, frame, rows.rejections)


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


def _files(data_dir: Path) -> list[Path]:
    return glob_files(data_dir, ["telemetry/**/*.csv"])


def _batches(data_dir: Path) -> Iterator[Batch]:
    for path in _files(data_dir):
        meta = _sidecar(path)
        yield load_telemetry_file(path, tz=meta.get("tz", "UTC"), host=meta.get("host"), data_dir=data_dir)


telemetry = Source(
    SOURCE,
    "energy",
    "GPU telemetry logs (nvidia-smi --query-gpu CSV, DCGM-exporter CSV) under DATA_DIR/telemetry -> raw.gpu_telemetry",
    _batches,
    _files,
)

SOURCES: list[Source] = [telemetry]
