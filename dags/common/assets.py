"""Airflow Assets that connect the DAGs: ingest → transform → forecast/plan."""
from airflow.sdk import Asset

RAW_CLUSTER = Asset("warehouse://raw/cluster")
RAW_ENERGY = Asset("warehouse://raw/energy")
RAW_INTERFERENCE = Asset("warehouse://raw/interference")
RAW_GRID = Asset("warehouse://raw/grid")
RAW_ASSETS = (RAW_CLUSTER, RAW_ENERGY, RAW_INTERFERENCE, RAW_GRID)
MARTS = Asset("warehouse://marts")
