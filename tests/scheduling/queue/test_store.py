"""Idempotent intake per (tenant, job_id), replace rules, the staging table, and the queue's state transitions."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from scheduling.queue import store
from scheduling.queue.intake import intake_staging, submit_file
from scheduling.queue.store import InvalidTransition, UnknownJob
from tests.scheduling.queue.helpers import AS_OF, good_job, quarantine, stored, write_yaml

T1 = "2021-07-15T13:00:00Z"
T2 = "2021-07-15T14:00:00Z"


def _submit(tmp_path, db, facts, jobs, name="jobs.yaml", **kw):
    return submit_file(write_yaml(tmp_path / name, jobs), facts=facts, db_path=db, **kw)


# ------------------------------------------------------------------------------------------------ idempotency
def test_same_file_twice_leaves_the_warehouse_identical(tmp_warehouse, tmp_path, facts):
    jobs = [good_job(job_id="a"), good_job(job_id="b", gpus=0), good_job(job_id="c", submitted_at=None)]
    first = _submit(tmp_path, tmp_warehouse, facts, jobs, as_of=AS_OF)
    assert first.counts == {"accepted": 2, "unchanged": 0, "replaced": 0, "rejected": 1}
    digest = store.table_digest(tmp_warehouse)
    assert set(digest) >= {"queue.jobs", "queue.job_history", "quarantine.rejected_rows"}
    again = _submit(tmp_path, tmp_warehouse, facts, jobs, as_of=AS_OF)
    assert again.counts == {"accepted": 0, "unchanged": 2, "replaced": 0, "rejected": 1}
    assert store.table_digest(tmp_warehouse) == digest


def test_resubmitting_later_is_a_no_op_keeping_the_first_submission(tmp_warehouse, tmp_path, facts):
    _submit(tmp_path, tmp_warehouse, facts, [good_job(submitted_at=None)], as_of=AS_OF)
    report = _submit(tmp_path, tmp_warehouse, facts, [good_job(submitted_at=None)], as_of=T1)
    assert report.counts["unchanged"] == 1
    assert stored(tmp_warehouse)["ml/j1"]["submitted_at"].isoformat().startswith("2021-07-15T12:00")


def test_changed_spec_is_rejected_without_replace_naming_the_fields(tmp_warehouse, tmp_path, facts):
    _submit(tmp_path, tmp_warehouse, facts, [good_job()])
    before = store.table_digest(tmp_warehouse)
    report = _submit(tmp_path, tmp_warehouse, facts, [good_job(gpus=2, input_gb=5.0)], name="v2.yaml")
    (error,) = report.rejected[0].errors
    assert error["field"] == "gpus" and "gpus, input_gb differ" in error["reason"] and "--replace" in error["reason"]
    assert stored(tmp_warehouse)["ml/j1"]["gpus"] == 1
    assert quarantine(tmp_warehouse)[0]["field"] == "gpus"
    after = store.table_digest(tmp_warehouse)
    assert after["queue.jobs"] == before["queue.jobs"] and after["queue.job_history"] == before["queue.job_history"]


def test_replace_while_queued_then_not_after_planned(tmp_warehouse, tmp_path, facts):
    _submit(tmp_path, tmp_warehouse, facts, [good_job()])
    report = _submit(tmp_path, tmp_warehouse, facts, [good_job(gpus=2)], name="v2.yaml", replace=True, as_of=T1)
    assert report.counts["replaced"] == 1
    row = stored(tmp_warehouse)["ml/j1"]
    assert (
        row["gpus"] == 2
        and row["state"] == "queued"
        and row["state_changed_at"].isoformat().startswith("2021-07-15T13")
    )
    history = store.show_job("ml/j1", db_path=tmp_warehouse)["history"]
    assert [h["event"] for h in history] == ["submitted", "replaced"]
    store.set_state("ml/j1", "planned", at=T1, reason="rolling-lp@2021-07-15T13:00:00Z", db_path=tmp_warehouse)
    report = _submit(tmp_path, tmp_warehouse, facts, [good_job(gpus=4)], name="v3.yaml", replace=True, as_of=T2)
    assert report.counts["rejected"] == 1
    assert report.rejected[0].errors[0]["field"] == "job_id" and "planned" in report.rejected[0].errors[0]["reason"]
    assert stored(tmp_warehouse)["ml/j1"]["gpus"] == 2


# ------------------------------------------------------------------------------------------------ staging
def test_staging_rows_move_into_the_queue_with_the_same_checks(tmp_warehouse, tmp_path, facts):
    intake_staging(facts=facts, db_path=tmp_warehouse)  # creates the tables
    with duckdb.connect(str(tmp_warehouse)) as con:
        con.execute(
            "INSERT INTO queue.submissions (tenant, job_id, gpus, cpu_milli, memory_mib, job_type, home_region, "
            "gpu_models, allowed_regions, command) VALUES "
            "('ml', 's1', 1, 4000, 16384, 'A3C', 'eu-north', ['V100M32'], ['eu-north', 'eu-central'], "
            '\'["python", "a3c.py"]\'), '
            "('ml', 's2', 0, 4000, 16384, 'A3C', 'eu-north', NULL, NULL, NULL)"
        )
    report = intake_staging(facts=facts, db_path=tmp_warehouse, as_of=AS_OF)
    assert [o.status for o in report.outcomes] == ["accepted", "rejected"]
    assert report.rejected[0].errors[0]["field"] == "gpus" and report.rejected[0].where == "queue.submissions"
    row = stored(tmp_warehouse)["ml/s1"]
    assert row["created_from"] == "sql:queue.submissions" and row["allowed_regions"] == ["eu-central", "eu-north"]
    assert store.spec_of(row).command == ("python", "a3c.py")
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:  # the rejected row stays, to be fixed
        assert con.execute("SELECT job_id FROM queue.submissions").fetchall() == [("s2",)]
    q = quarantine(tmp_warehouse)
    assert len(q) == 1 and q[0]["field"] == "gpus" and '"s2"' in q[0]["record"]
    assert q[0]["batch_id"].startswith("queue.submissions#")
    digest = store.table_digest(tmp_warehouse)
    again = intake_staging(facts=facts, db_path=tmp_warehouse, as_of=AS_OF)  # the same row: nothing changes
    assert again.counts["rejected"] == 1 and store.table_digest(tmp_warehouse) == digest
    with duckdb.connect(str(tmp_warehouse)) as con:
        con.execute("UPDATE queue.submissions SET gpus = 1 WHERE job_id = 's2'")
    fixed = intake_staging(facts=facts, db_path=tmp_warehouse, as_of=AS_OF)
    assert fixed.counts["accepted"] == 1 and set(stored(tmp_warehouse)) == {"ml/s1", "ml/s2"}
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM queue.submissions").fetchone()[0] == 0
    assert len(quarantine(tmp_warehouse)) == 1  # the earlier rejection stays as history


def test_column_lists_match_the_spec():
    from scheduling.queue.spec import SYSTEM_COLUMNS, USER_FIELDS

    assert tuple(store.USER_COLUMNS) == USER_FIELDS
    assert tuple(store.SYSTEM_COLUMN_TYPES) == SYSTEM_COLUMNS


def test_the_optional_checkpoint_fields_are_stored_and_an_older_queue_gets_their_columns(
    tmp_warehouse, tmp_path, facts
):
    """A job's checkpoint overhead and preemption cap reach its frame; a queue created before those columns existed
    gets them (empty) on the next write, keeps its job and its spec hash, and takes the same file again as unchanged."""
    from scheduling.queue.frame import pending_job_frame
    from scheduling.service import plan_fleet

    plain = write_yaml(tmp_path / "a.yaml", [good_job(job_id="old", checkpoint_interval_min=30)])
    assert submit_file(plain, facts=facts, db_path=tmp_warehouse).counts["accepted"] == 1
    with duckdb.connect(str(tmp_warehouse)) as con:  # as a queue written before the columns existed
        for table in ("queue.jobs", "queue.submissions"):
            for column in store.ADDED_COLUMNS:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        before = con.execute("SELECT spec_hash FROM queue.jobs").fetchone()[0]
    own = good_job(job_id="own", checkpoint_interval_min=30, checkpoint_overhead_min=2.5, max_preemptions=1)
    again = write_yaml(tmp_path / "b.yaml", [good_job(job_id="old", checkpoint_interval_min=30), own])
    report = submit_file(again, facts=facts, db_path=tmp_warehouse)
    assert (report.counts["unchanged"], report.counts["accepted"]) == (1, 1), report.to_dict()
    with duckdb.connect(str(tmp_warehouse), read_only=True) as con:
        rows = dict(con.execute("SELECT job_id, [checkpoint_overhead_min, max_preemptions] FROM queue.jobs").fetchall())
        assert con.execute("SELECT spec_hash FROM queue.jobs WHERE job_id = 'old'").fetchone()[0] == before
    assert rows == {"old": [None, None], "own": [2.5, 1]}
    frame = pending_job_frame(AS_OF, plan_fleet(None, None), db_path=tmp_warehouse).set_index("queue_job_id")
    assert frame.loc["own", "checkpoint_overhead_min"] == 2.5 and frame.loc["own", "max_preemptions"] == 1
    assert np.isnan(frame.loc["old", "checkpoint_overhead_min"]) and pd.isna(frame.loc["old", "max_preemptions"])


# ------------------------------------------------------------------------------------------------ states
@pytest.fixture
def queued(tmp_warehouse, tmp_path, facts):
    jobs = [good_job(job_id=j, max_retries=1) for j in ("a", "b", "c")]
    _submit(tmp_path, tmp_warehouse, facts, jobs)
    return tmp_warehouse


def _state(db, job):
    return stored(db)[job]["state"]


def test_the_job_lifecycle_and_its_history(queued):
    db = queued
    assert store.set_state("ml/a", "planned", at=AS_OF, reason="plan p1", source="loop", db_path=db)
    assert not store.set_state("ml/a", "planned", at=T1, db_path=db)  # a re-plan: nothing written
    store.set_state(("ml", "a"), "dispatched", at=T1, db_path=db)
    store.set_state("ml/a", "running", at=T1, db_path=db)
    store.set_state("ml/a", "finished", at=T2, db_path=db)
    row = stored(db)["ml/a"]
    assert row["state"] == "finished" and row["attempts"] == 1 and row["state_changed_at"].hour == 14
    history = store.show_job("a", tenant="ml", db_path=db)["history"]
    assert [(h["from_state"], h["to_state"]) for h in history] == [
        (None, "queued"),
        ("queued", "planned"),
        ("planned", "dispatched"),
        ("dispatched", "running"),
        ("running", "finished"),
    ]
    assert history[1]["reason"] == "plan p1" and history[1]["source"] == "loop"
    with pytest.raises(InvalidTransition, match="cannot go from finished to queued"):
        store.set_state("ml/a", "queued", at=T2, db_path=db)


@pytest.mark.parametrize(
    "path, bad",
    [
        (["planned"], "finished"),  # planned -> finished: it never ran
        ([], "finished"),  # queued -> finished
        (["cancelled"], "planned"),  # a final state
        (["dispatched", "running", "failed"], "queued"),
    ],
)
def test_transitions_not_allowed_raise_and_change_nothing(queued, path, bad):
    for state in path:
        store.set_state("ml/b", state, at=T1, db_path=queued)
    before = store.table_digest(queued)
    with pytest.raises(InvalidTransition) as err:
        store.set_state("ml/b", bad, at=T2, db_path=queued)
    assert "ml/b" in str(err.value) and bad in str(err.value)
    assert store.table_digest(queued) == before


def test_an_adopted_import_its_executor_started_itself_runs_without_an_attempt(queued):
    store.set_state("ml/b", "planned", at=T1, db_path=queued)
    store.set_state("ml/b", "running", at=T1, reason="slurm: started (p1, attempt 0)", db_path=queued)
    assert stored(queued)["ml/b"]["attempts"] == 0  # no dispatch: a failure now is retried as attempt 1
    store.set_state("ml/b", "queued", at=T2, db_path=queued)
    assert _state(queued, "ml/b") == "queued"


def test_retries_are_bounded_by_max_retries(queued):
    db = queued
    for _ in range(2):  # max_retries 1: one retry
        store.set_state("ml/c", "dispatched", at=T1, db_path=db)
        store.set_state("ml/c", "running", at=T1, db_path=db)
        if stored(db)["ml/c"]["attempts"] == 1:
            store.set_state("ml/c", "queued", at=T1, reason="node lost", db_path=db)
    assert stored(db)["ml/c"]["attempts"] == 2
    with pytest.raises(InvalidTransition, match="no retry left"):
        store.set_state("ml/c", "queued", at=T2, db_path=db)
    store.set_state("ml/c", "failed", at=T2, db_path=db)


def test_set_states_is_all_or_nothing(queued):
    before = store.table_digest(queued)
    with pytest.raises(UnknownJob):
        store.set_states(["ml/a", "ml/b", "ml/nope"], "planned", at=T1, db_path=queued)
    store.set_state("ml/c", "cancelled", at=T1, db_path=queued)
    mid = store.table_digest(queued)
    with pytest.raises(InvalidTransition):
        store.set_states(["ml/a", "ml/c"], "planned", at=T1, db_path=queued)
    assert store.table_digest(queued) == mid != before
    assert store.set_states(["ml/a", "ml/b"], "planned", at=T1, db_path=queued) == ["ml/a", "ml/b"]
    with pytest.raises(InvalidTransition, match="unknown state"):
        store.set_state("ml/a", "paused", at=T1, db_path=queued)
    with pytest.raises(ValueError, match="need their tenant"):
        store.set_state("a", "queued", at=T1, db_path=queued)


def test_apply_changes_writes_many_changes_in_order_all_or_nothing(queued):
    """What the hourly sync does with a window of events: several changes of one job in a row, others' in
    between, re-plans that change nothing; one bad change keeps none of them."""
    before = store.table_digest(queued)
    bad = [("ml/a", "planned", AS_OF, "p1"), ("ml/b", "finished", T1, "finished")]  # queued -> finished: not allowed
    with pytest.raises(InvalidTransition, match="ml/b"):
        store.apply_changes(bad, db_path=queued)
    assert store.table_digest(queued) == before
    changes = [
        ("ml/a", "planned", AS_OF, "p1"),
        ("ml/a", "planned", T1, "p2"),  # already planned: nothing written
        ("ml/a", "dispatched", T1, "p2"),
        ("ml/b", "dispatched", T1, "p2"),
        ("ml/a", "running", T2, "replay: started"),
    ]
    assert store.apply_changes(changes, source="loop:sync", db_path=queued) == ["ml/a", "ml/a", "ml/b", "ml/a"]
    a, b = stored(queued)["ml/a"], stored(queued)["ml/b"]
    assert (a["state"], a["attempts"], a["state_changed_at"].hour) == ("running", 1, 14)
    assert (b["state"], b["attempts"]) == ("dispatched", 1)
    history = store.show_job("a", tenant="ml", db_path=queued)["history"]
    assert [(h["seq"], h["from_state"], h["to_state"]) for h in history] == [
        (1, None, "queued"),
        (2, "queued", "planned"),
        (3, "planned", "dispatched"),
        (4, "dispatched", "running"),
    ]
    assert history[3]["reason"] == "replay: started" and history[3]["source"] == "loop:sync"
    assert store.apply_changes([], db_path=queued) == []


def test_set_states_inside_the_callers_transaction(queued):
    from warehouse.db import writer

    with writer(queued) as con:
        con.execute("BEGIN TRANSACTION")
        store.set_states(["ml/a"], "planned", at=T1, con=con)
        con.execute("ROLLBACK")
    assert _state(queued, "ml/a") == "queued"
    with writer(queued) as con:
        con.execute("BEGIN TRANSACTION")
        store.set_states(["ml/a"], "planned", at=T1, con=con)
        con.execute("COMMIT")
    assert _state(queued, "ml/a") == "planned"


def test_cancel(queued):
    db = queued
    assert store.cancel_job("a", tenant="ml", at=T1, db_path=db)["state"] == "cancelled"
    store.set_state("ml/b", "dispatched", at=T1, db_path=db)
    out = store.cancel_job("ml/b", at=T2, db_path=db)
    assert out["state"] == "dispatched" and out["cancel_requested_at"].hour == 14 and out["changed"]
    assert not store.cancel_job("ml/b", at=T2, db_path=db)["changed"]  # asked already
    store.set_state("ml/b", "cancelled", at=T2, reason="executor confirmed", db_path=db)  # the executor confirms
    with pytest.raises(InvalidTransition, match="nothing to cancel"):
        store.cancel_job("ml/b", at=T2, db_path=db)
    with pytest.raises(UnknownJob):
        store.cancel_job("ml/zzz", at=T2, db_path=db)
    events = [h["event"] for h in store.show_job("ml/b", db_path=db)["history"]]
    assert events == ["submitted", "state", "cancel_requested", "state"]


def test_list_and_show(queued):
    store.set_state("ml/a", "planned", at=T1, db_path=queued)
    assert list(store.list_jobs(db_path=queued)["job_id"]) == ["a", "b", "c"]
    assert list(store.list_jobs(state="planned", db_path=queued)["job_id"]) == ["a"]
    assert store.list_jobs(tenant="other", db_path=queued).empty
    with pytest.raises(ValueError, match="not one of"):
        store.list_jobs(state="paused", db_path=queued)
    doc = store.show_job("ml/a", db_path=queued)
    assert doc["spec"]["command"] == ["python", "train.py"] and doc["system"]["state"] == "planned"
    assert doc["assignments"] == [] and doc["explanations"] == []
