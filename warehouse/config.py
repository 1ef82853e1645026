"""Paths and settings, all overridable through the environment (see DESIGN.md, Configuration)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    path = Path(os.environ.get("VAR_DIR", REPO_ROOT / "var"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def warehouse_path() -> Path:
    """The DuckDB file: WAREHOUSE_PATH, default var/warehouse.duckdb."""
    raw = os.environ.get("WAREHOUSE_PATH")
    path = Path(raw) if raw else var_dir() / "warehouse.duckdb"
    if not path.is_absolute():
        path = REPO_ROOT / path
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Where file sources live: DATA_DIR, default ../shared/data beside the checkout, else var/cache."""
    raw = os.environ.get("DATA_DIR")
    if raw:
        return Path(raw).expanduser().resolve()
    shared = REPO_ROOT.parent / "shared" / "data"
    if shared.exists():
        return shared.resolve()
    return var_dir() / "cache"
