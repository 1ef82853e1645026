"""DuckDB warehouse: configuration, single-writer connections, idempotent batch loads, loaders and connectors."""

from warehouse.config import data_dir, var_dir, warehouse_path
from warehouse.db import load_batch, reader, writer

__all__ = ["data_dir", "var_dir", "warehouse_path", "load_batch", "reader", "writer"]
