"""Shared pieces of the file loaders: the Source record, a checked CSV reader, and load errors.

A loader turns a file into a `Batch`. Problems with a whole file (missing, empty, binary, wrong header) raise
`LoadError` naming the file (and field); problems with single rows become `Rejection`s that go to
`quarantine.rejected_rows` with file, row number (1-based line in the file, header = line 1), field and reason.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from warehouse.db import Batch, Rejection


class LoadError(ValueError):
    """A file that cannot be loaded at all. The message names the file, and the row/field where known."""

    def __init__(self, file: Path | str, message: str, row: int | None = None, field: str | None = None):
        self.file, self.row, self.field = str(file), row, field
        where = self.file
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Source:
    """A named ingest source: `batches(data_dir)` yields the batches it loads; `files` lists its inputs."""

    name: str
    group: str  # cluster | energy | interference | grid
    description: str
    batches: Callable[[Path], Iterable[Batch]]
    files: Callable[[Path], list[Path]]


@dataclass(frozen=True)
class Column:
    """Expected CSV column. kind: int | float | str | timestamp | bool."""

    name: str
    kind: str = "float"
    nullable: bool = False
    min_value: float | None = None
    max_value: float | None = None
    rename: str | None = None  # name in the warehouse, when it differs
    required: bool = True  # False: may be absent from the header (filled with NULL)
    aliases: tuple[str, ...] = field(default_factory=tuple)


def _sniff_text(path: Path) -> str:
    if not path.exists():
        raise LoadError(path, "file not found")
    raw = path.read_bytes()
    if not raw.strip():
        raise LoadError(path, "file is empty")
    if b"\x00" in raw[:65536]:
        raise LoadError(path, "file is binary (NUL bytes), not CSV text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise LoadError(path, f"not UTF-8 text (byte {exc.start})", row=line) from None


def read_checked_csv(
    path: Path,
    columns: list[Column],
    *,
    key: list[str] | None = None,
    assume_utc: bool = True,
    keep_extra: bool = False,
    line_column: str | None = None,
) -> tuple[pd.DataFrame, list[Rejection]]:
    """Read a CSV, check header and types row by row, and split good rows from rejected ones.

    Returns the typed frame (warehouse column names) and the rejections. `key` columns (warehouse names) must be
    unique: later duplicates of a good row are rejected. Timestamps without a zone are taken as UTC when
    `assume_utc`, else the row is rejected. With `line_column`, the output gets that column holding each row's
    line number in the file (for loaders that check rows further and quarantine with the right row number).
    """
    text = _sniff_text(path)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    except pd.errors.ParserError as exc:
        raise LoadError(path, f"malformed CSV: {exc}", row=_parser_error_line(str(exc))) from None
    except pd.errors.EmptyDataError:
        raise LoadError(path, "no header row") from None
    if frame.empty and len(frame.columns) == 0:
        raise LoadError(path, "no header row")
    header = [str(c).strip() for c in frame.columns]
    frame.columns = header
    out = pd.DataFrame(index=frame.index)
    bad = pd.Series(False, index=frame.index)
    rejections: list[Rejection] = []
    line_numbers = _line_numbers(text, len(frame))
    # Stripping is a Python-level loop per value: skip it when no field can start or end with whitespace.
    needs_strip = _may_need_strip(text)

    def reject(mask: pd.Series, column: str, values: pd.Series, reason: str) -> None:
        hits = np.asarray(mask, dtype=bool) & ~bad.to_numpy()
        if not hits.any():  # the common case: nothing to reject, skip the indexing below
            return
        for idx in np.flatnonzero(hits):
            row_label = frame.index[idx]
            rejections.append(
                Rejection(
                    reason=reason,
                    file=str(path),
                    row_number=int(line_numbers[idx]),
                    field=column,
                    value=None if pd.isna(values.iloc[idx]) else str(values.iloc[idx]),
                    record={k: frame.at[row_label, k] for k in header},
                )
            )
        bad.loc[hits] = True

    for col in columns:
        name = next((n for n in (col.name, *col.aliases) if n in header), None)
        target = col.rename or col.name
        if name is None:
            if col.required:
                raise LoadError(path, f"missing column; header is {header}", row=1, field=col.name)
            out[target] = pd.Series([pd.NA] * len(frame), index=frame.index, dtype=_null_dtype(col.kind))
            continue
        values = frame[name].str.strip() if len(frame) and needs_strip else frame[name]
        missing = values.isna() | (values == "")
        if not col.nullable:
            reject(missing, col.name, values, "missing value")
        if col.kind in ("int", "float"):
            numeric = pd.to_numeric(values.where(~missing), errors="coerce").astype("float64")
            reject(~missing & numeric.isna(), col.name, values, f"not a number (expected {col.kind})")
            reject(~missing & np.isinf(numeric), col.name, values, "not a finite number")
            numeric = numeric.where(~bad)
            if col.kind == "int":
                fractional = numeric.notna() & (numeric != np.floor(numeric.fillna(0)))
                reject(fractional, col.name, values, "not an integer")
                reject(numeric.abs() >= 2.0**63, col.name, values, "integer out of range (64-bit)")
                numeric = numeric.where(~bad)
            if col.min_value is not None:
                reject(numeric < col.min_value, col.name, values, f"below minimum {col.min_value}")
            if col.max_value is not None:
                reject(numeric > col.max_value, col.name, values, f"above maximum {col.max_value}")
            out[target] = numeric.astype("Int64" if col.kind == "int" else "Float64")
        elif col.kind == "timestamp":
            stripped = values.where(~missing)
            has_zone = stripped.str.contains(r"(?:Z|[+-]\d\d:?\d\d)$", regex=True, na=False)
            if not assume_utc:
                reject(~missing & ~has_zone, col.name, values, "timestamp has no time zone")
            parsed = pd.Series(pd.NaT, index=frame.index, dtype="datetime64[ns, UTC]")
            for zone_mask in (has_zone, ~has_zone):
                part = stripped[zone_mask & ~missing]
                if len(part):
                    parsed.loc[part.index] = pd.to_datetime(part, utc=True, errors="coerce", format="mixed")
            reject(~missing & parsed.isna(), col.name, values, "not a timestamp")
            out[target] = parsed
        elif col.kind == "bool":
            lowered = values.str.lower()
            truth = lowered.map({"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False})
            reject(~missing & truth.isna(), col.name, values, "not a boolean")
            out[target] = truth.astype("boolean")
        else:
            out[target] = values.astype("string")
    if keep_extra:
        known = {n for c in columns for n in (c.name, *c.aliases)}
        for name in header:
            if name not in known:
                out[name] = frame[name]
    if key:
        # Duplicates among the good rows only: a rejected row must not push out a later good one.
        dup = pd.Series(False, index=frame.index)
        dup.loc[~bad] = out.loc[~bad, key].duplicated(keep="first")
        for idx in np.flatnonzero(dup.to_numpy()):
            row_label = frame.index[idx]
            rejections.append(
                Rejection(
                    reason=f"duplicate key {key}",
                    file=str(path),
                    row_number=int(line_numbers[idx]),
                    field=",".join(key),
                    value=",".join(str(out.at[row_label, k]) for k in key),
                    record={k: frame.at[row_label, k] for k in header},
                )
            )
        bad |= dup
    if line_column:
        out[line_column] = pd.Series(line_numbers, index=frame.index, dtype="int64")
    good = out.loc[~bad].reset_index(drop=True)
    return good, rejections


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_SPACE_AT_FIELD_EDGE = re.compile(r'(?:^|[,"])[^\S\r\n]|[^\S\r\n](?:[,"]|\r?$)|"[\r\n]|[\r\n]"', re.MULTILINE)
_ASCII_SPACES = (" ", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")  # what str.strip removes, less CR/LF


def _may_need_strip(text: str) -> bool:
    """False only when no CSV field can start or end with whitespace (fast substring checks; a regex for quoted or
    non-ASCII text)."""
    if not text.isascii() or '"' in text:
        return _SPACE_AT_FIELD_EDGE.search(text) is not None
    for space in _ASCII_SPACES:
        if space in text and (
            text.startswith(space)
            or text.endswith(space)
            or any(
                edge in text
                for edge in (space + ",", "," + space, space + "\n", "\n" + space, space + "\r", "\r" + space)
            )
        ):
            return True
    return False


def _line_numbers(text: str, n_rows: int) -> np.ndarray:
    """1-based file line of each data row. pandas skips blank lines, so count only non-blank ones; fall back
    to header + index when the count does not match (quoted fields spanning lines)."""
    lines = _LINE_BREAK.split(text)
    non_blank = np.flatnonzero(np.fromiter((bool(line.strip()) for line in lines), dtype=bool, count=len(lines)))
    if len(non_blank) == n_rows + 1:
        return non_blank[1:] + 1
    return np.arange(n_rows) + 2


def _parser_error_line(message: str) -> int | None:
    """The file line a pandas ParserError points at, where it says."""
    match = re.search(r"in line (\d+)", message)
    if match:
        return int(match.group(1))
    match = re.search(r"starting at row (\d+)", message)  # 0-based record index, header = 0
    if match:
        return int(match.group(1)) + 1
    return None


def _null_dtype(kind: str) -> str:
    return {"int": "Int64", "float": "Float64", "timestamp": "datetime64[ns, UTC]", "bool": "boolean"}.get(
        kind, "string"
    )


def relative_name(path: Path, root: Path) -> str:
    """Stable batch key part: the file's path relative to DATA_DIR (also when the file is a symlink elsewhere)."""
    for file, base in ((Path(path).absolute(), Path(root).absolute()), (Path(path).resolve(), Path(root).resolve())):
        try:
            return str(file.relative_to(base))
        except ValueError:
            continue
    return Path(path).name
