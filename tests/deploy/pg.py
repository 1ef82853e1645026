"""Throwaway servers for the scale-out tests: a PostgreSQL cluster and a Redis server, each in a temporary folder on a
free localhost port, stopped exactly (the server started, by its data folder or process) and removed afterwards.

The Debian packages come from deploy/install-services.sh (run by `make test` / `make test-all`, and here when root
and missing). Without them a test skips with the reason, except in CI (CI=true), where it fails: CI must run them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SERVICES = REPO_ROOT / "deploy" / "install-services.sh"
PASSWORD = "pg-test-pw"
LAKE_PASSWORD = "lake pw's"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def skip_unless_ci(reason: str) -> None:
    """Skip with `reason`, except in CI (CI=true), where set-up installs what these tests need: there it fails."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI must run this test: see deploy/install-services.sh)")
    pytest.skip(reason)


def _install(package: str) -> None:
    """As root, the Debian package from deploy/install-services.sh (a no-op when it is there)."""
    if os.geteuid() == 0:
        subprocess.run(["bash", str(INSTALL_SERVICES), package], timeout=600, check=False)


def pg_bin() -> Path | None:
    """The folder of the PostgreSQL server binaries (initdb, pg_ctl, postgres, psql), if installed."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for directory in candidates:
        if all((directory / tool).exists() for tool in ("initdb", "pg_ctl", "postgres", "psql")):
            return directory
    return None


def _server_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """How to run the server: as root through `runuser -u postgres` (initdb refuses root), else as ourselves."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    user = next((u for u in ("postgres", "nobody") if _user_exists(u)), None)
    if runuser is None or user is None:
        skip_unless_ci("running as root without runuser or an unprivileged user for PostgreSQL")
    return [runuser, "-u", user, "--"], pwd.getpwnam(user)


def psql(server: dict, sql: str, database: str = "postgres") -> None:
    """Run `sql` as the superuser `airflow` over TCP with its password."""
    subprocess.run(
        [str(server["bin"] / "psql"), "-h", "127.0.0.1", "-p", str(server["port"]), "-U", "airflow", "-d", database]
        + ["-v", "ON_ERROR_STOP=1", "-qc", sql],
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PGPASSWORD": server["password"]},
    )


def create_database(server: dict, name: str, owner: str = "ducklake") -> None:
    psql(server, f"CREATE DATABASE {name} OWNER {owner}")


def lake_on(server: dict, name: str, data_path, extension_directory) -> dict[str, str]:
    """A new DuckLake warehouse: its catalog the database `name` of `server` (created here), its data files under
    `data_path`; returns the environment that selects it (WAREHOUSE_CATALOG=ducklake and the rest)."""
    create_database(server, name)
    return {
        "WAREHOUSE_CATALOG": "ducklake",
        "DUCKLAKE_CATALOG_DSN": f"dbname={name} host=127.0.0.1 port={server['port']} user=ducklake",
        "DUCKLAKE_CATALOG_PASSWORD": server["lake_password"],
        "DUCKLAKE_DATA_PATH": f"{data_path}/",
        "DUCKDB_EXTENSION_DIRECTORY": str(extension_directory),
    }


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[dict]:
    """A PostgreSQL cluster in a temporary folder: superuser `airflow` (password PASSWORD, scram over TCP on a free
    127.0.0.1 port; the unix socket in the folder), databases `airflow` and `ducklake_catalog` (owner `ducklake`,
    password LAKE_PASSWORD). Durability is off (fsync, synchronous_commit): it only lives for the tests."""
    if pg_bin() is None:
        _install("postgresql")
    bindir = pg_bin()
    if bindir is None:
        skip_unless_ci("no PostgreSQL server binaries (initdb, pg_ctl, postgres, psql) and not root to install them")
    prefix, owner = _server_user()
    root = Path(tempfile.mkdtemp(prefix="scale-out-pg-"))
    (root / "pw").write_text(PASSWORD + "\n")
    if owner is not None:
        for path in (root, root / "pw"):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    port, data, started = free_port(), root / "data", False
    try:
        subprocess.run(
            [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "airflow", f"--pwfile={root / 'pw'}"]
            + ["--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        options = (
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60"]
            + ["-o", options, "start"],
            check=True,
            capture_output=True,
            timeout=90,
        )
        started = True
        server = {"port": port, "password": PASSWORD, "lake_password": LAKE_PASSWORD, "root": root, "bin": bindir}
        psql(server, "CREATE DATABASE airflow")
        psql(server, "CREATE ROLE ducklake LOGIN PASSWORD 'lake pw''s'")
        create_database(server, "ducklake_catalog")
        yield server
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_redis() -> Iterator[dict]:
    """A Redis server (the Celery broker) on a free 127.0.0.1 port, no persistence, its folder temporary; stopped by
    its process."""
    if shutil.which("redis-server") is None:
        _install("redis-server")
    binary = shutil.which("redis-server")
    if binary is None:
        skip_unless_ci("no redis-server on this machine and not root to install it")
    root = Path(tempfile.mkdtemp(prefix="scale-out-redis-"))
    port = free_port()
    log = open(root / "log", "wb")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root), "--save", "", "--appendonly", "no"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(root / 'log').read_text(errors='replace')}")
            time.sleep(0.2)
        yield {"port": port, "url": f"redis://127.0.0.1:{port}/0"}
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
