"""DuckDB access with the single-writer discipline of DESIGN.md.

DuckDB lets one process open a file for writing, and no other process may open it meanwhile. Every process
that touches the warehouse therefore goes through an advisory file lock beside the database: writers take it
exclusively, readers shared. Airflow additionally serializes warehouse tasks with a one-slot pool; the lock makes
the CLI, tests and ad-hoc scripts safe too. Connections are short-lived: open, do the work, close; a step that
opens many in a row (one hour of the operating loop) holds one for its duration with `session`.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

from warehouse import catalog
from warehouse.config import warehouse_path

LOCK_TIMEOUT_S = 600.0
META_COLUMNS = ("_source", "_batch_id", "_loaded_at")

DDL = """
CREATE SCHEMA IF NOT EXISTS raw;
CREATE SCHEMA IF NOT EXISTS quarantine;
CREATE TABLE IF NOT EXISTS raw._batches (
    table_name VARCHAR NOT NULL,
    batch_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    row_count BIGINT NOT NULL,
    rejected_count BIGINT NOT NULL,
    loaded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (table_name, batch_id)
);
CREATE TABLE IF NOT EXISTS quarantine.rejected_rows (
    table_name VARCHAR NOT NULL,
    batch_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    file VARCHAR,
    row_number BIGINT,
    field VARCHAR,
    value VARCHAR,
    reason VARCHAR NOT NULL,
    record VARCHAR,
    _loaded_at TIMESTAMPTZ NOT NULL
);
"""


# Table and column constraints DuckLake rejects: `, PRIMARY KEY (...)`, `, CHECK (...)`, ` PRIMARY KEY`, ` CHECK (...)`
_PARENS = r"\((?:[^()]|\([^()]*\))*\)"
_TABLE_CONSTRAINT = re.compile(rf",\s*(?:PRIMARY KEY|CHECK)\s*{_PARENS}")
_COLUMN_CONSTRAINT = re.compile(rf"\s+(?:PRIMARY KEY\b|CHECK\s*{_PARENS})")


def unconstrained(ddl: str) -> str:
    """`ddl` without PRIMARY KEY and CHECK constraints (DuckLake supports neither)."""
    return _COLUMN_CONSTRAINT.sub("", _TABLE_CONSTRAINT.sub("", ddl))


def create_tables(con: duckdb.DuckDBPyConnection, ddl: str) -> None:
    """Run a store's CREATE ... IF NOT EXISTS script: as written on a DuckDB file, without its constraints on a
    shared catalog (DuckLake, MotherDuck), where the store keeps its keys unique itself (delete-insert, checks in
    its transaction)."""
    kind = con.execute("SELECT type FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    con.execute(ddl if kind is None or kind[0] == "duckdb" else unconstrained(ddl))


# Shared catalogs (warehouse.catalog: DuckLake, MotherDuck) get the DDL without the PRIMARY KEY, which DuckLake does
# not support; load_batch keeps raw._batches unique itself (delete-insert in its transaction).
SHARED_DDL = unconstrained(DDL)


def _shared_target(path):
    """The shared catalog configured by WAREHOUSE_CATALOG, or None for the local file (always when a path is given)."""
    if path:
        return None
    target = catalog.from_env()
    return None if target is None or target.is_local else target


class WarehouseLockTimeout(RuntimeError):
    pass


# (resolved path, connection) of the `session` this context is in, if any
_SESSION: contextvars.ContextVar[tuple[Path, duckdb.DuckDBPyConnection] | None] = contextvars.ContextVar(
    "warehouse_session", default=None
)


def _session_connection(path) -> duckdb.DuckDBPyConnection | None:
    active = _SESSION.get()
    if active is None or _shared_target(path) is not None:
        return None
    db_path = Path(path) if path else warehouse_path()
    return active[1] if db_path.resolve() == active[0] else None


@contextlib.contextmanager
def session(path: Path | str | None = None, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the writing connection for a block of work: every `reader`/`writer` of the same warehouse inside it
    (in this thread of control) reuses it instead of opening its own. Opening and closing a connection costs tens of
    milliseconds on a large file, and a loop hour opens dozens. Nested sessions reuse the outer one; the shared
    catalogs (no file lock) are not held."""
    if _shared_target(path) is not None or _session_connection(path) is not None:
        yield
        return
    db_path = (Path(path) if path else warehouse_path()).resolve()
    with writer(db_path, timeout_s=timeout_s) as con:
        token = _SESSION.set((db_path, con))
        try:
            yield
        finally:
            _SESSION.reset(token)


@contextlib.contextmanager
def _file_lock(path: Path, exclusive: bool, timeout_s: float) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+") as handle:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    kind = "write" if exclusive else "read"
                    raise WarehouseLockTimeout(
                        f"could not get the {kind} lock on {path} within {timeout_s:.0f} s; another process "
                        f"holds the warehouse (see {lock_path})"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _connect(path: Path, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    # A process outside our lock discipline (dbt run by hand, say) may still hold the file: retry briefly.
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


@contextlib.contextmanager
def writer(path: Path | str | None = None, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """The one writing connection: exclusive lock, schemas ensured, closed on exit. With WAREHOUSE_CATALOG=ducklake
    or motherduck (and no explicit path): a connection to the shared catalog, which arbitrates writers itself.
    Inside a `session` of the same warehouse: the session's connection."""
    held = _session_connection(path)
    if held is not None:
        yield held
        return
    target = _shared_target(path)
    if target is not None:
        con = catalog.connect(target)
        try:
            con.execute("SET TimeZone = 'UTC'")
            con.execute(SHARED_DDL)
            yield con
        finally:
            con.close()
        return
    db_path = Path(path) if path else warehouse_path()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(db_path, exclusive=True, timeout_s=timeout_s):
        con = _connect(db_path, read_only=False, timeout_s=timeout_s)
        try:
            con.execute("SET TimeZone = 'UTC'")
            con.execute("SET enable_progress_bar = false")
            con.execute(DDL)
            yield con
        finally:
            con.close()


@contextlib.contextmanager
def reader(path: Path | str | None = None, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection (shared lock). Fails clearly when the warehouse does not exist yet. Shared catalog:
    the lake attached read-only (or the MotherDuck database), no file lock. Inside a `session` of the same
    warehouse: the session's (writing) connection."""
    held = _session_connection(path)
    if held is not None:
        yield held
        return
    target = _shared_target(path)
    if target is not None:
        con = catalog.connect(target, read_only=True)
        try:
            con.execute("SET TimeZone = 'UTC'")
            yield con
        finally:
            con.close()
        return
    db_path = Path(path) if path else warehouse_path()
    if not db_path.exists():
        raise FileNotFoundError(f"warehouse {db_path} does not exist yet; run `python -m warehouse ingest --all` first")
    with _file_lock(db_path, exclusive=False, timeout_s=timeout_s):
        con = _connect(db_path, read_only=True, timeout_s=timeout_s)
        try:
            con.execute("SET TimeZone = 'UTC'")
            yield con
        finally:
            con.close()


@contextlib.contextmanager
def warehouse_lock(
    path: Path | str | None = None, exclusive: bool = True, timeout_s: float = LOCK_TIMEOUT_S
) -> Iterator[Path]:
    """The warehouse's advisory lock alone, without opening DuckDB: for a process that opens the file itself
    (dbt run by transforms/runner.py). Exclusive = writer, shared = reader; yields the database path."""
    db_path = Path(path) if path else warehouse_path()
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(db_path, exclusive=exclusive, timeout_s=timeout_s):
        yield db_path


@dataclass
class Rejection:
    """One rejected input row, with the place and reason it was rejected."""

    reason: str
    file: str | None = None
    row_number: int | None = None
    field: str | None = None
    value: str | None = None
    record: dict | None = None


@dataclass
class Batch:
    """A unit of idempotent loading: `table` gets exactly `frame` for `batch_id` (plus its rejections)."""

    table: str  # schema-qualified, e.g. raw.openb_pods
    batch_id: str  # stable key: source + file or interval
    source: str
    frame: pd.DataFrame
    rejections: list[Rejection] = field(default_factory=list)


@dataclass
class LoadResult:
    table: str
    batch_id: str
    rows: int
    rejected: int
    skipped_unchanged: bool


def _content_hash(frame: pd.DataFrame, rejections: list[Rejection]) -> str:
    digest = hashlib.sha256()
    digest.update(",".join(map(str, frame.columns)).encode())
    digest.update(",".join(map(str, frame.dtypes)).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).values.tobytes())
    for rej in rejections:
        digest.update(json.dumps(rej.__dict__, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def table_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether `schema.name` exists in the warehouse `con` is connected to."""
    schema, name = table.split(".", 1)
    return bool(
        con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
            [schema, name],
        ).fetchone()[0]
    )


def column_exists(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Whether `schema.name` has `column` (tables written before a column was added lack it)."""
    schema, name = table.split(".", 1)
    return bool(
        con.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = ? AND table_name = ? "
            "AND column_name = ?",
            [schema, name, column],
        ).fetchone()[0]
    )


REJECTED_VALUE_CHARS = 500  # quarantine.rejected_rows.value keeps this much of the bad value
REJECTED_RECORD_CHARS = 2000  # and this much of the row's JSON


def rejection_rows(table: str, batch_id: str, source: str, rejections: list[Rejection]) -> list[dict]:
    """The quarantine.rejected_rows rows of `rejections` (without `_loaded_at`): the value and the record are cut
    to REJECTED_VALUE_CHARS / REJECTED_RECORD_CHARS, so a huge bad value cannot bloat the quarantine."""
    return [
        {
            "table_name": table,
            "batch_id": batch_id,
            "source": source,
            "file": r.file,
            "row_number": r.row_number,
            "field": r.field,
            "value": None if r.value is None else str(r.value)[:REJECTED_VALUE_CHARS],
            "reason": r.reason,
            "record": None if r.record is None else json.dumps(r.record, default=str)[:REJECTED_RECORD_CHARS],
        }
        for r in rejections
    ]


def replace_rejections(
    con: duckdb.DuckDBPyConnection,
    table: str,
    batch_id: str,
    source: str,
    rejections: list[Rejection],
    stamp: pd.Timestamp,
) -> None:
    """Replace the quarantined rows of (`table`, `batch_id`) with `rejections`, stamped `stamp`. Runs inside the
    caller's transaction (it opens none), so the rows it rejects and the rows it loads commit together."""
    con.execute("DELETE FROM quarantine.rejected_rows WHERE table_name = ? AND batch_id = ?", [table, batch_id])
    if not rejections:
        return
    rejected = pd.DataFrame(rejection_rows(table, batch_id, source, rejections))
    rejected["_loaded_at"] = stamp
    rejected["row_number"] = rejected["row_number"].astype("Int64")
    con.register("_rejected_frame", rejected)
    try:
        con.execute("INSERT INTO quarantine.rejected_rows BY NAME SELECT * FROM _rejected_frame")
    finally:
        con.unregister("_rejected_frame")


# A shared catalog (DuckLake) fails a commit that conflicts with a concurrent one, e.g. two first loads creating the
# same table. A batch load is idempotent, so load_batch runs it again: the retry sees the other commit and goes on.
CONFLICT_RETRIES = 5


def _is_conflict(exc: duckdb.Error) -> bool:
    return "conflict" in str(exc).lower()


def load_batch(con: duckdb.DuckDBPyConnection, batch: Batch, loaded_at: pd.Timestamp | None = None) -> LoadResult:
    """Replace the rows of `batch.batch_id` in `batch.table` with `batch.frame`, in one transaction.

    Loading identical content again is a no-op (the table, including `_loaded_at`, stays byte-identical), so
    re-running any ingest for the same interval leaves the warehouse identical. Rejected rows of the batch
    replace that batch's rows in quarantine.rejected_rows. A commit that lost a race with another writer of a
    shared catalog is retried (CONFLICT_RETRIES times, with a short growing pause).
    """
    if "." not in batch.table:
        raise ValueError(f"table name must be schema-qualified, got {batch.table!r}")
    frame = batch.frame.reset_index(drop=True)
    content_hash = _content_hash(frame, batch.rejections)
    stamp = loaded_at if loaded_at is not None else pd.Timestamp.now(tz="UTC")
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            return _load_once(con, batch, frame, content_hash, stamp)
        except duckdb.TransactionException as exc:
            if not _is_conflict(exc) or attempt == CONFLICT_RETRIES:
                raise
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _load_once(
    con: duckdb.DuckDBPyConnection, batch: Batch, frame: pd.DataFrame, content_hash: str, stamp: pd.Timestamp
) -> LoadResult:
    previous = con.execute(
        "SELECT content_hash FROM raw._batches WHERE table_name = ? AND batch_id = ?",
        [batch.table, batch.batch_id],
    ).fetchone()
    if previous and previous[0] == content_hash and table_exists(con, batch.table):
        return LoadResult(batch.table, batch.batch_id, len(frame), len(batch.rejections), True)

    schema = batch.table.split(".", 1)[0]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        con.register("_batch_frame", frame)
        # Batch metadata go in as parameters, not per-row frame columns (much faster to insert).
        select = (
            "SELECT *, ?::VARCHAR AS _source, ?::VARCHAR AS _batch_id, ?::TIMESTAMPTZ AS _loaded_at FROM _batch_frame"
        )
        meta = [batch.source, batch.batch_id, stamp]
        if not table_exists(con, batch.table):
            con.execute(f"CREATE TABLE {batch.table} AS {select} LIMIT 0", meta)
        else:
            existing = [r[0] for r in con.execute(f"DESCRIBE {batch.table}").fetchall()]
            missing = [c for c in frame.columns if c not in existing]
            for column in missing:  # a newer loader added a column: widen, never drop
                dtype = con.execute(f'SELECT typeof("{column}") FROM _batch_frame LIMIT 1').fetchone()
                con.execute(f'ALTER TABLE {batch.table} ADD COLUMN "{column}" {dtype[0] if dtype else "VARCHAR"}')
        con.execute(f"DELETE FROM {batch.table} WHERE _batch_id = ?", [batch.batch_id])
        con.execute(f"INSERT INTO {batch.table} BY NAME {select}", meta)
        con.unregister("_batch_frame")
        replace_rejections(con, batch.table, batch.batch_id, batch.source, batch.rejections, stamp)
        con.execute("DELETE FROM raw._batches WHERE table_name = ? AND batch_id = ?", [batch.table, batch.batch_id])
        con.execute(
            "INSERT INTO raw._batches VALUES (?, ?, ?, ?, ?, ?, ?)",
            [batch.table, batch.batch_id, batch.source, content_hash, len(frame), len(batch.rejections), stamp],
        )
        con.execute("COMMIT")
    except BaseException:
        _rollback(con)
        raise
    return LoadResult(batch.table, batch.batch_id, len(frame), len(batch.rejections), False)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction, if any: a failed COMMIT has already ended it, and a second error from
    ROLLBACK would hide the first."""
    try:
        con.execute("ROLLBACK")
    except duckdb.TransactionException as exc:
        if "no transaction is active" not in str(exc):
            raise


def init_catalog(target: catalog.WarehouseTarget | None = None) -> dict:
    """Create the warehouse once, before parallel writers start: for DuckLake the first ATTACH creates the catalog
    tables in PostgreSQL, then the warehouse's own schemas and bookkeeping tables (DDL, without the
    PRIMARY KEY that DuckLake does not support). Concurrent first writers would race on creating them (the losers
    fail and are retried by Airflow). Idempotent. For the local file: `writer()` does the same."""
    target = catalog.from_env() if target is None else target
    if target.is_local:
        with writer(target.path):
            pass
        return {"mode": target.mode, "database": str(target.path)}
    con = catalog.connect(target)
    try:
        con.execute(SHARED_DDL)
        tables = con.execute(
            "SELECT schema_name || '.' || table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "ORDER BY 1"
        ).fetchall()
    finally:
        con.close()
    return {"mode": target.mode, "database": catalog.describe(target)["database"], "tables": [t[0] for t in tables]}
