"""Two OS processes writing the warehouse at the same time both succeed: the second waits on warehouse.db.writer's
exclusive flock while the first holds the writer, then gets it, and both batches are there afterwards. Real processes
and a real DuckDB file. Every step of the children leaves a marker file that the test waits on (with a generous
deadline), and the first child keeps the writer until the test lets it go, so the order never depends on timing."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb

REPO_ROOT = Path(__file__).resolve().parents[2]

# Each child announces it is ready (imports done), waits for the go file, asks for the writer, loads its batch and
# keeps the writer until the test creates its release file. It records when it asked for the lock, got it and let it
# go, and leaves a marker file at each step for the test to wait on.
_CHILD = r"""
import json, sys, time
from pathlib import Path
import pandas as pd
from warehouse.db import Batch, load_batch, writer
path, name, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
def wait_for(marker):
    deadline = time.monotonic() + 300
    while not marker.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: no {marker.name} within 300 s")
        time.sleep(0.01)
(folder / (name + ".ready")).touch()
wait_for(folder / "go")
asked = time.time()
(folder / (name + ".asked")).touch()
with writer(path, timeout_s=300) as con:
    got = time.time()
    (folder / (name + ".got")).touch()
    load_batch(con, Batch("raw.things", name, "test", pd.DataFrame({"x": [1, 2, 3], "who": [name] * 3})))
    wait_for(folder / (name + ".release"))
    released = time.time()
print(json.dumps({"name": name, "asked": asked, "got": got, "released": released}))
"""
DEADLINE_S = 300  # for a step of another process: generous, a loaded host is slow but never that slow


def _start(path: Path, name: str, folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), name, str(folder)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(children: list[subprocess.Popen], *markers: Path) -> Path:
    """The first of `markers` to exist; fails when a child exits first or after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for marker in markers:
            if marker.exists():
                return marker
        for child in children:
            if child.poll() is not None:
                raise AssertionError(f"a child exited ({child.returncode}): {child.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"none of {[m.name for m in markers]} within {DEADLINE_S} s"
        time.sleep(0.02)


def _held_exclusively(path: Path) -> bool:
    """Whether another process holds the warehouse's writer lock (a non-blocking exclusive flock fails)."""
    with open(path.with_name(path.name + ".lock"), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_two_processes_writing_at_once_both_succeed(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    children = [_start(path, name, tmp_path) for name in ("a", "b")]
    try:
        for name in ("a", "b"):
            _wait_for(children, tmp_path / f"{name}.ready")
        (tmp_path / "go").touch()
        first = _wait_for(children, tmp_path / "a.got", tmp_path / "b.got").name[0]
        second = "b" if first == "a" else "a"
        # the second asks while the first holds the writer, and stays out
        _wait_for(children, tmp_path / f"{second}.asked")
        assert _held_exclusively(path)
        assert not (tmp_path / f"{second}.got").exists()
        (tmp_path / f"{first}.release").touch()
        _wait_for(children, tmp_path / f"{second}.got")
        (tmp_path / f"{second}.release").touch()
        results = {}
        for child in children:
            out, err = child.communicate(timeout=DEADLINE_S)
            assert child.returncode == 0, err[-3000:]
            result = json.loads(out.strip().splitlines()[-1])
            results[result["name"]] = result
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    # they really raced: the second asked for the lock while the first held it, and got it once it was let go
    assert results[second]["asked"] < results[first]["released"] <= results[second]["got"]
    with duckdb.connect(str(path), read_only=True) as con:
        rows = con.execute("SELECT _batch_id, count(*) FROM raw.things GROUP BY ALL ORDER BY 1").fetchall()
        batches = con.execute("SELECT batch_id FROM raw._batches ORDER BY 1").fetchall()
    assert rows == [("a", 3), ("b", 3)]
    assert batches == [("a",), ("b",)]


def test_duckdb_alone_refuses_a_second_writer(tmp_path):
    """Why the lock exists: while one process holds the file for writing, DuckDB refuses another."""
    path = tmp_path / "warehouse.duckdb"
    (tmp_path / "go").touch()
    holder = _start(path, "a", tmp_path)
    try:
        _wait_for([holder], tmp_path / "a.got")  # the holder has the file open for writing until a.release
        probe = subprocess.run(
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(path)!r})"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        (tmp_path / "a.release").touch()
        holder.communicate(timeout=DEADLINE_S)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0
    assert probe.returncode != 0 and "lock" in probe.stderr.lower(), probe.stderr[-2000:]
