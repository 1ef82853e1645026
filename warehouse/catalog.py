"""Where the warehouse lives: the local DuckDB file (default) or a shared catalog for the scale-out path.

    WAREHOUSE_CATALOG unset or `duckdb`  the local file WAREHOUSE_PATH (default var/warehouse.duckdb): today's
                                         behaviour, one writing process, guarded by the file lock in warehouse.db.
    WAREHOUSE_CATALOG=ducklake           DuckLake: metadata in PostgreSQL, data files (Parquet) on object storage or
                                         a shared filesystem. Many processes on many machines may write at once.
    WAREHOUSE_CATALOG=motherduck         a MotherDuck database (`md:<database>`), token from MOTHERDUCK_TOKEN.

The settings come from the environment only (deploy/scale-out/warehouse.env lists them; docs/scale-out.md explains
them). Secrets (the catalog password, S3 keys, the MotherDuck token) are read from the environment and never
appear in `repr()`, `describe()`, `redacted_statements()` or the errors raised by `connect()`.

    target = from_env()                     # WarehouseTarget; CatalogConfigError names a missing variable
    connect_statements(target)              # the SQL that attaches the shared catalog (contains secrets)
    describe(target)                        # a JSON-able summary, secrets redacted
    connect(target, read_only=False)        # an open DuckDB connection, catalog attached and in USE

Command line (prints one JSON document):
    python -m warehouse catalog describe              the configured target, redacted
    python -m warehouse catalog statements            the connect statements, redacted
    python -m warehouse catalog install-extensions    provision the DuckDB extensions the target needs (once per
                                                      image), from the pip packages duckdb-extension-* when
                                                      installed (no network), else from DuckDB's repository
    python -m warehouse catalog init                  create the warehouse once before parallel writers start
                                                      (`warehouse.db.init_catalog`)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from warehouse.config import REPO_ROOT

LOCAL = "duckdb"
DUCKLAKE = "ducklake"
MOTHERDUCK = "motherduck"
MODES = (LOCAL, DUCKLAKE, MOTHERDUCK)

ALIAS = "warehouse"  # the name the shared catalog is attached as (and USEd), in Python and in dbt
CATALOG_SECRET = "warehouse_catalog"  # DuckDB secret holding the PostgreSQL catalog password
S3_SECRET = "warehouse_s3"  # DuckDB secret holding the object-storage credentials
REDACTED = "***"

# Every environment variable this module reads (docs/scale-out.md lists them with their meaning).
ENV_VARS = (
    "WAREHOUSE_CATALOG",
    "WAREHOUSE_PATH",
    "VAR_DIR",
    "DUCKLAKE_CATALOG_DSN",
    "DUCKLAKE_CATALOG_PASSWORD",
    "DUCKLAKE_DATA_PATH",
    "DUCKLAKE_S3_PROVIDER",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "S3_ENDPOINT",
    "S3_URL_STYLE",
    "S3_USE_SSL",
    "MOTHERDUCK_DATABASE",
    "MOTHERDUCK_TOKEN",
    "DUCKDB_EXTENSION_DIRECTORY",
)

# pip package (module) that ships each extension's binary, for offline provisioning.
_EXTENSION_PACKAGES = {
    "ducklake": ("duckdb_extension_ducklake", "ducklake"),
    "postgres": ("duckdb_extension_postgres_scanner", "postgres_scanner"),
    "httpfs": ("duckdb_extension_httpfs", "httpfs"),
    "aws": ("duckdb_extension_aws", "aws"),
    "motherduck": ("duckdb_extension_motherduck", "motherduck"),
}
_S3_PROVIDERS = ("config", "credential_chain")
_URL_STYLES = ("vhost", "path")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_MD_DATABASE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# libpq keyword/value `password=...` (quoted or bare) and URI `scheme://user:password@`.
_DSN_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^@\s]+)(@)")


class CatalogConfigError(ValueError):
    """The environment does not describe a usable warehouse target; the message names the variable."""


class CatalogConnectError(RuntimeError):
    """Attaching the shared catalog failed; the message is DuckDB's, with every secret redacted."""


@dataclass(frozen=True)
class S3Settings:
    """Object-storage access for DuckLake data files (a DuckDB `TYPE s3` secret scoped to the data path)."""

    provider: str  # config: keys from the environment; credential_chain: the AWS SDK chain (IAM role, IRSA, ...)
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint: str | None = None
    url_style: str | None = None
    use_ssl: bool | None = None
    scope: str | None = None

    def secrets(self) -> list[str]:
        return [s for s in (self.key_id, self.secret, self.session_token) if s]

    def describe(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "key_id": _mask(self.key_id),
            "secret": REDACTED if self.secret else None,
            "session_token": REDACTED if self.session_token else None,
            "region": self.region,
            "endpoint": self.endpoint,
            "url_style": self.url_style,
            "use_ssl": self.use_ssl,
            "scope": self.scope,
        }


@dataclass(frozen=True, repr=False)
class WarehouseTarget:
    """One warehouse target, parsed from the environment by `from_env()`."""

    mode: str
    path: Path | None = None  # duckdb: the file
    catalog_dsn: str | None = None  # ducklake: libpq connection string of the PostgreSQL catalog database
    catalog_password: str | None = None  # ducklake: kept out of the DSN, passed as a DuckDB secret
    data_path: str | None = None  # ducklake: s3://bucket/prefix/ or an absolute shared path
    s3: S3Settings | None = None  # ducklake with an s3:// data path
    md_database: str | None = None  # motherduck
    md_token: str | None = None  # motherduck
    extension_directory: str | None = None  # DUCKDB_EXTENSION_DIRECTORY (default: DuckDB's ~/.duckdb/extensions)

    @property
    def is_local(self) -> bool:
        """The local file: single writer, file lock. Otherwise a shared catalog that handles concurrency."""
        return self.mode == LOCAL

    @property
    def database(self) -> str:
        """What to pass to duckdb.connect(): the file, an in-memory session that ATTACHes DuckLake, or md:<db>."""
        if self.mode == LOCAL:
            return str(self.path)
        if self.mode == DUCKLAKE:
            return ":memory:"
        return f"md:{self.md_database}"

    @property
    def config(self) -> dict[str, str]:
        """duckdb.connect(config=...): the MotherDuck token, the extension directory. Contains secrets."""
        config: dict[str, str] = {}
        if self.extension_directory:
            config["extension_directory"] = self.extension_directory
        if self.mode == MOTHERDUCK and self.md_token:
            config["motherduck_token"] = self.md_token
        return config

    @property
    def extensions(self) -> list[str]:
        """DuckDB extensions the target needs, in load order."""
        if self.mode == DUCKLAKE:
            names = ["ducklake", "postgres"]
            if self.s3 is not None:
                names.append("httpfs")
                if self.s3.provider == "credential_chain":
                    names.append("aws")
            return names
        if self.mode == MOTHERDUCK:
            return ["motherduck"]
        return []

    def secrets(self) -> list[str]:
        """Every secret value this target holds (for redaction)."""
        values = [self.catalog_password, self.md_token, *(self.s3.secrets() if self.s3 else [])]
        return [v for v in values if v]

    def __repr__(self) -> str:
        return f"WarehouseTarget({json.dumps(describe(self), sort_keys=True)})"

    __str__ = __repr__


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _require(environ: Mapping[str, str], name: str, why: str) -> str:
    value = _env(environ, name)
    if value is None:
        raise CatalogConfigError(f"{name} is not set: {why} (see deploy/scale-out/warehouse.env)")
    return value


def _bool(environ: Mapping[str, str], name: str) -> bool | None:
    value = _env(environ, name)
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise CatalogConfigError(f"{name}={value!r} is not a boolean (true/false)")


def _mask(value: str | None) -> str | None:
    """An access key id shown by its first 4 characters only."""
    if not value:
        return None
    return value[:4] + REDACTED if len(value) > 8 else REDACTED


def _local_path(environ: Mapping[str, str]) -> Path:
    """warehouse.config.warehouse_path() read from `environ`, without creating folders."""
    raw = _env(environ, "WAREHOUSE_PATH")
    path = Path(raw) if raw else Path(_env(environ, "VAR_DIR") or REPO_ROOT / "var") / "warehouse.duckdb"
    return path if path.is_absolute() else REPO_ROOT / path


def _s3_settings(environ: Mapping[str, str], data_path: str) -> S3Settings:
    provider = (_env(environ, "DUCKLAKE_S3_PROVIDER") or "").lower() or None
    if provider is not None and provider not in _S3_PROVIDERS:
        raise CatalogConfigError(f"DUCKLAKE_S3_PROVIDER={provider!r}: choose one of {list(_S3_PROVIDERS)}")
    key_id = _env(environ, "AWS_ACCESS_KEY_ID")
    secret = _env(environ, "AWS_SECRET_ACCESS_KEY")
    if provider is None:
        provider = "config" if (key_id or secret) else None
    if provider is None:
        raise CatalogConfigError(
            f"DUCKLAKE_DATA_PATH is on S3 ({data_path}) but no credentials are configured: set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY, or DUCKLAKE_S3_PROVIDER=credential_chain (IAM role / IRSA / AWS profile)"
        )
    if provider == "config":
        if not key_id:
            raise CatalogConfigError(
                "AWS_ACCESS_KEY_ID is not set: S3 credentials come in pairs with AWS_SECRET_ACCESS_KEY"
            )
        if not secret:
            raise CatalogConfigError(
                "AWS_SECRET_ACCESS_KEY is not set: S3 credentials come in pairs with AWS_ACCESS_KEY_ID"
            )
    else:
        key_id = secret = None
    url_style = _env(environ, "S3_URL_STYLE")
    if url_style is not None and url_style not in _URL_STYLES:
        raise CatalogConfigError(f"S3_URL_STYLE={url_style!r}: choose one of {list(_URL_STYLES)}")
    endpoint = _env(environ, "S3_ENDPOINT")
    if endpoint and "://" in endpoint:
        raise CatalogConfigError(
            f"S3_ENDPOINT={endpoint!r} must be host[:port] without a scheme (use S3_USE_SSL=false for plain http)"
        )
    bucket = data_path.split("/", 3)[2]
    return S3Settings(
        provider=provider,
        key_id=key_id,
        secret=secret,
        session_token=_env(environ, "AWS_SESSION_TOKEN") if provider == "config" else None,
        region=_env(environ, "AWS_REGION") or _env(environ, "AWS_DEFAULT_REGION"),
        endpoint=endpoint,
        url_style=url_style,
        use_ssl=_bool(environ, "S3_USE_SSL"),
        scope=f"s3://{bucket}",
    )


def from_env(environ: Mapping[str, str] | None = None) -> WarehouseTarget:
    """The warehouse target the environment describes (os.environ by default). Raises CatalogConfigError naming
    the variable that is missing or wrong."""
    environ = os.environ if environ is None else environ
    mode = (_env(environ, "WAREHOUSE_CATALOG") or LOCAL).lower()
    extension_directory = _env(environ, "DUCKDB_EXTENSION_DIRECTORY")
    if mode == LOCAL:
        return WarehouseTarget(mode=LOCAL, path=_local_path(environ), extension_directory=extension_directory)
    if mode == DUCKLAKE:
        dsn = _require(
            environ,
            "DUCKLAKE_CATALOG_DSN",
            "WAREHOUSE_CATALOG=ducklake needs the PostgreSQL catalog database as a libpq connection "
            "string, e.g. 'dbname=ducklake_catalog host=pg.internal port=5432 user=ducklake'",
        )
        if dsn.lower().startswith(("ducklake:", "postgres:")) and "://" not in dsn:
            raise CatalogConfigError(
                f"DUCKLAKE_CATALOG_DSN must be the bare libpq connection string, without a "
                f"'{dsn.split(':', 1)[0]}:' prefix"
            )
        data_path = _require(
            environ,
            "DUCKLAKE_DATA_PATH",
            "WAREHOUSE_CATALOG=ducklake needs the data-file location, e.g. s3://bucket/warehouse/ "
            "or an absolute path on a filesystem every worker mounts",
        )
        s3 = None
        if data_path.startswith("s3://"):
            if len(data_path) <= len("s3://") or data_path[len("s3://") :].startswith("/"):
                raise CatalogConfigError(f"DUCKLAKE_DATA_PATH={data_path!r} names no bucket")
            s3 = _s3_settings(environ, data_path)
        elif "://" in data_path:
            raise CatalogConfigError(
                f"DUCKLAKE_DATA_PATH={data_path!r}: only s3:// (AWS S3 or an S3-compatible store via S3_ENDPOINT) "
                "or an absolute shared path is supported"
            )
        elif not data_path.startswith("/"):
            raise CatalogConfigError(
                f"DUCKLAKE_DATA_PATH={data_path!r} must be absolute: every worker has to resolve it to the same place"
            )
        return WarehouseTarget(
            mode=DUCKLAKE,
            catalog_dsn=dsn,
            catalog_password=_env(environ, "DUCKLAKE_CATALOG_PASSWORD"),
            data_path=data_path,
            s3=s3,
            extension_directory=extension_directory,
        )
    if mode == MOTHERDUCK:
        database = _require(
            environ, "MOTHERDUCK_DATABASE", "WAREHOUSE_CATALOG=motherduck needs the MotherDuck database name"
        )
        if database.startswith("md:"):
            database = database[3:]
        if not _MD_DATABASE.match(database):
            raise CatalogConfigError(f"MOTHERDUCK_DATABASE={database!r} is not a plain database name")
        token = _env(environ, "MOTHERDUCK_TOKEN") or _env(environ, "motherduck_token")
        if not token:
            raise CatalogConfigError(
                "MOTHERDUCK_TOKEN is not set: WAREHOUSE_CATALOG=motherduck needs a service token (without one "
                "MotherDuck would wait for an interactive browser log-in)"
            )
        return WarehouseTarget(
            mode=MOTHERDUCK, md_database=database, md_token=token, extension_directory=extension_directory
        )
    raise CatalogConfigError(f"WAREHOUSE_CATALOG={mode!r} is not one of {list(MODES)}")


def _sql(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _s3_secret_statement(s3: S3Settings) -> str:
    parts = ["TYPE s3", f"PROVIDER {s3.provider}"]
    if s3.key_id:
        parts.append(f"KEY_ID {_sql(s3.key_id)}")
    if s3.secret:
        parts.append(f"SECRET {_sql(s3.secret)}")
    if s3.session_token:
        parts.append(f"SESSION_TOKEN {_sql(s3.session_token)}")
    if s3.region:
        parts.append(f"REGION {_sql(s3.region)}")
    if s3.endpoint:
        parts.append(f"ENDPOINT {_sql(s3.endpoint)}")
    if s3.url_style:
        parts.append(f"URL_STYLE {_sql(s3.url_style)}")
    if s3.use_ssl is not None:
        parts.append(f"USE_SSL {'true' if s3.use_ssl else 'false'}")
    if s3.scope:
        parts.append(f"SCOPE {_sql(s3.scope)}")
    return f"CREATE OR REPLACE SECRET {S3_SECRET} ({', '.join(parts)})"


def connect_statements(target: WarehouseTarget, read_only: bool = False) -> list[str]:
    """The statements that make a fresh connection to `target.database` (with `target.config`) point at the
    warehouse. Empty for the local file and MotherDuck (the connection string does it); for DuckLake: load the
    extensions, create the (temporary, in-memory) secrets, ATTACH the lake as `warehouse` and USE it.

    `INSTALL x` is a no-op when the extension is already installed (provision images with
    `python -m warehouse catalog install-extensions`; DuckDB would otherwise download it). The statements contain
    secrets: log `redacted_statements()` instead."""
    if target.mode != DUCKLAKE:
        return []
    statements: list[str] = []
    for name in target.extensions:
        statements += [f"INSTALL {name}", f"LOAD {name}"]
    if target.s3 is not None:
        statements.append(_s3_secret_statement(target.s3))
    options = [f"DATA_PATH {_sql(str(target.data_path))}"]
    if target.catalog_password:
        statements.append(
            f"CREATE OR REPLACE SECRET {CATALOG_SECRET} (TYPE postgres, PASSWORD {_sql(target.catalog_password)})"
        )
        options.append(f"META_SECRET {_sql(CATALOG_SECRET)}")
    if read_only:
        options.append("READ_ONLY")
    statements.append(
        f"ATTACH {_sql('ducklake:postgres:' + str(target.catalog_dsn))} AS {ALIAS} ({', '.join(options)})"
    )
    statements.append(f"USE {ALIAS}")
    return statements


def redact(text: str, target: WarehouseTarget | None = None) -> str:
    """`text` with every secret of `target` and any DSN/URI password replaced by ***."""
    out = str(text)
    for secret in sorted(target.secrets() if target else [], key=len, reverse=True):
        for form in {secret, secret.replace("'", "''")}:
            out = out.replace(form, REDACTED)
    out = _DSN_PASSWORD.sub(lambda m: m.group(1) + REDACTED, out)
    out = _URI_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), out)
    return out


def redacted_statements(target: WarehouseTarget, read_only: bool = False) -> list[str]:
    """connect_statements() safe to print or log."""
    return [redact(s, target) for s in connect_statements(target, read_only=read_only)]


def describe(target: WarehouseTarget) -> dict[str, Any]:
    """A JSON-able summary of the target; secrets redacted."""
    out: dict[str, Any] = {"mode": target.mode}
    if target.mode == LOCAL:
        out.update(database=str(target.path), concurrency="single writer: file lock + one-slot `warehouse` pool")
    elif target.mode == DUCKLAKE:
        out.update(
            database=f"ducklake:postgres:{redact(str(target.catalog_dsn), target)}",
            alias=ALIAS,
            catalog_dsn=redact(str(target.catalog_dsn), target),
            catalog_password=REDACTED if target.catalog_password else None,
            data_path=target.data_path,
            s3=target.s3.describe() if target.s3 else None,
            extensions=target.extensions,
            concurrency="many writers: DuckLake commits through the PostgreSQL catalog (optimistic, with retries)",
        )
    else:
        out.update(
            database=target.database,
            motherduck_token=REDACTED,
            extensions=target.extensions,
            concurrency="many clients: MotherDuck serves the database (conflicting transactions fail)",
        )
    if target.extension_directory:
        out["extension_directory"] = target.extension_directory
    return out


def connect(target: WarehouseTarget | None = None, read_only: bool = False):
    """An open DuckDB connection to `target` (default: from_env()), the shared catalog attached and in USE.
    For the local file this is a plain duckdb.connect (the caller takes the file lock: warehouse.db does).
    Errors from DuckDB come back as CatalogConnectError with secrets redacted (DuckDB echoes DSNs)."""
    target = from_env() if target is None else target
    if target.is_local:
        return duckdb.connect(str(target.path), read_only=read_only, config=target.config)
    con = None
    statement = "connect"
    try:
        con = duckdb.connect(target.database, config=target.config)
        con.execute("SET enable_progress_bar = false")
        for statement in connect_statements(target, read_only=read_only):
            con.execute(statement)
        return con
    except duckdb.Error as exc:
        if con is not None:
            con.close()
        message = redact(f"{type(exc).__name__}: {exc}", target)
        raise CatalogConnectError(
            f"could not open the {target.mode} warehouse at {describe(target)['database']} "
            f"(statement: {redact(statement, target)}): {message}"
        ) from None


def install_extensions(target: WarehouseTarget | None = None) -> list[dict[str, str]]:
    """Install the extensions `target` needs into the extension directory (once per machine or image). Uses the
    binary of a pip-installed duckdb-extension-<name> package when there is one (offline), else DuckDB's
    repository (needs network). Returns what was done per extension."""
    target = from_env() if target is None else target
    done = []
    con = duckdb.connect(config={k: v for k, v in target.config.items() if k == "extension_directory"})
    try:
        for name in target.extensions:
            module, file_stem = _EXTENSION_PACKAGES[name]
            spec = importlib.util.find_spec(module)
            binary = None
            if spec is not None and spec.submodule_search_locations:
                root = Path(list(spec.submodule_search_locations)[0]) / "extensions" / f"v{duckdb.__version__}"
                candidate = root / f"{file_stem}.duckdb_extension"
                binary = candidate if candidate.exists() else None
            if binary is not None:
                con.execute(f"INSTALL {_sql(str(binary))}")
                done.append({"extension": name, "from": str(binary)})
            else:
                con.execute(f"INSTALL {name}")
                done.append({"extension": name, "from": "repository"})
            if name != "motherduck":  # loading motherduck contacts the MotherDuck service: first connect does it
                con.execute(f"LOAD {name}")
    finally:
        con.close()
    return done
