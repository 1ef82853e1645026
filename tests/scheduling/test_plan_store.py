"""plan.* in the warehouse: one transaction per plan, identical rows on re-runs, the previous plan intact after a
failure or a kill midway, dry runs that write explanations only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from scheduling.output import plan_store
from scheduling.output.plan_store import make_plan, plan_id_for, read_plan, table_digest, write_plan

REPO_ROOT = Path(__file__).resolve().parents[2]


def sample_plan(
    plan_time="2021-07-15T12:00Z", n_jobs: int = 6, policy: str = "priority", seed: int = 0, kg_offset: float = 0.0
):
    """A small plan with the contract's fields (two clusters, shared and whole-GPU jobs, one unplaced job)."""
    t0 = pd.Timestamp(plan_time)
    rng = np.random.default_rng(seed)
    clusters = [("usw-v100m32", "us-west", "V100M32"), ("eun-g2", "eu-north", "G2")]
    rows, explanations = [], []
    for i in range(n_jobs):
        cluster, region, model = clusters[i % 2]
        start = t0 + pd.Timedelta(hours=int(rng.integers(0, 12)))
        duration = pd.Timedelta(minutes=int(rng.integers(60, 600)))
        shared = i % 3 == 0
        kg = 0.3 + 0.1 * i + kg_offset
        rows.append(
            dict(
                job_id=f"job-{i:05d}",
                cluster=cluster,
                region=region,
                node=f"{cluster}/openb-node-{i:04d}",
                gpu_devices="0" if shared else "0,1",
                gpu_milli=500 if shared else 1000,
                gpu_count=1 if shared else 2,
                start_time=start,
                end_time=start + duration,
                power_limit_w=250.0,
                expected_energy_kwh=1.5 + i,
                expected_kgco2e=kg,
                priority=0.5 + 0.01 * i,
                gpu_model=model,
                cpu_milli=8000,
                memory_mib=30517,
                deadline=start + 2 * duration,
                status="dispatched" if start == t0 else "tentative",
            )
        )
        explanations.append(
            dict(
                job_id=f"job-{i:05d}",
                priority=0.5 + 0.01 * i,
                urgency=0.4,
                flexibility=0.3,
                opportunity=0.2,
                weights={"urgency": 0.35, "flexibility": 0.40, "opportunity": 0.25},
                chosen=dict(region=region, cluster=cluster, start_time=start, kgco2e=kg),
                alternatives=[
                    dict(region=r, start_time=t0 + pd.Timedelta(hours=k), kgco2e=0.5 + 0.05 * k)
                    for k, r in enumerate(["us-west", "eu-north", "us-east", "eu-central", "us-south"])
                ],
                counterfactuals=dict(
                    run_now_kgco2e=0.9 + 0.1 * i,
                    greedy_carbon_kgco2e=0.35 + 0.1 * i,
                    optimum_kgco2e=None if i % 2 else 0.28 + 0.1 * i,
                ),
                binding_constraints=["deadline"] if i % 2 else ["none"],
                forecast_version="naive-24@2021-07-15T12:00:00Z",
                power=dict(limit_w=250, saving_kgco2e=0.02),
            )
        )
    return make_plan(
        plan_time=t0,
        policy=policy,
        forecast_version="naive-24@2021-07-15T12:00:00Z",
        assignments=pd.DataFrame(rows),
        explanations=explanations,
        unplaced=pd.DataFrame({"job_id": ["job-09999"], "reason": ["capacity"]}),
    )


def _rows(db: Path, table: str) -> pd.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(f"SELECT * FROM {table} ORDER BY ALL").df()


def test_plan_id_is_policy_and_iso_time():
    assert plan_id_for("priority", "2021-07-15T12:00:00+02:00") == "priority@2021-07-15T10:00:00Z"
    with pytest.raises(ValueError):
        plan_id_for("", "2021-07-15T12:00Z")


def test_write_read_roundtrip_and_rerun_identical(tmp_path):
    db = tmp_path / "wh.duckdb"
    plan = sample_plan()
    pid = write_plan(plan, schedule_dir="var/schedules/2021-07-15T12-00Z", created_from="test", db_path=db)
    assert pid == "priority@2021-07-15T12:00:00Z"
    first = table_digest(db)
    assert set(first) == {"plan.plans", "plan.assignments", "plan.explanations", "plan.unplaced"}
    write_plan(sample_plan(), schedule_dir="var/schedules/2021-07-15T12-00Z", created_from="test", db_path=db)
    assert table_digest(db) == first

    meta = _rows(db, "plan.plans").iloc[0]
    assert (meta["n_jobs"], meta["n_assigned"]) == (7, 6)
    assert meta["expected_kgco2e"] == pytest.approx(sum(0.3 + 0.1 * i for i in range(6)))
    assert meta["schedule_dir"].endswith("2021-07-15T12-00Z")

    back, row, texts = read_plan(pid, db_path=db, with_meta=True)
    assert back.policy == "priority" and back.plan_time == pd.Timestamp("2021-07-15T12:00Z")
    a = back.assignments
    assert list(a["job_id"]) == [f"job-{i:05d}" for i in range(6)]
    assert a.loc[0, "gpu_devices"] == "0" and a.loc[1, "gpu_devices"] == "0,1"
    assert str(a["start_time"].dt.tz) == "UTC"
    assert {"gpu_model", "deadline", "cpu_milli"} <= set(a.columns)  # extras widened into the table
    assert back.explanations[0]["chosen"]["start_time"].endswith("Z")
    assert list(back.unplaced["job_id"]) == ["job-09999"]
    assert "priority 0.500" in texts["job-00000"]


def test_latest_plan_respects_as_of_and_policy(tmp_path):
    db = tmp_path / "wh.duckdb"
    assert plan_store.latest_plan(db_path=db) is None
    for hour in (10, 11, 12):
        write_plan(sample_plan(f"2021-07-15T{hour}:00Z"), db_path=db)
    write_plan(sample_plan("2021-07-15T13:00Z", policy="greedy-carbon"), db_path=db)
    assert plan_store.latest_plan(db_path=db).policy == "greedy-carbon"
    assert plan_store.latest_plan("priority", db_path=db).plan_time.hour == 12
    assert plan_store.latest_plan("priority", as_of="2021-07-15T11:30Z", db_path=db).plan_time.hour == 11
    with pytest.raises(KeyError):
        read_plan("priority@2020-01-01T00:00:00Z", db_path=db)


def test_rewrite_replaces_only_its_own_rows(tmp_path):
    db = tmp_path / "wh.duckdb"
    write_plan(sample_plan("2021-07-15T11:00Z"), db_path=db)
    write_plan(sample_plan("2021-07-15T12:00Z", n_jobs=6), db_path=db)
    other = table_digest(db, ["priority@2021-07-15T11:00:00Z"])
    write_plan(sample_plan("2021-07-15T12:00Z", n_jobs=3), db_path=db)  # fewer jobs: old rows must go
    assert len(_rows(db, "plan.assignments").query("plan_id == 'priority@2021-07-15T12:00:00Z'")) == 3
    assert table_digest(db, ["priority@2021-07-15T11:00:00Z"]) == other


def test_failure_inside_the_transaction_keeps_the_previous_rows(tmp_path):
    db = tmp_path / "wh.duckdb"
    write_plan(sample_plan(), db_path=db)
    before = table_digest(db)

    def boom(stage):
        if stage == "assignments":
            raise RuntimeError("injected failure")

    with pytest.raises(RuntimeError, match="injected"):
        write_plan(sample_plan(kg_offset=5.0), db_path=db, _fault=boom)
    assert table_digest(db) == before


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.scheduling.test_plan_store import sample_plan
    from scheduling.output.plan_store import write_plan
    marker = Path({marker!r})
    def hang(stage):
        if stage == "assignments":          # deleted + half inserted, not committed
            marker.write_text(stage)
            time.sleep(600)
    write_plan(sample_plan(kg_offset=5.0, n_jobs=9), db_path={db!r}, _fault=hang)
""")


def test_sigkill_midway_leaves_the_previous_plan_intact(tmp_path):
    db = tmp_path / "wh.duckdb"
    write_plan(sample_plan(), db_path=db)
    before = table_digest(db)
    marker = tmp_path / "marker"
    script = _KILLED_WRITER.format(root=str(REPO_ROOT), marker=str(marker), db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "writer exited before reaching the kill point"
            assert time.monotonic() < deadline, "writer never reached the kill point"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert table_digest(db) == before  # WAL replay drops the uncommitted transaction
    write_plan(sample_plan(kg_offset=1.0), db_path=db)  # and the warehouse is writable again
    assert table_digest(db) != before


def test_dry_run_writes_explanations_only(tmp_path):
    db = tmp_path / "wh.duckdb"
    plan = sample_plan()
    pid = write_plan(plan, db_path=db, explanations_only=True, texts={"job-00000": "custom text"})
    assert pid == "priority@2021-07-15T12:00:00Z#dry-run"
    assert _rows(db, "plan.plans").empty and _rows(db, "plan.assignments").empty
    assert _rows(db, "plan.unplaced").empty
    expl = plan_store.read_explanations(pid, db_path=db)
    assert len(expl) == 6 and expl.iloc[0]["text"] == "custom text"
    assert plan_store.latest_plan(db_path=db) is None
    # a real plan of the same hour and a later dry run do not touch each other's explanations
    real = write_plan(sample_plan(), db_path=db)
    before = plan_store.read_explanations(real, db_path=db)
    write_plan(sample_plan(n_jobs=2), db_path=db, explanations_only=True)
    pd.testing.assert_frame_equal(plan_store.read_explanations(real, db_path=db), before)
    assert len(plan_store.read_explanations(pid, db_path=db)) == 2


def test_bad_assignments_are_rejected_with_a_clear_message(tmp_path):
    plan = sample_plan()
    plan.assignments = pd.concat([plan.assignments, plan.assignments.iloc[[0]]])
    with pytest.raises(ValueError, match="job-00000"):
        write_plan(plan, db_path=tmp_path / "wh.duckdb")


def test_an_empty_plan_first_does_not_mistype_the_extra_columns(tmp_path):
    db = tmp_path / "wh.duckdb"
    empty = make_plan(
        plan_time="2021-07-15T05:00Z",
        policy="priority",
        forecast_version=None,
        assignments=None,
        explanations=[],
        unplaced=None,
    )
    write_plan(empty, db_path=db)
    assert _rows(db, "plan.plans").iloc[0]["n_jobs"] == 0
    write_plan(sample_plan(), db_path=db)  # gpu_model (text), deadline (time), checkpointing-like extras
    with duckdb.connect(str(db), read_only=True) as con:
        types = dict(
            con.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'plan' AND table_name = 'assignments'"
            ).fetchall()
        )
    assert types["gpu_model"] == "VARCHAR" and types["deadline"].startswith("TIMESTAMP")
    assert types["cpu_milli"] == "BIGINT"


def test_rewriting_a_plan_into_a_table_missing_a_new_column_widens_it(tmp_path):
    """A warehouse written before a column existed (here: the sample plan's `cpu_milli`): re-writing the same hour's
    plan (its plan.plans key deleted and inserted again) adds the column and keeps the rows, in a fresh process,
    since DuckDB aborts the process on a commit that alters a table beside such a key's delete and re-insert."""
    db = tmp_path / "wh.duckdb"
    plan = sample_plan()
    write_plan(plan, db_path=db)
    with duckdb.connect(str(db)) as con:
        con.execute("ALTER TABLE plan.assignments DROP COLUMN cpu_milli")
    code = textwrap.dedent(
        f"""
        from tests.scheduling.test_plan_store import sample_plan
        from scheduling.output.plan_store import write_plan
        write_plan(sample_plan(), db_path={str(db)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _rows(db, "plan.assignments")
    assert len(rows) == len(plan.assignments) and rows["cpu_milli"].notna().all()
    assert len(_rows(db, "plan.plans")) == 1
