"""transforms.runner: the dbt wrapper's lock discipline and the manifest for Cosmos."""

from __future__ import annotations

import json

import pytest

from transforms import runner


def test_dbt_waits_for_the_warehouse_lock(tmp_path):
    from warehouse.db import WarehouseLockTimeout, warehouse_lock

    path = tmp_path / "wh.duckdb"
    with warehouse_lock(path, exclusive=False):  # a reader holds the file: dbt may not open it
        with pytest.raises(WarehouseLockTimeout):
            runner.run_dbt(["debug"], warehouse_path=path, lock_timeout_s=0.3)


def test_commands_that_do_not_open_the_warehouse_take_no_lock():
    assert not runner._needs_lock(["parse"]) and not runner._needs_lock(["ls", "--select", "x"])
    assert runner._needs_lock(["build"]) and runner._needs_lock(["source", "freshness"])


def test_dbt_gets_absolute_dirs_and_warehouse(tmp_path):
    args = runner._with_dirs(["build", "--select", "grid_hourly"])
    assert args[args.index("--project-dir") + 1] == str(runner.PROJECT_DIR)
    assert args[args.index("--profiles-dir") + 1] == str(runner.PROJECT_DIR)
    assert runner.resolve_warehouse("var/x.duckdb").is_absolute()
    assert runner.dbt_env(tmp_path / "w.duckdb")["WAREHOUSE_PATH"] == str(tmp_path / "w.duckdb")


def test_manifest_lists_every_layer(fresh_manifest):
    nodes = json.loads(fresh_manifest.read_text())["nodes"]
    models = {n["name"]: n for n in nodes.values() if n["resource_type"] == "model"}
    for mart in ("grid_hourly", "job_profiles", "gpu_energy_profiles", "gpu_throughput", "cluster_capacity"):
        assert models[mart]["schema"] == "marts"
    assert {n["schema"] for n in models.values()} == {"staging", "intermediate", "marts"}
