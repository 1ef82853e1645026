"""The job-file readers: the same jobs as YAML, JSON (both shapes) and CSV parse to the same specs; whole-file
errors name the file and line; entries that cannot be a job are rejected one by one."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from scheduling.queue.files import JobFileError, read_job_file
from scheduling.queue.intake import submit_file
from scheduling.queue.spec import parse_job
from tests.scheduling.queue.helpers import good_job, quarantine, stored, write_yaml

JOBS = [
    good_job(job_id="a"),
    good_job(
        job_id="b",
        gpus=1,
        gpu_milli=250,
        gpu_models=["T4", "A10"],
        allowed_regions=["us-south", "us-west"],
        home_region="us-south",
        command="python a.py | tee log",
        checkpoint_interval_min=15,
    ),
    good_job(
        job_id="c",
        flexibility=None,
        deadline="2021-07-16T00:00:00Z",
        script="#!/bin/bash\nsrun x",
        image=None,
        command=None,
        max_retries=2,
        priority_class="high",
    ),
]


def _csv(path, jobs):
    columns = sorted({k for j in jobs for k in j})
    with open(path, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(columns)
        for j in jobs:
            row = []
            for c in columns:
                v = j.get(c)
                if isinstance(v, list) and c in ("gpu_models", "allowed_regions"):
                    v = "|".join(v)
                elif isinstance(v, list):  # a command list has no CSV form: one shell string instead
                    v = " ".join(v)
                row.append("" if v is None else v)
            w.writerow(row)
    return path


def _specs(path):
    return [parse_job(r.data, where=r.where) for r in read_job_file(path)]


def test_yaml_json_and_csv_give_the_same_specs(tmp_path):
    y = _specs(write_yaml(tmp_path / "j.yaml", JOBS))
    (tmp_path / "list.json").write_text(json.dumps(JOBS))
    (tmp_path / "obj.json").write_text(json.dumps({"jobs": JOBS}))
    assert _specs(tmp_path / "list.json") == y == _specs(tmp_path / "obj.json")
    c = _specs(_csv(tmp_path / "j.csv", JOBS))
    # CSV: lists as a|b, a command is one string; everything else parses to the same values
    assert [s.spec_hash() for s in c[1:]] == [s.spec_hash() for s in y[1:]]
    assert c[0].command == "python train.py" and y[0].command == ("python", "train.py")
    assert y[1].gpu_models == ("A10", "T4") and y[1].allowed_regions == ("us-south", "us-west")
    assert y[1].command == "python a.py | tee log"


def test_row_numbers_are_lines_for_yaml_and_csv_positions_for_json(tmp_path):
    y = read_job_file(write_yaml(tmp_path / "j.yaml", JOBS))
    text = (tmp_path / "j.yaml").read_text().splitlines()
    assert [text[r.row_number - 1].startswith("- ") for r in y] == [True] * 3
    c = read_job_file(_csv(tmp_path / "j.csv", JOBS))
    assert [r.row_number for r in c] == [2, 3, 4]
    (tmp_path / "j.json").write_text(json.dumps(JOBS))
    assert [r.row_number for r in read_job_file(tmp_path / "j.json")] == [1, 2, 3]


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("j.txt", "jobs: []", "unknown job file type"),
        ("j.yaml", "jobs: [\n  {a: 1", "not valid YAML"),
        ("j.yaml", "- a: 1\n", "top level must be a mapping"),
        ("j.yaml", "job: []\n", "no top-level `jobs:` list"),
        ("j.yaml", "jobs: {a: 1}\n", "must be a list"),
        ("j.yaml", "jobs: []\nextra: 1\n", "unknown top-level key"),
        ("j.yaml", "jobs: []\n---\njobs: []\n", "one YAML document"),
        ("j.json", '{"jobs": [', "line 1: not valid JSON"),
        ("j.json", '{"job": []}', "needs a `jobs` list"),
        ("j.json", '"x"', "expected a list of jobs"),
        ("j.csv", "", "empty CSV"),
        ("j.csv", "job_id,job_id\n1,2\n", "duplicate column"),
    ],
)
def test_whole_file_errors_name_the_file(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(JobFileError) as err:
        read_job_file(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(JobFileError, match="no such file"):
        read_job_file(tmp_path / "nope.yaml")


def test_entries_that_cannot_be_jobs_are_rejected_one_by_one(tmp_warehouse, tmp_path, facts):
    path = tmp_path / "j.yaml"
    ok = yaml.safe_dump({"jobs": [good_job(job_id="ok")]})
    path.write_text(ok + "- just a string\n- tenant: ml\n  job_id: dup\n  gpus: 1\n  gpus: 2\n")
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert [o.status for o in report.outcomes] == ["accepted", "rejected", "rejected"]
    assert "mapping" in report.outcomes[1].errors[0]["reason"]
    assert "given more than once" in report.outcomes[2].errors[0]["reason"]
    assert set(stored(tmp_warehouse)) == {"ml/ok"} and len(quarantine(tmp_warehouse)) == 2
    (tmp_path / "d.json").write_text('[{"tenant": "ml", "job_id": "x", "job_id": "y"}]')
    report = submit_file(tmp_path / "d.json", facts=facts, db_path=tmp_warehouse)
    assert "given more than once" in report.rejected[0].errors[0]["reason"]


def test_csv_row_with_the_wrong_number_of_cells(tmp_warehouse, tmp_path, facts):
    path = _csv(tmp_path / "j.csv", JOBS[:1])
    path.write_text(path.read_text() + "too,few\n")
    report = submit_file(path, facts=facts, db_path=tmp_warehouse)
    assert [o.status for o in report.outcomes] == ["accepted", "rejected"]
    assert report.rejected[0].row_number == 3 and "cells" in report.rejected[0].errors[0]["reason"]
