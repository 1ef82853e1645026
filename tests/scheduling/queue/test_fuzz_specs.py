"""Hypothesis over generated job specs: a job valid by construction lands; a job with one bad field is rejected
naming that field; any mapping at all ends accepted or rejected with fields named, never in an unhandled
exception."""

from __future__ import annotations

import itertools
import os
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.domain.jobs import GAVEL_JOB_TYPES, job_class
from scheduling.queue.intake import submit_mappings
from scheduling.queue.spec import USER_FIELDS
from tests.scheduling.queue.helpers import stored

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
REGIONS = ["us-west", "us-south", "us-east", "us-northeast", "eu-north", "eu-central", "eu-west"]
SUBMITTED = datetime(2021, 7, 15, 12, tzinfo=UTC)
_ids = itertools.count()
# what a command may hold: no control characters, no U+FFFD (the mark of bytes that were not UTF-8)
PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\ufffd")


@st.composite
def valid_jobs(draw) -> dict:
    gpus = draw(st.sampled_from([1, 1, 2, 4, 8]))
    job_type = draw(st.sampled_from(GAVEL_JOB_TYPES))
    job = {
        "tenant": draw(st.sampled_from(["ml", "team-a", "x1"])),
        "job_id": f"v{next(_ids)}",
        "submitted_at": (SUBMITTED + timedelta(minutes=draw(st.integers(0, 600)))).isoformat(),
        "gpus": gpus,
        "gpu_milli": draw(st.integers(1, 1000)) if gpus == 1 else 1000,
        "cpu_milli": draw(st.integers(1, 32000)),
        "memory_mib": draw(st.integers(1, 65536)),
        "job_type": job_type,
        "home_region": draw(st.sampled_from(REGIONS)),
        "input_gb": draw(st.floats(0, 500, allow_nan=False)),
        "checkpoint_interval_min": draw(st.none() | st.integers(1, 600)),
        "max_retries": draw(st.integers(0, 10)),
    }
    if draw(st.booleans()):
        job["workload_class"] = job_class(job_type)
    if draw(st.booleans()):
        job["est_duration_h"] = draw(st.floats(0.1, 48, allow_nan=False))
    when = draw(st.sampled_from(["none", "flexibility", "deadline"]))
    if when == "flexibility":
        job["flexibility"] = draw(st.floats(0, 5, allow_nan=False))
    elif when == "deadline":
        job["deadline"] = (SUBMITTED + timedelta(hours=110)).isoformat()
    if draw(st.booleans()):
        job["image"] = "registry.example/train:latest"
        job["command"] = draw(st.lists(st.text(PRINTABLE, min_size=1, max_size=20), min_size=1, max_size=4))
    return {k: v for k, v in job.items() if v is not None}


# one bad value per field, and the field the error must name
BAD_VALUES = {
    "gpus": [0, -1, 2000, "two", 1.5, True, 16],
    "gpu_milli": [0, 1001, -3, "half"],
    "cpu_milli": [0, "x", 10**9, 1_000_000],
    "memory_mib": [0, -1, 10**12],
    "job_type": ["", "y" * 200, "bad\x00type"],
    "home_region": ["atlantis", "", "us west"],
    "allowed_regions": [["nowhere"], "a|b|c", 5],
    "gpu_models": [["B200"], [""], 7],
    "est_duration_h": [0, -1, 10_000, "long"],
    "deadline": ["tomorrow", "1999-01-01T00:00:00Z"],
    "flexibility": [-0.5, 100, "some"],
    "input_gb": [-1, float("inf"), "much"],
    "max_retries": [-1, 11],
    "checkpoint_interval_min": [0, 10**6],
    "priority_class": ["Not A Label", "x" * 100],
    "image": ["has space", "i" * 600],
    "command": [[], [1.5j], "c\x00"],
    "tenant": ["UPPER", "with/slash", "t" * 64],
    "job_id": ["a/b", "", "-start"],
    "submitted_at": ["noon", 42.5],
    "workload_class": ["audio"],
}


@FUZZ
@given(job=valid_jobs())
def test_valid_jobs_land(tmp_warehouse, facts, job):
    report = submit_mappings([job], source="fuzz", facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == 1, report.to_dict()
    assert f"{job['tenant']}/{job['job_id']}" in stored(tmp_warehouse)


@FUZZ
@given(job=valid_jobs(), data=st.data())
def test_one_bad_field_is_rejected_naming_it(tmp_warehouse, facts, job, data):
    field = data.draw(st.sampled_from(sorted(BAD_VALUES)))
    job[field] = data.draw(st.sampled_from(BAD_VALUES[field]))
    if field == "deadline":
        job.pop("flexibility", None)
    if field == "gpus":  # a GPU count the fleet has no node for, not a share of one GPU on several (gpu_milli's error)
        job.pop("gpu_milli", None)
    report = submit_mappings([job], source="fuzz", facts=facts, db_path=tmp_warehouse)
    assert report.counts["rejected"] == 1, (field, job[field], report.to_dict())
    fields = [e["field"] for e in report.rejected[0].errors]
    assert field in fields or (field in ("home_region", "allowed_regions") and "home_region" in fields), fields
    for e in report.rejected[0].errors:
        assert f"field {e['field']!r}" in e["message"]


ANY_VALUE = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.lists(st.text(max_size=8), max_size=3)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    | st.datetimes(timezones=st.just(UTC))
)


@FUZZ
@given(
    jobs=st.lists(
        st.dictionaries(st.sampled_from([*USER_FIELDS, "state", "zz"]), ANY_VALUE, max_size=12) | ANY_VALUE,
        min_size=1,
        max_size=4,
    )
)
def test_any_input_ends_accepted_or_rejected_with_a_field(tmp_warehouse, facts, jobs):
    report = submit_mappings(jobs, source="fuzz", facts=facts, db_path=tmp_warehouse, as_of="2021-07-15T12:00Z")
    assert len(report.outcomes) == len(jobs)
    for outcome, job in zip(report.outcomes, jobs):
        assert outcome.status in ("accepted", "unchanged", "rejected")
        if outcome.status == "rejected":
            assert outcome.errors
            for e in outcome.errors:
                assert e["field"] is not None or not isinstance(job, dict)
                assert e["message"]


@pytest.mark.parametrize("field", sorted(BAD_VALUES))
def test_every_field_has_bad_values(field):
    assert field in USER_FIELDS and BAD_VALUES[field]
