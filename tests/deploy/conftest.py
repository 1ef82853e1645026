"""Fixtures of the scale-out tests: one throwaway PostgreSQL per module (tests/deploy/pg.py), and the DuckLake
extensions installed from their pip packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.deploy.pg import skip_unless_ci, throwaway_postgres
from warehouse import catalog


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL cluster in a temporary folder for this module's tests, stopped and removed afterwards."""
    with throwaway_postgres() as server:
        yield server


_EXTENSION_PACKAGES = ("duckdb_extension_ducklake", "duckdb_extension_postgres_scanner")


@pytest.fixture(scope="module")
def extension_directory(tmp_path_factory) -> Path:
    """The ducklake/postgres(/httpfs) DuckDB extensions in a private directory, from the pip packages
    (requirements-scale-out.txt); skip when they are not installed (downloading them needs the network)."""
    if not all(importlib.util.find_spec(m) for m in _EXTENSION_PACKAGES):
        skip_unless_ci("DuckDB extension packages duckdb-extension-ducklake/-postgres-scanner not installed")
    directory = tmp_path_factory.mktemp("duckdb_extensions")
    target = catalog.from_env(_lake_env(DUCKDB_EXTENSION_DIRECTORY=str(directory)))
    done = catalog.install_extensions(target)
    assert all(d["from"] != "repository" for d in done), done
    if importlib.util.find_spec("duckdb_extension_httpfs"):  # for the dbt profile, which loads httpfs
        s3 = catalog.from_env(
            _lake_env(
                DUCKDB_EXTENSION_DIRECTORY=str(directory),
                DUCKLAKE_DATA_PATH="s3://b/l/",
                AWS_ACCESS_KEY_ID="AKIA0000",
                AWS_SECRET_ACCESS_KEY="x",
            )
        )
        catalog.install_extensions(s3)
    return directory


def _lake_env(**extra: str) -> dict[str, str]:
    """A DuckLake target's environment whose catalog and data path are never reached (extension provisioning)."""
    dsn = "dbname=ducklake_catalog host=127.0.0.1 user=ducklake"
    return {"WAREHOUSE_CATALOG": "ducklake", "DUCKLAKE_CATALOG_DSN": dsn, "DUCKLAKE_DATA_PATH": "/srv/lake/", **extra}
