"""An Airflow backfill of plan_hourly keeps the same ledger as the command-line loop, on the real data.

One warehouse (the grid marts and 60 trace jobs of 2021-07-15, submitted through the intake) is copied twice. On
copy A, `python -m scheduling loop` runs the 48 planning hours from 2021-07-15T00:00Z; on copy B, a real Airflow
(standalone, REST) backfills plan_hourly over the same hours, one run at a time. `@hourly` is a cron trigger
timetable in Airflow 3: a run's data interval is the instant of its hour (logical date = data interval end), and a
run plans at its data interval end, so the backfill's range is the planning hours themselves. Both sides use the
fleet file's executors (replay) and no issued forecasts or registered models (the planner's seasonal naive
forecast), so both see the same inputs.

`build_ledger` then rebuilds the ledger marts on both copies, and the ledger and the loop's tables must hold the
same rows (count and sum of row hashes), leaving out the columns that record the wall clock or the caller.
The Airflow server runs with `use_job_schedule` off, so no scheduled run for the current hour joins the backfill.
Marked slow: about 11 minutes on 2 shared cores, nearly all of it the 48 runs of 4 tasks each (about 11 s a run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tests.e2e.harness import REPO_ROOT, AirflowServer

DAY = "2021-07-15"
FIRST_HOUR = pd.Timestamp(f"{DAY}T00:00Z")
HOURS = 48
N_JOBS = 60
HOURS_PLANNED = [FIRST_HOUR + h * pd.Timedelta(hours=1) for h in range(HOURS)]
# Compared tables -> columns left out: wall-clock audit stamps, and what names the caller (CLI or DAG) or a folder.
LEDGER_TABLES = {"marts.carbon_ledger": (), "marts.carbon_ledger_daily": (), "marts.job_runs": ()}
LOOP_TABLES = {
    "raw.job_events": ("_loaded_at",),
    "queue.jobs": (),
    "queue.job_history": (),
    "executor.replay_runs": (),
    "plan.plans": ("created_from", "schedule_dir"),
    "plan.assignments": (),
    "plan.dispatch_log": ("intent_at", "sent_at"),
}


def _iso(t: pd.Timestamp) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _base_warehouse(root: Path, data_dir: Path) -> Path:
    """The grid marts the planner and the ledger read, and N_JOBS trace jobs of DAY through the intake."""
    from scheduling.queue.intake import submit_file
    from scheduling.queue.trace import write_trace_file
    from scheduling.service import plan_fleet
    from transforms.runner import build
    from warehouse.ingest import ingest

    db = root / "warehouse.duckdb"
    ingest(["grid_ensembleci"], data_dir=data_dir, db_path=db, progress=False)
    build(select="+grid_hourly", warehouse_path=db, target_path=root / "target")
    jobs = write_trace_file(root / "jobs.yaml", DAY, N_JOBS, plan_fleet(None, data_dir), data_dir=data_dir)
    report = submit_file(jobs["path"], db_path=db, data_dir=data_dir)
    assert not report.rejected and report.counts["accepted"] == N_JOBS, report.counts
    return db


def _copy(db: Path, side: Path) -> Path:
    side.mkdir(parents=True)
    shutil.copy2(db, side / db.name)
    return side / db.name


def _side_env(side: Path, db: Path, data_dir: Path) -> dict[str, str]:
    return {
        "WAREHOUSE_PATH": str(db),
        "VAR_DIR": str(side / "var"),
        "SCHEDULES_DIR": str(side / "var" / "schedules"),
        "MODELS_DIR": str(side / "var" / "models"),
        "DATA_DIR": str(data_dir),
        "LIVE_GRID_REGIONS": "",
    }


def _row_hashes(db: Path, tables: dict[str, tuple[str, ...]]) -> dict[str, tuple[int, int]]:
    """Per table: (rows, sum of the hashes of its rows over the compared columns); independent of row order."""
    with duckdb.connect(str(db), read_only=True) as con:
        return {
            table: con.execute(
                f"SELECT count(*), sum(hash(t)::HUGEINT) FROM ({_select(table, _columns(con, table, drop))}) t"
            ).fetchone()
            for table, drop in tables.items()
        }


def _columns(con, table: str, drop: tuple[str, ...]) -> list[str]:
    """The table's columns in the connection's current database, less `drop`."""
    schema, name = table.split(".")
    columns = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
        "AND table_schema = ? AND table_name = ? ORDER BY ordinal_position",
        [schema, name],
    ).fetchall()
    assert columns, f"{table} does not exist"
    return [c for (c,) in columns if c not in drop]


def _select(table: str, columns: list[str], catalog: str = "") -> str:
    quoted = ", ".join(f'"{c}"' for c in columns)
    return f"SELECT {quoted} FROM {catalog + '.' if catalog else ''}{table}"


def _differences(a: Path, b: Path, table: str, drop: tuple[str, ...], limit: int = 5) -> str:
    """A few rows of `table` that only one side has (a: the CLI's, b: Airflow's), for the assertion message."""
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        con.execute("USE a")
        columns = _columns(con, table, drop)
        out = []
        for mine, other, name in (("a", "b", "CLI"), ("b", "a", "Airflow")):
            rows = con.execute(
                f"{_select(table, columns, mine)} EXCEPT ALL {_select(table, columns, other)} LIMIT {limit}"
            ).fetchall()
            out.append(f"only {name}: {rows}")
    return f"{table} ({', '.join(columns)}):\n  " + "\n  ".join(out)


@pytest.mark.slow
def test_a_backfill_of_plan_hourly_keeps_the_ledger_of_the_command_line_loop(tmp_path, data_dir, monkeypatch):
    timings = {}
    t0 = time.monotonic()
    base = _base_warehouse(tmp_path / "base", data_dir)
    cli_db, dag_db = _copy(base, tmp_path / "cli"), _copy(base, tmp_path / "airflow")
    timings["warehouse"] = time.monotonic() - t0

    # The CLI loop runs beside Airflow's start-up and backfill: two processes on two files.
    cli_env = {
        **os.environ,
        **_side_env(tmp_path / "cli", cli_db, data_dir),
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
    }
    cli_cmd = [sys.executable, "-m", "scheduling", "loop", "--from", _iso(FIRST_HOUR), "--hours", str(HOURS)]
    cli_log = open(tmp_path / "cli" / "loop.log", "wb")
    cli = subprocess.Popen(cli_cmd, env=cli_env, stdout=cli_log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)

    server = AirflowServer(
        home=tmp_path / "airflow_home",
        warehouse=dag_db,
        extra_env={
            **_side_env(tmp_path / "airflow", dag_db, data_dir),
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        },
    )
    try:
        t = time.monotonic()
        server.start()
        timings["airflow start"] = time.monotonic() - t
        t = time.monotonic()
        backfill = server.backfill("plan_hourly", _iso(HOURS_PLANNED[0]), _iso(HOURS_PLANNED[-1]))
        runs = server.wait_for_backfill(backfill, timeout_s=2400)
        timings["backfill"] = time.monotonic() - t
        t = time.monotonic()
        assert cli.wait(timeout=900) == 0, (tmp_path / "cli" / "loop.log").read_text()[-4000:]
        timings["cli wait"] = time.monotonic() - t
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli_log.close()
        server.stop()
        timings["total"] = time.monotonic() - t0
        print("backfill e2e timings (s):", json.dumps({k: round(v) for k, v in timings.items()}))
    assert server.leftovers() == []

    assert [r["state"] for r in runs] == ["success"] * HOURS, [(r["dag_run_id"], r["state"]) for r in runs]
    assert [pd.Timestamp(r["data_interval_end"]) for r in runs] == HOURS_PLANNED
    assert all(r["run_type"] == "backfill" for r in runs)

    from scheduling.tasks import build_ledger

    monkeypatch.setenv("VAR_DIR", str(tmp_path / "ledger_var"))
    for db in (cli_db, dag_db):
        build_ledger(db)

    tables = {**LEDGER_TABLES, **LOOP_TABLES}
    cli_rows, dag_rows = _row_hashes(cli_db, tables), _row_hashes(dag_db, tables)
    with duckdb.connect(str(dag_db), read_only=True) as con:
        plan_times = [t for (t,) in con.execute("SELECT plan_time FROM plan.plans ORDER BY plan_time").fetchall()]
        finished = con.execute("SELECT count(*) FROM marts.carbon_ledger WHERE outcome = 'finished'").fetchone()[0]
        callers = con.execute("SELECT DISTINCT created_from FROM plan.plans").fetchall()
    assert [pd.Timestamp(t) for t in plan_times] == HOURS_PLANNED  # each run planned at its data interval end
    assert callers == [("airflow:plan_hourly",)], callers
    assert finished >= 10, finished  # real work: jobs ran and ended inside the 48 hours
    differ = [t for t in tables if cli_rows[t] != dag_rows[t]]
    assert not differ, "\n".join(
        [f"CLI {cli_rows[t]} vs Airflow {dag_rows[t]}" for t in differ]
        + [_differences(cli_db, dag_db, t, tables[t]) for t in differ]
    )
