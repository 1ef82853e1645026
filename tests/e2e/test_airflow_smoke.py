"""A real Airflow (standalone) in a temp home runs ingest_cluster triggered through the REST API; a run that fails
shows the failed task's log; nothing the server started is left running afterwards."""

from __future__ import annotations

from tests.e2e.harness import AirflowServer


def test_standalone_runs_ingest_through_rest_api(tmp_path):
    server = AirflowServer(home=tmp_path / "airflow", warehouse=tmp_path / "wh.duckdb").start()
    try:
        good = server.trigger("ingest_cluster", {"sources": ["openb_nodes", "pai_machine_specs"]})
        bad = server.trigger("ingest_cluster", {"data_dir": str(tmp_path / "no_such_dir")})
        assert server.wait_for_run("ingest_cluster", good) == "success", server.failed_task_logs("ingest_cluster", good)
        assert server.wait_for_run("ingest_cluster", bad) == "failed"
        # What a failing e2e run prints: the failed task's own log, naming the bad value.
        logs = server.failed_task_logs("ingest_cluster", bad)
        assert "failed task validate_params" in logs and "no_such_dir" in logs, logs
    finally:
        server.stop()
    assert server.leftovers() == []
