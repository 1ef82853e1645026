"""Two OS processes writing the warehouse at the same time both succeed (warehouse.db.writer's exclusive flock),
and both batches are there afterwards. Real processes and a real DuckDB file: DuckDB itself refuses a second
writing process, so without the lock one of them would fail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb

REPO_ROOT = Path(__file__).resolve().parents[2]

# Each child waits for the go file (so both race for the lock), then loads its batch and holds the writer a while,
# so the other one must wait on the lock. It prints when it asked for the lock, got it and let it go.
_CHILD = r"""
import json, sys, time
from pathlib import Path
import pandas as pd
from warehouse.db import Batch, load_batch, writer
path, name, go, hold_s = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
while not go.exists():
    time.sleep(0.01)
asked = time.time()
with writer(path, timeout_s=60) as con:
    got = time.time()
    go.with_name(name + ".got").touch()
    load_batch(con, Batch("raw.things", name, "test", pd.DataFrame({"x": [1, 2, 3], "who": [name] * 3})))
    time.sleep(hold_s)
    released = time.time()
print(json.dumps({"name": name, "asked": asked, "got": got, "released": released}))
"""


def _start(path: Path, name: str, go: Path, hold_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), name, str(go), str(hold_s)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_writing_at_once_both_succeed(tmp_path):
    path, go = tmp_path / "warehouse.duckdb", tmp_path / "go"
    children = [_start(path, name, go, hold_s=1.5) for name in ("a", "b")]
    time.sleep(3)  # both children imported pandas/duckdb and are polling for the go file
    go.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    first, second = sorted(results, key=lambda r: r["got"])
    # They really raced: the second asked for the lock while the first held it, and waited for it.
    assert second["asked"] < first["released"] <= second["got"] + 0.05
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT _batch_id, count(*) FROM raw.things GROUP BY ALL ORDER BY 1").fetchall()
        batches = con.execute("SELECT batch_id FROM raw._batches ORDER BY 1").fetchall()
    assert rows == [("a", 3), ("b", 3)]
    assert batches == [("a",), ("b",)]


def test_duckdb_alone_refuses_a_second_writer(tmp_path):
    """Why the lock exists: while one process holds the file for writing, DuckDB refuses another."""
    path, go = tmp_path / "warehouse.duckdb", tmp_path / "go"
    go.touch()
    holder = _start(path, "a", go, hold_s=8)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "a.got").exists():
        time.sleep(0.1)  # until the holder has the file open for writing (it keeps it 8 s)
    probe = subprocess.run(
        [sys.executable, "-c", f"import duckdb; duckdb.connect({str(path)!r})"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    holder.communicate(timeout=60)
    assert holder.returncode == 0
    assert probe.returncode != 0 and "lock" in probe.stderr.lower(), probe.stderr[-2000:]
