"""Params shared by the hand-triggered DAGs: one definition of a planning/issue time, the region lists and the
policies, so that every DAG rejects the same bad values with the same message at trigger time.

Kept free of numpy/pandas imports: DAG files must parse fast (tests/dags/test_dagbag.py)."""

from __future__ import annotations

from airflow.sdk import Param

from scheduling.domain.fleet_file import DEFAULT_FLEET_PATH, fleet_gpu_models, fleet_regions
from scheduling.planning.policies.registry import DEFAULT_POLICY, POLICY_NAMES  # noqa: F401 - DAG files import both from here

# Empty, or an ISO date/time (the DAG's first task parses it; the pattern only lets Airflow reject free text).
ISO_TIME_PATTERN = r"^$|^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?)?(Z|[+-]\d{2}(:?\d{2})?)?$"
# Grid zones in the warehouse (the forecasters' regions).
GRID_REGIONS = ["CISO", "ERCO", "PJM", "ISNE", "MISO", "DE", "ES", "NL", "PL", "SE", "GB"]
# Regions of the fleet the hourly plan uses (the file FLEET_PATH names, default scheduling/domain/fleet.yaml), and of
# the reference fleet the simulator (evaluate DAG) samples and re-sizes. Read with yaml only: no numpy/pandas here.
FLEET_REGIONS = fleet_regions()
SIMULATOR_REGIONS = fleet_regions(DEFAULT_FLEET_PATH)
# GPU models that some cluster of the hourly plan's fleet has (what a job's gpu_models may name).
FLEET_GPU_MODELS = fleet_gpu_models()
# The planner's policies come from its registry, which imports no numpy/pandas (DAG files must parse fast).
POLICIES = POLICY_NAMES


def time_param(description: str) -> Param:
    return Param("", type="string", pattern=ISO_TIME_PATTERN, description=description)


def regions_param(regions: list[str], description: str = "Regions; empty = the default six.") -> Param:
    return Param([], type="array", items={"type": "string", "enum": regions}, description=description)


def targets_param(description: str) -> Param:
    return Param(
        ["carbon_intensity"],
        type="array",
        items={"type": "string", "enum": ["carbon_intensity", "solar", "wind"]},
        description=description,
    )
