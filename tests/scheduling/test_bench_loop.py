"""`python -m scheduling bench-loop` at a tiny size: the JSON has its keys, the measured hour starts from the queue
and running set asked for (not the user's queue), and the user's warehouse is left as it was. No timing checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scheduling.queue import store
from scheduling.queue.intake import submit_file

REPO_ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "loop_hour_s",
    "sync_s",
    "plan_s",
    "dispatch_s",
    "process_peak_rss_mb",
    "queued",
    "running",
    "dispatched",
    "events",
    "running_from",
    "queued_from",
    "warehouse",
}


def test_bench_loop_measures_the_asked_state_on_a_copy(tmp_warehouse, data_dir):
    report = submit_file(REPO_ROOT / "docs" / "examples" / "jobs.yaml", db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 10
    before = store.table_digest(db_path=tmp_warehouse)
    cmd = [sys.executable, "-m", "scheduling", "bench-loop", "--queued", "50", "--running", "10", "--repeats", "2"]
    out = subprocess.run(
        [*cmd, "--db", str(tmp_warehouse), "--json"], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert KEYS <= set(doc)
    assert (doc["queued"], doc["running"], doc["pending_planned"]) == (50, 10, 50)  # the user's 10 jobs not among them
    assert doc["events"] == 20 and doc["entered"] == {"running": 10}  # each running job: dispatched, started
    assert doc["dispatched"] >= 1 and doc["same_state_each_repeat"] and len(doc["loop_hour_s_all"]) == 2
    assert doc["loop_hour_s"] > 0 and doc["process_peak_rss_mb"] > 0
    assert doc["warehouse"]["copied_from"] == str(tmp_warehouse)
    assert store.table_digest(db_path=tmp_warehouse) == before


def test_bench_loop_with_checkpointing_running_jobs(tmp_warehouse):
    cmd = [sys.executable, "-m", "scheduling", "bench-loop", "--queued", "20", "--running", "10", "--repeats", "1"]
    out = subprocess.run(
        [*cmd, "--checkpointing", "--db", str(tmp_warehouse), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["running"] == doc["running_checkpointing"] == 10  # every running job checkpoints


def test_bench_loop_refuses_bad_sizes():
    out = subprocess.run(
        [sys.executable, "-m", "scheduling", "bench-loop", "--repeats", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 2 and "--repeats" in out.stderr and out.stdout == ""
