"""Benchmark of `/carbon/metrics`, printed as one JSON document:

* **latency while a loop hour writes**: on a copy of the warehouse, `--submit` trace jobs of the day before the next
  planning hour are queued, then `python -m scheduling loop` plans the next hour(s) in another process while this
  one scrapes the app (in process, a snapshot at most `--max-age` s old) as fast as it answers; per scrape the
  seconds, and how many answers found the writer busy.
* **cardinality**: another copy gets `--jobs` synthetic jobs in `queue.jobs` and `marts.carbon_ledger` (the existing
  rows repeated under new ids, tenants and clusters as they are), and the scrape's series are counted.

    python -m ui.metrics_bench --db var/warehouse.duckdb [--jobs 100000] [--hours 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pandas as pd
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scheduling.evaluation.results import environment
from scheduling.queue.intake import submit_mappings
from scheduling.queue.trace import trace_jobs
from scheduling.service import plan_fleet
from ui.app import create_app
from ui.metrics import MetricsCache, PlannerCollector
from warehouse.config import warehouse_path
from warehouse.db import reader, writer

TARGETS = {"scrape_s": 0.2, "series": 2000}
ROOT = Path(__file__).resolve().parents[1]


def _no_auth() -> None:
    """/metrics does not use the pages' authentication."""


def _series(text: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def _next_hour(db: Path) -> str:
    with reader(db) as con:
        last = PlannerCollector(con).last_plan_time()
    if last is None:
        raise ValueError(f"{db}: no plan yet; run `make run` first")
    return (last + pd.Timedelta(hours=1)).strftime("%Y-%m-%dT%H:%MZ")


def queue_trace_jobs(db: Path, hour: str, n: int) -> int:
    """Queue `n` trace jobs arriving on the day before `hour` (all waiting at it); returns those accepted."""
    if n <= 0:
        return 0
    T = pd.Timestamp(hour)
    jobs = trace_jobs(T.floor("D") - pd.Timedelta(days=1), n, plan_fleet(None))
    report = submit_mappings(jobs, source="metrics-bench", as_of=T, db_path=db)
    return int(report.counts.get("accepted", 0))


def scrape_while_writing(db: Path, hours: int, max_age_s: float, submit: int) -> dict:
    """Scrape the app while `python -m scheduling loop` plans `hours` hours on `db` (after queuing `submit` jobs)."""
    start = _next_hour(db)
    queued = queue_trace_jobs(db, start, submit)
    cache = MetricsCache(db, max_age_s=max_age_s)
    app = create_app(_no_auth, db_path=db, metrics_cache=cache)
    client = TestClient(app, root_path="/carbon")
    t0 = time.perf_counter()
    first = client.get("/metrics")
    cold = time.perf_counter() - t0
    if first.status_code != 200:
        raise RuntimeError(f"/metrics: HTTP {first.status_code}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WAREHOUSE_PATH": str(db)}
    loop = subprocess.Popen(
        [sys.executable, "-m", "scheduling", "loop", "--from", start, "--hours", str(hours), "--db", str(db)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    times, busy, refreshed = [], 0, set()
    t_loop = time.perf_counter()
    while loop.poll() is None:
        asked = time.perf_counter()
        reply = client.get("/metrics")
        times.append(time.perf_counter() - asked)
        text = reply.text
        busy += "carbon_planner_metrics_warehouse_busy 1.0" in text
        refreshed.add(text.split("carbon_planner_metrics_snapshot_timestamp_seconds ")[-1].split("\n")[0])
        time.sleep(0.05)
    loop_s = time.perf_counter() - t_loop
    stderr = loop.stderr.read()
    while cache.refreshing:  # let the last refresh end before the copy goes
        time.sleep(0.05)
    if loop.returncode != 0:
        raise RuntimeError(f"the loop hour failed: {stderr[-2000:]}")
    times.sort()
    return {
        "loop_hours": hours,
        "from": start,
        "jobs_queued_before": queued,
        "loop_s": round(loop_s, 1),
        "scrapes": len(times),
        "cold_s": round(cold, 4),
        "median_s": round(statistics.median(times), 4) if times else None,
        "p95_s": round(times[int(0.95 * (len(times) - 1))], 4) if times else None,
        "max_s": round(max(times), 4) if times else None,
        "answers_marked_busy": busy,
        "snapshots_served": len(refreshed),
        "max_age_s": max_age_s,
    }


def with_many_jobs(db: Path, n: int) -> dict:
    """Fill `db` with `n` jobs in the queue and the ledger; count the scrape's series."""
    with writer(db) as con:
        for table, key in (("queue.jobs", "job_id"), ("marts.carbon_ledger", "job_id")):
            have = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            if not have:
                raise ValueError(f"{db}: {table} is empty; run `make run` first")
            columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            rounds = -(-(n - have) // have)
            select = ", ".join(f"{key} || '-x' || r AS {key}" if c == key else
                               ("planner_job_id || '-x' || r AS planner_job_id" if c == "planner_job_id" else c)
                               for c in columns)  # fmt: skip
            con.execute(
                f"INSERT INTO {table} SELECT {select} FROM {table}, range(1, {rounds + 1}) AS t(r) "
                f"LIMIT {max(n - have, 0)}"
            )
        jobs = con.execute("SELECT count(*) FROM queue.jobs").fetchone()[0]
    cache = MetricsCache(db)
    t0 = time.perf_counter()
    text = cache.text().decode()
    return {"jobs": int(jobs), "series": _series(text), "read_s": round(time.perf_counter() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ui.metrics_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="warehouse to copy (default WAREHOUSE_PATH); never written")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs of the cardinality check (default 100000)")
    parser.add_argument("--hours", type=int, default=1, help="loop hours written during the scrapes (default 1)")
    parser.add_argument("--max-age", type=float, default=1.0, help="snapshot age that triggers a refresh (s)")
    parser.add_argument("--submit", type=int, default=2000, help="trace jobs queued before the hours (default 2000)")
    args = parser.parse_args(argv)
    source = Path(args.db) if args.db else warehouse_path()
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        copy = Path(tmp) / "warehouse.duckdb"
        shutil.copyfile(source, copy)
        latency = scrape_while_writing(copy, args.hours, args.max_age, args.submit)
        many = Path(tmp) / "many-jobs.duckdb"
        shutil.copyfile(source, many)
        cardinality = with_many_jobs(many, args.jobs)
    doc = {
        "benchmark": "metrics",
        "warehouse": str(source),
        "while_a_loop_hour_writes": latency,
        "cardinality": cardinality,
        "targets": TARGETS,
        "latency_target_met": latency["max_s"] is not None and latency["max_s"] < TARGETS["scrape_s"],
        "cardinality_target_met": cardinality["series"] < TARGETS["series"],
        "environment": {**environment(), "duckdb": duckdb.__version__},
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
