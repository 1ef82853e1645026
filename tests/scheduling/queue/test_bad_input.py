"""Every kind of bad job, by hand: the job is rejected with an error naming the job and the field, a quarantine row
holds the reason, the good job of the same file lands, and nothing stored before is lost."""

from __future__ import annotations

import json

import pytest

from scheduling.queue.intake import submit_file
from tests.scheduling.queue.helpers import AS_OF, good_job, quarantine, stored, write_yaml

LONG = "x" * 70_000
BAD = [
    # (id, fields of the bad job, the field the error must name)
    ("zero-gpus", {"gpus": 0}, "gpus"),
    ("negative-gpus", {"gpus": -2}, "gpus"),
    ("gpu-milli-zero", {"gpu_milli": 0}, "gpu_milli"),
    ("gpu-milli-over", {"gpu_milli": 1001}, "gpu_milli"),
    ("share-of-two-gpus", {"gpus": 2, "gpu_milli": 500}, "gpu_milli"),
    ("more-gpus-than-any-node", {"gpus": 16}, "gpus"),
    ("more-cpu-than-any-node", {"cpu_milli": 1_000_000}, "cpu_milli"),
    ("more-memory-than-any-node", {"memory_mib": 8_000_000}, "memory_mib"),
    ("deadline-before-submission", {"flexibility": None, "deadline": "2021-07-15T11:00:00Z"}, "deadline"),
    ("deadline-shorter-than-fastest-run", {"flexibility": None, "deadline": "2021-07-15T12:30:00Z"}, "deadline"),
    ("deadline-and-flexibility", {"deadline": "2021-07-16T00:00:00Z"}, "flexibility"),
    ("unknown-home-region", {"home_region": "mars-1"}, "home_region"),
    ("unknown-allowed-region", {"allowed_regions": ["us-west", "moon"]}, "allowed_regions"),
    ("home-outside-allowed", {"allowed_regions": ["eu-north"]}, "home_region"),
    ("gpu-model-nobody-has", {"gpu_models": ["B200"]}, "gpu_models"),
    (
        "no-node-in-allowed-regions",
        {"gpus": 8, "allowed_regions": ["us-south"], "home_region": "us-south"},
        "allowed_regions",
    ),
    ("huge-job-type", {"job_type": LONG}, "job_type"),
    ("huge-command", {"command": ["python", LONG]}, "command"),
    ("image-with-spaces", {"image": "my image"}, "image"),
    ("control-character-in-id", {"job_id": "a\x07b"}, "job_id"),
    ("slash-in-job-id", {"job_id": "a/b"}, "job_id"),
    ("missing-cpu", {"cpu_milli": None}, "cpu_milli"),
    ("not-a-number", {"memory_mib": "lots"}, "memory_mib"),
    ("boolean-gpus", {"gpus": True}, "gpus"),
    ("bad-time", {"submitted_at": "yesterday"}, "submitted_at"),
    ("year-3000", {"submitted_at": "3000-01-01T00:00:00Z"}, "submitted_at"),
    ("unknown-field", {"deadine": "2021-07-16T00:00:00Z"}, "deadine"),
    ("system-column", {"state": "running"}, "state"),
    ("wrong-class-for-known-type", {"workload_class": "language"}, "workload_class"),
    ("unknown-type-without-class", {"job_type": "Mystery (batch size 1)"}, "workload_class"),
    ("bad-tenant", {"tenant": "ML Team"}, "tenant"),
    ("negative-input", {"input_gb": -1}, "input_gb"),
    ("too-many-retries", {"max_retries": 99}, "max_retries"),
    ("deadline-not-a-time", {"flexibility": None, "deadline": "soon"}, "deadline"),
    ("zero-duration", {"est_duration_h": 0}, "est_duration_h"),
    # a NaN or an infinity is a value that is not a number, never "not given" (no estimate stands in for it)
    ("nan-duration", {"est_duration_h": float("nan")}, "est_duration_h"),
    ("inf-duration", {"est_duration_h": float("inf")}, "est_duration_h"),
    ("nan-flexibility", {"flexibility": float("nan")}, "flexibility"),
    ("nan-input", {"input_gb": float("nan")}, "input_gb"),
    ("nan-gpus", {"gpus": float("nan")}, "gpus"),
    ("nan-gpu-milli", {"gpu_milli": float("nan")}, "gpu_milli"),
    ("inf-cpu", {"cpu_milli": float("inf")}, "cpu_milli"),
    ("nan-memory", {"memory_mib": float("nan")}, "memory_mib"),
    ("nan-checkpoint-interval", {"checkpoint_interval_min": float("nan")}, "checkpoint_interval_min"),
    ("nan-retries", {"max_retries": float("-inf")}, "max_retries"),
    ("nan-deadline", {"flexibility": None, "deadline": float("nan")}, "deadline"),
    (
        "checkpoint-overhead-over",
        {"checkpoint_interval_min": 30, "checkpoint_overhead_min": 121},
        "checkpoint_overhead_min",
    ),
    (
        "negative-checkpoint-overhead",
        {"checkpoint_interval_min": 30, "checkpoint_overhead_min": -1},
        "checkpoint_overhead_min",
    ),
    ("overhead-without-checkpoints", {"checkpoint_overhead_min": 3}, "checkpoint_overhead_min"),
    ("too-many-preemptions", {"checkpoint_interval_min": 30, "max_preemptions": 21}, "max_preemptions"),
    ("preemption-cap-without-checkpoints", {"max_preemptions": 1}, "max_preemptions"),
]


@pytest.mark.parametrize("over, field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_job_is_rejected_naming_job_and_field_and_quarantined(tmp_warehouse, tmp_path, facts, over, field):
    path = write_yaml(tmp_path / "jobs.yaml", [good_job(job_id="ok"), good_job(**{"job_id": "bad", **over})])
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == 1 and report.counts["rejected"] == 1, report.to_dict()
    (rejected,) = report.rejected
    fields = [e["field"] for e in rejected.errors]
    assert field in fields, rejected.errors
    message = next(e["message"] for e in rejected.errors if e["field"] == field)
    assert f"field {field!r}" in message and str(path) in message and "line " in message
    if field not in ("tenant", "job_id"):
        assert "job 'ml/bad'" in message
    assert rejected.row_number > 2 and rejected.where.endswith(f"line {rejected.row_number}")
    rows = [r for r in quarantine(tmp_warehouse) if r["field"] == field]
    assert rows and rows[0]["reason"] == message and rows[0]["file"] == str(path)
    assert rows[0]["row_number"] == rejected.row_number and rows[0]["record"]
    assert set(stored(tmp_warehouse)) == {"ml/ok"}


def test_every_bad_field_of_one_job_is_reported(tmp_warehouse, tmp_path, facts):
    path = write_yaml(tmp_path / "jobs.yaml", [good_job(gpus=0, gpu_milli=2000, memory_mib="x")])
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert sorted(e["field"] for e in report.rejected[0].errors) == ["gpu_milli", "gpus", "memory_mib"]
    assert sorted(r["field"] for r in quarantine(tmp_warehouse)) == ["gpu_milli", "gpus", "memory_mib"]


def test_unknown_job_type_is_accepted_flagged_and_planned_as_its_class(tmp_warehouse, tmp_path, facts, fleet):
    from scheduling.queue.frame import pending_job_frame

    job = good_job(job_type="BERT-large (batch size 32)", workload_class="language")
    report = submit_file(write_yaml(tmp_path / "j.yaml", [job]), facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == 1 and report.outcomes[0].flags == ["unknown_job_type"]
    row = stored(tmp_warehouse)["ml/j1"]
    assert row["flags"] == ["unknown_job_type"] and row["job_type"] == "BERT-large (batch size 32)"
    frame = pending_job_frame(AS_OF, fleet, db_path=tmp_warehouse)
    assert frame.loc[0, "job_type"] == "Transformer (batch size 64)"
    assert frame.loc[0, "job_type_submitted"] == "BERT-large (batch size 32)"
    assert quarantine(tmp_warehouse) == []


def test_non_utf8_bytes_reject_the_field_not_the_file(tmp_warehouse, tmp_path, facts):
    path = write_yaml(tmp_path / "jobs.yaml", [good_job(job_id="ok"), good_job(job_id="bad", job_type="PLACEHOLDER")])
    path.write_bytes(path.read_bytes().replace(b"PLACEHOLDER", b"ResNet \xff\xfe"))
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert report.counts == {"accepted": 1, "unchanged": 0, "replaced": 0, "rejected": 1}
    (error,) = report.rejected[0].errors
    assert error["field"] == "job_type" and "UTF-8" in error["reason"] and "'ml/bad'" in error["message"]
    assert quarantine(tmp_warehouse)[0]["field"] == "job_type"


def test_duplicate_ids_in_one_file_reject_every_occurrence(tmp_warehouse, tmp_path, facts):
    jobs = [good_job(job_id="ok"), good_job(job_id="twice"), good_job(job_id="twice", gpus=2)]
    report = submit_file(write_yaml(tmp_path / "jobs.yaml", jobs), facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == 1 and report.counts["rejected"] == 2
    for outcome in report.rejected:
        assert outcome.job == "ml/twice"
        assert outcome.errors[0]["field"] == "job_id" and "appears 2 times" in outcome.errors[0]["reason"]
    assert set(stored(tmp_warehouse)) == {"ml/ok"}
    assert [r["field"] for r in quarantine(tmp_warehouse)] == ["job_id", "job_id"]


def test_a_bad_submission_loses_nothing_stored(tmp_warehouse, tmp_path, facts):
    submit_file(write_yaml(tmp_path / "a.yaml", [good_job(job_id="keep")]), facts=facts, db_path=tmp_warehouse)
    before = stored(tmp_warehouse)
    report = submit_file(
        write_yaml(tmp_path / "b.yaml", [good_job(job_id="keep", gpus=0), good_job(job_id="keep", gpus=2)]),
        facts=facts,
        db_path=tmp_warehouse,
    )
    assert report.counts["rejected"] == 2
    assert stored(tmp_warehouse) == before


def test_missing_submission_time_needs_as_of(tmp_warehouse, tmp_path, facts):
    path = write_yaml(tmp_path / "jobs.yaml", [good_job(submitted_at=None)])
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert report.rejected[0].errors[0]["field"] == "submitted_at"
    report = submit_file(path, facts=facts, db_path=tmp_warehouse, as_of=AS_OF)
    assert report.counts["accepted"] == 1
    assert stored(tmp_warehouse)["ml/j1"]["submitted_at"].isoformat() == "2021-07-15T12:00:00+00:00"


def test_tenant_of_the_submission(tmp_warehouse, tmp_path, facts):
    jobs = [good_job(job_id="a", tenant=None), good_job(job_id="b", tenant="other"), good_job(job_id="c")]
    report = submit_file(write_yaml(tmp_path / "j.yaml", jobs), facts=facts, db_path=tmp_warehouse, tenant="ml")
    assert [o.status for o in report.outcomes] == ["accepted", "rejected", "accepted"]
    assert report.outcomes[1].errors[0]["field"] == "tenant"
    report = submit_file(write_yaml(tmp_path / "k.yaml", [good_job(tenant=None)]), facts=facts, db_path=tmp_warehouse)
    assert report.rejected[0].errors[0]["field"] == "tenant" and "required" in report.rejected[0].errors[0]["reason"]


@pytest.mark.parametrize("fmt", ["yaml", "json", "csv"])
def test_a_nan_run_time_is_rejected_not_estimated(tmp_warehouse, tmp_path, facts, fmt):
    """`est_duration_h: .nan` (YAML), `NaN` (JSON) or `nan` (CSV) is a bad value of the field: the job is
    quarantined naming it, and no estimate of the run time stands in for it."""
    job = good_job(job_id="nan-run")
    if fmt == "yaml":
        path = write_yaml(tmp_path / "jobs.yaml", [job])
        path.write_text(path.read_text().replace("est_duration_h: 4.0", "est_duration_h: .nan"))
    elif fmt == "json":
        path = tmp_path / "jobs.json"
        path.write_text(json.dumps([{**job, "est_duration_h": float("nan")}]))
    else:
        path = tmp_path / "jobs.csv"
        row = {**job, "est_duration_h": "nan", "command": "python train.py"}
        path.write_text(",".join(row) + "\n" + ",".join(str(v) for v in row.values()) + "\n")
    assert "nan" in path.read_text().lower()
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == 0 and report.counts["rejected"] == 1, report.to_dict()
    (error,) = report.rejected[0].errors
    assert error["field"] == "est_duration_h" and "finite" in error["reason"]
    assert "'ml/nan-run'" in error["message"] and str(path) in error["message"]
    (row,) = quarantine(tmp_warehouse)
    assert row["field"] == "est_duration_h" and row["reason"] == error["message"]
    assert stored(tmp_warehouse) == {}
