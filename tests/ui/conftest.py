"""Fixtures of the Carbon page tests: a warehouse on which the operating loop ran and the ledger was built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import operate_day

DAY = "2021-07-15"


@pytest.fixture(scope="session")
def looped_warehouse(tmp_path_factory, data_dir) -> Path:
    """30 trace jobs of DAY, 12 hours of the loop from its midnight (replay executor), the ledger marts built."""
    from scheduling.output.ledger import LEDGER_SELECT
    from transforms.runner import build

    root = tmp_path_factory.mktemp("carbon_pages")
    db = operate_day(root, data_dir, DAY, 30, 12)
    build(select=list(LEDGER_SELECT), warehouse_path=db, target_path=root / "ledger-target")
    return db
