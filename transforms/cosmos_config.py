"""Cosmos configuration for dags/transform.py (the DAG file only wires these objects together).

How the transform DAG runs dbt:
- Rendering: LoadMode.DBT_MANIFEST from transforms/target/manifest.json, written at set-up by
  `python -m transforms.runner manifest` (`dbt parse`; no warehouse needed). Parsing the DAG then needs no dbt
  call. If the manifest is missing or older than the project's files (dbt_project.yml, models/, macros/, seeds/,
  tests/), the DAG falls back to LoadMode.DBT_LS (correct but slower: a `dbt ls` per task group, cached by Cosmos)
  and logs a warning saying which command refreshes the manifest.
- Execution: ExecutionMode.LOCAL, InvocationMode.SUBPROCESS, dbt_executable_path = transforms/bin/dbt-locked: the
  venv's dbt run through `python -m transforms.runner exec`, which holds the warehouse's exclusive file lock
  (warehouse.db.warehouse_lock) for the whole dbt command. TestBehavior.BUILD: one `dbt build --select <node>` task
  per model/seed (the node, its data tests and its unit tests) in the intermediate and marts layers; the staging
  layer is one `dbt build` task (SINGLE_TASK_LAYERS, below, says why). Tests are selected `buildable`
  (INDIRECT_SELECTION): each runs in the task of the last of its parents; `test_marts` then runs the tests between
  marts. Every data and unit test of the project runs (tests/dags/test_transform_wiring.py checks it).
- Single writer: every dbt task runs in the one-slot Airflow pool `warehouse` (POOL), shared with every other task
  that writes the warehouse, so transform never fails on the DuckDB lock while another DAG writes. Set-up creates
  the pool: `airflow pools set warehouse 1 "DuckDB single writer"` (Airflow 3 DAG files cannot write the metadata
  database, so the DAG does not create it); the scheduler does not run tasks of a pool that does not exist.
- Profile: transforms/profiles.yml (dbt-duckdb). bin/dbt-locked hands dbt WAREHOUSE_PATH as an absolute path,
  resolved when the task runs by warehouse.config.warehouse_path() (WAREHOUSE_PATH, default
  <repo>/var/warehouse.duckdb).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from cosmos import ExecutionConfig, ProfileConfig, ProjectConfig, RenderConfig
from cosmos.constants import ExecutionMode, InvocationMode, LoadMode, SourceRenderingBehavior, TestBehavior

log = logging.getLogger(__name__)

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent
MANIFEST_PATH = PROJECT_DIR / "target" / "manifest.json"
PROFILES_YML = PROJECT_DIR / "profiles.yml"
SCALE_OUT_PROFILES_YML = REPO_ROOT / "deploy" / "scale-out" / "profiles.yml"
LOCKED_DBT = PROJECT_DIR / "bin" / "dbt-locked"
PROJECT_NAME = "planner"
POOL = "warehouse"
POOL_SLOTS = 1
POOL_DESCRIPTION = "DuckDB single writer"
MANIFEST_COMMAND = "python -m transforms.runner manifest"

# The dbt layers, one task group each, in run order (the seed feeds the intermediate grid models).
LAYERS: dict[str, list[str]] = {
    "staging": ["path:models/staging", "path:seeds"],
    "intermediate": ["path:models/intermediate"],
    "marts": ["path:models/marts"],
}
# Layers built by ONE `dbt build` task (Cosmos DbtBuildLocalOperator) instead of one task per model. Staging is 24
# thin views (renames, casts, tests) plus the seed: each takes under 1 s in dbt, but a task of its own costs ~10 s
# on 2 cores (task process, DAG parse, dbt start-up), so per-model tasks made transform 38 tasks and 6-7 minutes.
# One build task runs exactly the same nodes and tests (dbt orders them); a failure names the node in the log.
# Intermediate and marts stay one Cosmos task per model (per-model retries and status where the work is).
SINGLE_TASK_LAYERS = ("staging",)
# Which data tests a task's `dbt build --select X` runs. dbt's default (eager) takes every test touching X, also one
# whose other parent is built later: on a fresh warehouse that failed (a marts relationships test on a staging
# model, a singular test over intermediate and marts). buildable: a test runs with the last of its parents, when
# its other parents are ancestors of it. A test between two marts neither of which is built from the other (the
# relationships test cluster_nodes -> cluster_capacity) fits no such task: the DAG's test_marts task
# (marts_test_args) runs it once every mart is built.
INDIRECT_SELECTION = ["--indirect-selection", "buildable"]
# The marts published as the `warehouse://marts` Asset (checked non-empty before it is emitted).
MARTS = ("grid_hourly", "job_profiles", "gpu_energy_profiles", "gpu_throughput", "cluster_capacity", "cluster_nodes")

_PROJECT_INPUTS = ("dbt_project.yml", "models", "macros", "seeds", "tests")


def venv_dbt() -> str:
    """The dbt beside this interpreter (the project's virtual environment), else REPO/.venv/bin/dbt."""
    beside = Path(sys.executable).with_name("dbt")
    return str(beside if beside.exists() else REPO_ROOT / ".venv" / "bin" / "dbt")


def _newest_input_mtime() -> float:
    newest = 0.0
    for name in _PROJECT_INPUTS:
        path = PROJECT_DIR / name
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
        elif path.is_dir():
            for root, _dirs, files in os.walk(path):
                for file in files:
                    newest = max(newest, os.stat(os.path.join(root, file)).st_mtime)
    return newest


def manifest_is_fresh(manifest_path: Path | None = None) -> bool:
    """The manifest exists and is newer than every project file (so it describes the current project)."""
    try:
        return (manifest_path or MANIFEST_PATH).stat().st_mtime >= _newest_input_mtime()
    except FileNotFoundError:
        return False


def load_mode() -> LoadMode:
    """DBT_MANIFEST when the set-up manifest is current, else DBT_LS (with a warning)."""
    if manifest_is_fresh():
        return LoadMode.DBT_MANIFEST
    state = "missing" if not MANIFEST_PATH.exists() else "older than the project files"
    log.warning(
        "dbt manifest %s is %s: rendering the transform DAG with `dbt ls` (slow). Run `%s` to refresh it.",
        MANIFEST_PATH,
        state,
        MANIFEST_COMMAND,
    )
    return LoadMode.DBT_LS


def warehouse_env() -> dict[str, str]:
    """Environment for every dbt task: the repo on PYTHONPATH (bin/dbt-locked runs `python -m transforms.runner`).

    WAREHOUSE_PATH is deliberately not resolved here (that would import the warehouse package, pandas and duckdb,
    at every DAG parse): the runner resolves it when the task runs (warehouse.config.warehouse_path(), honouring the
    worker's WAREHOUSE_PATH) and hands dbt the absolute path.
    """
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "False",
    }


def project_config() -> ProjectConfig:
    config = ProjectConfig(
        dbt_project_path=PROJECT_DIR,
        manifest_path=MANIFEST_PATH if MANIFEST_PATH.exists() else None,
        project_name=PROJECT_NAME,
        env_vars=warehouse_env(),
        install_dbt_deps=False,
        partial_parse=True,
    )
    if config.manifest_path is not None:
        # A local file: read it as a plain Path. ProjectConfig wraps it in Airflow's ObjectStoragePath, whose first
        # use loads Airflow's lineage plugins (~0.6 s of DAG parsing) for no benefit here.
        config.manifest_path = MANIFEST_PATH
    return config


def profile_config() -> ProfileConfig:
    """transforms/profiles.yml (the local file), or deploy/scale-out/profiles.yml when WAREHOUSE_CATALOG names a
    shared catalog (target DBT_TARGET, default the catalog's name), as transforms.runner chooses."""
    shared = (os.environ.get("WAREHOUSE_CATALOG") or "").strip().lower()
    if shared not in ("", "duckdb"):
        target = os.environ.get("DBT_TARGET") or shared
        return ProfileConfig(
            profile_name=PROJECT_NAME, target_name=target, profiles_yml_filepath=SCALE_OUT_PROFILES_YML
        )
    return ProfileConfig(profile_name=PROJECT_NAME, target_name="dev", profiles_yml_filepath=PROFILES_YML)


def execution_config() -> ExecutionConfig:
    return ExecutionConfig(
        execution_mode=ExecutionMode.LOCAL,
        invocation_mode=InvocationMode.SUBPROCESS,
        dbt_executable_path=str(LOCKED_DBT),
    )


def render_config(layer: str, mode: LoadMode | None = None) -> RenderConfig:
    return RenderConfig(
        load_method=mode or load_mode(),
        select=LAYERS[layer],
        test_behavior=TestBehavior.BUILD,
        source_rendering_behavior=SourceRenderingBehavior.NONE,
        # the dbt ls fallback runs this venv's dbt as a subprocess (found even when the venv is not on PATH)
        invocation_mode=InvocationMode.SUBPROCESS,
        dbt_executable_path=venv_dbt(),
    )


def layer_build_args(layer: str) -> dict:
    """Arguments of the one DbtBuildLocalOperator of a SINGLE_TASK_LAYERS layer: the layer's selection, run like
    every Cosmos task here (locked dbt executable, warehouse pool, environment)."""
    return {
        "project_dir": str(PROJECT_DIR),
        "profile_config": profile_config(),
        "select": LAYERS[layer],
        "dbt_executable_path": str(LOCKED_DBT),
        "invocation_mode": InvocationMode.SUBPROCESS,
        "env": warehouse_env(),
        **{k: v for k, v in operator_args().items() if k != "emit_datasets"},
    }


def marts_test_args() -> dict:
    """`dbt test` of every data test whose parents are all marts, once all marts are built (cautious selection):
    the tests between marts that no per-model task can run, and the marts' own tests again."""
    return {**layer_build_args("marts"), "dbt_cmd_flags": ["--indirect-selection", "cautious"]}


def operator_args() -> dict:
    """Arguments of every Cosmos dbt task: the one-slot warehouse pool, the inherited environment (plus
    ProjectConfig.env_vars), no dbt deps, no Cosmos datasets (the DAG emits `warehouse://marts` itself)."""
    return {
        "dbt_cmd_flags": INDIRECT_SELECTION,
        "pool": POOL,
        "pool_slots": 1,
        "append_env": True,
        "install_deps": False,
        "emit_datasets": False,
        "retries": 1,
    }
