"""End to end against a running Airflow (standalone, temp home, free localhost port), driven by the REST API, on the
real data: ingest (three DAGs) → transform (started by an ingest's Asset event) → forecast_predict (tiny models) →
submit_jobs (the example job file) → plan_hourly for an `as_of` in 2021 and the hour after; then the plan rows and
the schedule files must exist and agree, the jobs that start at once are dispatched to the replay executor, and the
next hour loads its events (the jobs run).

Reliability checks on the way:
- two DAGs writing the warehouse at the same time (ingest_cluster, ingest_energy) both succeed;
- clearing a finished run (ingest_energy, then plan_hourly) runs it again and leaves the warehouse identical, table
  by table (row count and an order-independent hash of the rows), and the schedule files byte-identical;
- the server runs with TIME_SCHEDULES=off, so every run is one the test started (none for the wall-clock hour);
- afterwards no process the server started is left.
A failing run's assertion message carries the failed tasks' logs.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import duckdb

from tests.e2e.harness import AirflowServer
from warehouse.db import writer

AS_OF = "2021-07-15T12:00:00Z"
NEXT_HOUR = "2021-07-15T13:00:00Z"
JOBS_FILE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "jobs.yaml"


def _ok(server: AirflowServer, dag_id: str, run_id: str, timeout_s: float = 600, not_ended_at: str | None = None):
    state = server.wait_for_run(dag_id, run_id, timeout_s=timeout_s, not_ended_at=not_ended_at)
    assert state == "success", f"{dag_id} {run_id} {state}:\n{server.failed_task_logs(dag_id, run_id)}"


def _run(server: AirflowServer, dag_id: str, conf: dict) -> str:
    run_id = server.trigger(dag_id, conf)
    _ok(server, dag_id, run_id)
    return run_id


def _rerun_and_compare(server: AirflowServer, dag_id: str, run_id: str, warehouse: Path, files: Path | None = None):
    """Clear the finished run, wait until it has succeeded again, and check nothing changed."""
    before = _warehouse_hashes(warehouse), _file_hashes(files)
    ended = server.clear(dag_id, run_id)
    _ok(server, dag_id, run_id, not_ended_at=ended)
    after = _warehouse_hashes(warehouse), _file_hashes(files)
    changed = sorted(t for t in set(before[0]) | set(after[0]) if before[0].get(t) != after[0].get(t))
    assert not changed, f"re-running {dag_id} changed {changed}"
    assert before[1] == after[1], f"re-running {dag_id} changed schedule files"


def _warehouse_hashes(path: Path) -> dict[str, tuple[int, int]]:
    """Per base table: (rows, sum of row hashes). The sum does not depend on row order, and unlike XOR it does not
    cancel duplicate rows."""
    from warehouse.db import reader

    with reader(path) as con:  # shared lock: waits for any writer
        tables = con.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall()
        return {
            f"{schema}.{name}": tuple(
                con.execute(f'SELECT count(*), sum(hash(t)::HUGEINT) FROM "{schema}"."{name}" t').fetchone()
            )
            for schema, name in tables
        }


def _file_hashes(root: Path | None) -> dict[str, str]:
    if root is None:
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _wait_running(server: AirflowServer, runs: dict[str, str], timeout_s: float = 300) -> None:
    """Poll until every run {dag_id: run_id} is running (their tasks wait for the warehouse meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {dag_id: server.run_info(dag_id, run_id).get("state") for dag_id, run_id in runs.items()}
        if all(state == "running" for state in states.values()):
            return
        assert not {"success", "failed"} & set(states.values()), f"a run ended while the warehouse was held: {states}"
        assert time.monotonic() < deadline, f"runs not all running after {timeout_s} s: {states}"
        time.sleep(1)


def _asset_triggered_run(server: AirflowServer, dag_id: str, timeout_s: float = 180) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = server.runs(dag_id)
        if runs:
            assert [r["run_type"] for r in runs] == ["asset_triggered"], runs
            return runs[0]["dag_run_id"]
        time.sleep(2)
    raise AssertionError(f"no {dag_id} run started from the Asset event in {timeout_s} s")


def test_ingest_transform_forecast_plan_through_rest_api(tmp_path, data_dir):
    var = tmp_path / "var"
    warehouse = var / "warehouse.duckdb"
    server = AirflowServer(
        home=tmp_path / "airflow",
        warehouse=warehouse,
        extra_env={
            "VAR_DIR": str(var),
            "SCHEDULES_DIR": str(var / "schedules"),
            "MODELS_DIR": str(var / "models"),
            "DATA_DIR": str(data_dir),
            "AIRFLOW__CORE__PARALLELISM": "2",
            "LIVE_GRID_REGIONS": "",
            # Every run is one the test triggers, for a time inside the data: a wall-clock hour passing adds none.
            "TIME_SCHEDULES": "off",
        },  # no live feeds: no network, and fetch_live skips
    ).start()
    timings = {}
    t0 = time.monotonic()
    try:
        # Two DAGs writing the warehouse at the same time: both must succeed (one-slot pool + file lock). The test
        # holds the warehouse's writer lock until both runs have started, so they overlap however slow the host.
        # transform stays paused meanwhile: Airflow 3 queues Asset events only for unpaused DAGs (so these two
        # events start nothing, by design); it runs once, from ingest_grid's event below.
        with writer(warehouse):
            both = {dag_id: server.trigger(dag_id) for dag_id in ("ingest_cluster", "ingest_energy")}
            _wait_running(server, both)
        for dag_id, run_id in both.items():
            _ok(server, dag_id, run_id)
        spans = [server.run_info(d, r) for d, r in both.items()]
        assert max(s["start_date"] for s in spans) < min(s["end_date"] for s in spans), spans  # really concurrent
        timings["ingest_cluster+energy"] = time.monotonic() - t0

        t = time.monotonic()
        _rerun_and_compare(server, "ingest_energy", both["ingest_energy"], warehouse)
        timings["rerun ingest_energy"] = time.monotonic() - t

        t = time.monotonic()
        server.wait_for_dag("transform")
        server.pause("transform", False)
        # publish_assets emits warehouse://raw/grid once (load_files loaded; fetch_live, no live region enabled,
        # skipped), which starts transform.
        _run(server, "ingest_grid", {})
        timings["ingest_grid"] = time.monotonic() - t

        t = time.monotonic()
        _ok(server, "transform", _asset_triggered_run(server, "transform"), timeout_s=900)
        timings["transform"] = time.monotonic() - t

        t = time.monotonic()
        _run(
            server,
            "forecast_predict",
            {"as_of": AS_OF, "tiny": True, "regions": ["CISO", "DE", "ERCO"], "models": ["lgbm"], "horizon": 96},
        )
        timings["forecast_predict"] = time.monotonic() - t
        t = time.monotonic()
        _run(server, "submit_jobs", {"file": str(JOBS_FILE), "as_of": AS_OF})
        timings["submit_jobs"] = time.monotonic() - t
        t = time.monotonic()
        plan_run = _run(server, "plan_hourly", {"as_of": AS_OF, "regions": [], "dry_run": False})
        timings["plan_hourly"] = time.monotonic() - t

        t = time.monotonic()
        _rerun_and_compare(server, "plan_hourly", plan_run, warehouse, var / "schedules")
        timings["rerun plan_hourly"] = time.monotonic() - t
        t = time.monotonic()
        _run(server, "plan_hourly", {"as_of": NEXT_HOUR, "regions": [], "dry_run": False})
        timings["plan_hourly next hour"] = time.monotonic() - t
        # Exactly one transform run: no other Asset event (a skipped task, a re-run while paused) started one.
        assert len(server.runs("transform")) == 1, server.runs("transform")
        # ...and no run the test did not start: no time schedule fired.
        kinds = {d: sorted({r["run_type"] for r in server.runs(d)}) for d in server.dag_ids()}
        assert all(set(k) <= {"manual", "asset_triggered"} for k in kinds.values()), kinds
    finally:
        server.stop()
        timings["total"] = time.monotonic() - t0
        print("e2e timings (s):", json.dumps({k: round(v) for k, v in timings.items()}))
    assert server.leftovers() == []

    with duckdb.connect(str(warehouse), read_only=True) as con:
        forecasts = con.execute(
            "SELECT count(*) FROM forecast.forecasts WHERE issued_at = ?::TIMESTAMPTZ", [AS_OF]
        ).fetchone()[0]
        plan = con.execute(
            "SELECT plan_id, n_assigned, schedule_dir FROM plan.plans WHERE plan_time = ?::TIMESTAMPTZ", [AS_OF]
        ).fetchall()
        assert forecasts > 0
        assert len(plan) == 1, plan
        plan_id, n_assigned, schedule_dir = plan[0]
        rows = con.execute(
            "SELECT job_id, cluster FROM plan.assignments WHERE plan_id = ? ORDER BY job_id", [plan_id]
        ).fetchall()
        dispatched = con.execute(
            "SELECT job_id FROM plan.assignments WHERE plan_id = ? AND status = 'dispatched'", [plan_id]
        ).fetchall()
        states = dict(con.execute("SELECT state, count(*) FROM queue.jobs GROUP BY state").fetchall())
        started = con.execute(
            "SELECT count(DISTINCT job_id) FROM raw.job_events WHERE event = 'started' AND event_time = ?::TIMESTAMPTZ",
            [AS_OF],
        ).fetchone()[0]
    assert n_assigned == len(rows) > 0
    # The files agree with the rows: every assignment is in its cluster's JSON, and nothing else is.
    in_files = []
    for path in sorted((Path(schedule_dir) / "clusters").glob("*.json")):
        doc = json.loads(path.read_text())
        in_files += [(a["job_id"], doc["cluster"]) for a in doc["assignments"]]
    assert sorted(in_files) == sorted(rows)
    # The jobs that start at AS_OF went to the replay executor, which reports them started in the next hour's sync.
    assert dispatched, "no job starts at the planning hour"
    assert started == len(dispatched), (started, dispatched)
    assert sum(states.values()) == 10 and states.get("running", 0) + states.get("finished", 0) >= len(dispatched)
