"""Job files: YAML (a top-level `jobs:` list of mappings), JSON (a list, or `{"jobs": [...]}`) and CSV (a header
row; list fields as `a|b`), read into one raw mapping per job with where it stood in the file.

    jobs = read_job_file("jobs.yaml")      # -> [RawJob(row_number, where, data), ...]

The format comes from the extension (.yaml/.yml, .json, .csv). `row_number` is the job's line in the file for YAML
and CSV (header = line 1) and its position in the list (1-based) for JSON. Bytes that are not UTF-8 are read as
U+FFFD, so the field holding them is rejected by the spec's checks (naming the job) instead of the whole file.
A file that cannot be read as a whole (not found, too large, not the format, no job list) raises `JobFileError`
naming the file and, where known, the line. Values stay as the format gives them; `scheduling.queue.spec` parses
them (CSV cells are strings, an empty cell is a missing value).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_JOBS_PER_FILE = 100_000
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".csv": "csv"}


class JobFileError(ValueError):
    """The file as a whole cannot be read; the message names the file (and line where known)."""


@dataclass(frozen=True)
class RawJob:
    """One job's mapping as the file holds it, with its place: `row_number` (see the module doc) and `where`
    (file and line/position, for messages). `error`: why this one entry cannot be read as a job (a field given
    twice, a CSV row with the wrong number of cells); the intake rejects it with that reason."""

    row_number: int | None
    where: str
    data: object
    error: str | None = None


def file_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise JobFileError(f"{path}: unknown job file type {path.suffix!r}; use .yaml, .yml, .json or .csv")
    return fmt


def read_text(path: Path) -> str:
    """The file's text (invalid UTF-8 bytes as U+FFFD), refusing files over MAX_FILE_BYTES."""
    if not path.exists():
        raise JobFileError(f"{path}: no such file")
    if not path.is_file():
        raise JobFileError(f"{path}: not a file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise JobFileError(f"{path}: {size} bytes, more than the {MAX_FILE_BYTES} a job file may have")
    return path.read_bytes().decode("utf-8", errors="replace")


def read_job_file(path: str | Path, key: str = "jobs") -> list[RawJob]:
    """The entries of a YAML/JSON file's top-level `key` list (`jobs`, or `services` for a services file), or of a
    CSV file's rows."""
    path = Path(path)
    fmt = file_format(path)
    text = read_text(path)
    jobs = _csv(path, text) if fmt == "csv" else {"yaml": _yaml, "json": _json}[fmt](path, text, key)
    if len(jobs) > MAX_JOBS_PER_FILE:
        raise JobFileError(f"{path}: {len(jobs)} entries, more than {MAX_JOBS_PER_FILE} in one file")
    return jobs


def _yaml(path: Path, text: str, key: str = "jobs") -> list[RawJob]:
    try:
        docs = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    if len(docs) != 1:
        raise JobFileError(f"{path}: expected one YAML document with a `{key}:` list, found {len(docs)}")
    root = docs[0]
    if not isinstance(root, yaml.MappingNode):
        raise JobFileError(f"{path}: the top level must be a mapping with a `{key}:` list")
    node = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    if node is None:
        raise JobFileError(f"{path}: no top-level `{key}:` list")
    if not isinstance(node, yaml.SequenceNode):
        raise JobFileError(f"{path}, line {node.start_mark.line + 1}: `{key}` must be a list of mappings")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # composed but not constructed (e.g. a bad timestamp or tag)
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    other = sorted(str(k) for k in data if k != key)
    if other:
        raise JobFileError(f"{path}: unknown top-level key(s) {other}; only `{key}:` is read")
    items = data[key] or []
    out = []
    for item_node, item in zip(node.value, items):
        line = item_node.start_mark.line + 1
        error = None
        if isinstance(item_node, yaml.MappingNode):
            keys = [k.value for k, _ in item_node.value if isinstance(k, yaml.ScalarNode)]
            dup = sorted({k for k in keys if keys.count(k) > 1})
            if dup:
                error = f"field(s) {dup} given more than once"
        out.append(RawJob(line, f"{path}, line {line}", item, error))
    return out


def _json(path: Path, text: str, key: str = "jobs") -> list[RawJob]:
    try:
        data = json.loads(text, object_pairs_hook=_JsonObject.from_pairs)
    except json.JSONDecodeError as exc:
        raise JobFileError(f"{path}, line {exc.lineno}: not valid JSON: {exc.msg}") from None
    if isinstance(data, dict):
        other = sorted(k for k in data if k != key)
        if key not in data:
            raise JobFileError(f"{path}: a JSON object needs a `{key}` list")
        if other:
            raise JobFileError(f"{path}: unknown top-level key(s) {other}; only `{key}` is read")
        data = data[key]
    if not isinstance(data, list):
        raise JobFileError(f'{path}: expected a list of {key} or {{"{key}": [...]}}, got {type(data).__name__}')
    out = []
    for i, item in enumerate(data):
        dup = getattr(item, "duplicates", ())
        error = f"field(s) {list(dup)} given more than once" if dup else None
        out.append(RawJob(i + 1, f"{path}, {key[:-1]} #{i + 1}", dict(item) if isinstance(item, dict) else item, error))
    return out


class _JsonObject(dict):
    """A JSON object that remembers the keys it was given more than once (json keeps the last silently)."""

    duplicates: tuple[str, ...] = ()

    @classmethod
    def from_pairs(cls, pairs):
        obj = cls(pairs)
        keys = [k for k, _ in pairs]
        obj.duplicates = tuple(sorted({k for k in keys if keys.count(k) > 1}))
        return obj


def _csv(path: Path, text: str) -> list[RawJob]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise JobFileError(f"{path}: empty CSV (no header row)") from None
    except csv.Error as exc:
        raise JobFileError(f"{path}, line 1: not valid CSV: {exc}") from None
    header = [h.strip().lstrip("\ufeff") for h in header]
    if len(set(header)) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise JobFileError(f"{path}, line 1: duplicate column(s) {dup}")
    out = []
    line = reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise JobFileError(f"{path}, line {reader.line_num}: not valid CSV: {exc}") from None
        start, line = line + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        error = None
        if len(row) != len(header):
            error = f"the row has {len(row)} cells, the header {len(header)}"
        out.append(RawJob(start, f"{path}, line {start}", dict(zip(header, row)), error))
    return out
