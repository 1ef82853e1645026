"""Fixtures of the scale-out tests: one throwaway PostgreSQL per module (tests/deploy/pg.py)."""

from __future__ import annotations

import pytest

from tests.deploy.pg import throwaway_postgres


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL cluster in a temporary folder for this module's tests, stopped and removed afterwards."""
    with throwaway_postgres() as server:
        yield server
