"""A real Airflow (standalone) in a temp home runs ingest_cluster triggered through the REST API."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.harness import AirflowServer


def test_standalone_runs_ingest_through_rest_api(tmp_path):
    server = AirflowServer(home=tmp_path / "airflow", warehouse=tmp_path / "wh.duckdb").start()
    try:
        run_id = server.trigger("ingest_cluster", {"sources": ["openb_nodes", "pai_machine_specs"]})
        state = server.wait_for_run("ingest_cluster", run_id)
        assert state == "success", server.failed_task_logs("ingest_cluster", run_id)
    finally:
        pgid = os.getpgid(server.process.pid)
        server.stop()
    leftover = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    assert [line for line in leftover.splitlines() if line.split()[1][0] != "Z"] == []
