"""Time every Carbon page and its JSON twin on a warehouse, in process through the app (authentication excluded:
a pass-through dependency), and print one JSON document: per route the first answer in a fresh process (cold) and
the median and slowest of `--repeats` more, with the machine and versions.

    python -m ui.bench --db var/warehouse.duckdb [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import duckdb
import fastapi
from fastapi.testclient import TestClient

from scheduling.evaluation.results import environment
from ui.app import create_app
from warehouse.config import warehouse_path
from warehouse.db import reader, table_exists


def _no_auth() -> None:
    """The benchmark's stand-in for Airflow's check (a JWT decode, well under a millisecond)."""


def _job_paths(db) -> list[str]:
    """The job with the most decisions (the largest job page) and, when the ledger has one, a finished job."""
    with reader(db) as con:
        if not table_exists(con, "plan.explanations"):
            return []
        busiest = con.execute(
            "SELECT job_id FROM plan.explanations GROUP BY job_id ORDER BY count(*) DESC, job_id LIMIT 1"
        ).fetchone()
        finished = None
        if table_exists(con, "marts.carbon_ledger"):
            finished = con.execute(
                "SELECT tenant || '/' || job_id FROM marts.carbon_ledger WHERE outcome = 'finished' "
                "ORDER BY tenant, job_id LIMIT 1"
            ).fetchone()
    return [f"/jobs/{row[0]}" for row in (busiest, finished) if row]


def bench(db, repeats: int) -> dict:
    client = TestClient(create_app(_no_auth, db_path=db), root_path="/carbon")
    pages = ["/", "/plan", *_job_paths(db)]
    routes = [p for page in pages for p in (page, "/api/overview" if page == "/" else f"/api{page}")]
    out = {}
    for route in routes:
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            reply = client.get(route)
            times.append(time.perf_counter() - start)
            if reply.status_code != 200:
                raise RuntimeError(f"{route}: HTTP {reply.status_code} {reply.text[:200]}")
        out[route] = {
            "cold_s": round(times[0], 4),
            "median_s": round(statistics.median(times[1:]), 4),
            "max_s": round(max(times[1:]), 4),
            "bytes": len(reply.content),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ui.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="warehouse file (default WAREHOUSE_PATH)")
    parser.add_argument("--repeats", type=int, default=5, help="answers timed after the first (default 5)")
    args = parser.parse_args(argv)
    db = args.db or str(warehouse_path())
    routes = bench(db, args.repeats)
    doc = {
        "warehouse": db,
        "repeats": args.repeats,
        "routes": routes,
        "slowest_warm_s": max(r["max_s"] for r in routes.values()),
        "slowest_cold_s": max(r["cold_s"] for r in routes.values()),
        "environment": {**environment(), "duckdb": duckdb.__version__, "fastapi": fastapi.__version__},
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
