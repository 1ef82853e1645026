"""`python -m scheduling jobs ...`: submit the documented example, list, show (with the plan decisions about a job),
cancel, staging intake and the trace demo file; JSON on stdout only, exit codes as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from scheduling.cli import main
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "docs" / "examples" / "jobs.yaml"


def _run(*args, env_db=None, cwd=REPO_ROOT):
    env = None
    if env_db is not None:
        env = {**os.environ, "WAREHOUSE_PATH": str(env_db), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "scheduling", "jobs", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_submit_the_example_then_list_show_cancel(tmp_warehouse, data_dir):
    out = _run("submit", EXAMPLE, "--json", env_db=tmp_warehouse)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["counts"] == {"accepted": 10, "unchanged": 0, "replaced": 0, "rejected": 0}
    flags = {j["job"]: j["flags"] for j in report["jobs"]}
    assert flags["nlp/bert-i"] == ["unknown_job_type"]
    assert flags["ml-team/lm-c"] == ["default_deadline", "estimated_duration"]

    again = _run("submit", EXAMPLE, env_db=tmp_warehouse)  # the readable table
    assert again.returncode == 0 and "unchanged 10" in again.stdout and "ml-team/resnet50-a" in again.stdout

    listed = _run("list", "--json", env_db=tmp_warehouse)
    jobs = json.loads(listed.stdout)["jobs"]
    assert len(jobs) == 10 and {j["state"] for j in jobs} == {"queued"}
    table = _run("list", "--tenant", "recsys", env_db=tmp_warehouse)
    assert table.returncode == 0 and "recsys/rec-d" in table.stdout and "2 job(s)" in table.stdout

    show = _run("show", "rec-e", "--tenant", "recsys", "--json", env_db=tmp_warehouse)
    doc = json.loads(show.stdout)
    assert doc["job"] == "recsys/rec-e" and doc["spec"]["allowed_regions"] == ["eu-central", "eu-north", "eu-west"]
    assert doc["spec"]["script"].startswith("#!/bin/bash") and doc["history"][0]["event"] == "submitted"

    cancel = _run("cancel", "recsys/rec-e", "--as-of", "2021-07-15T12:30Z", env_db=tmp_warehouse)
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout
    again = _run("cancel", "recsys/rec-e", env_db=tmp_warehouse)
    assert again.returncode == 2 and "nothing to cancel" in again.stderr and again.stdout == ""
    missing = _run("show", "nope", env_db=tmp_warehouse)
    assert missing.returncode == 2 and "no job 'nope'" in missing.stderr


def test_show_lists_every_plan_decision_about_the_job(tmp_warehouse, data_dir, capsys):
    from scheduling.domain.fleet import load_fleet
    from scheduling.output.plan_store import write_plan
    from scheduling.planning.session import plan_hour
    from scheduling.queue.frame import pending_job_frame

    assert main(["jobs", "submit", str(EXAMPLE), "--db", str(tmp_warehouse), "--json"]) == 0
    capsys.readouterr()
    fleet = load_fleet(regions=6, data_dir=data_dir)
    frame = pending_job_frame("2021-07-15T12:00Z", fleet, db_path=tmp_warehouse, data_dir=data_dir)
    plan = plan_hour("2021-07-15T12:00Z", frame, fleet=fleet, policy="priority", forecasts="naive", data_dir=data_dir)
    write_plan(plan, created_from="test", db_path=tmp_warehouse)
    placed = str(plan.assignments["job_id"].iloc[0])
    assert main(["jobs", "show", placed, "--db", str(tmp_warehouse), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["plan_id"] for a in doc["assignments"]] == ["priority@2021-07-15T12:00:00Z"]
    assert doc["explanations"][0]["text"] and doc["explanations"][0]["record"]["job_id"] == placed
    assert main(["jobs", "show", placed, "--db", str(tmp_warehouse)]) == 0
    text = capsys.readouterr().out
    assert "plan decisions (1 assignment(s), 0 unplaced)" in text and "priority@2021-07-15T12:00:00Z" in text


def test_submit_exit_codes_and_json_only_on_stdout(tmp_warehouse, tmp_path, data_dir, capsys):
    bad = tmp_path / "jobs.yaml"
    bad.write_text(
        "jobs:\n  - {tenant: ml, job_id: a, gpus: 0, cpu_milli: 1, memory_mib: 1, job_type: A3C, "
        "home_region: us-west, submitted_at: 2021-07-15T12:00:00Z}\n"
    )
    assert main(["jobs", "submit", str(bad), "--db", str(tmp_warehouse), "--json"]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["counts"]["rejected"] == 1 and doc["jobs"][0]["errors"][0]["field"] == "gpus"
    assert main(["jobs", "submit", str(tmp_path / "missing.yaml"), "--db", str(tmp_warehouse)]) == 2
    assert "no such file" in capsys.readouterr().err
    nowhen = tmp_path / "nowhen.json"
    nowhen.write_text(
        '[{"tenant": "ml", "job_id": "b", "gpus": 1, "cpu_milli": 1, "memory_mib": 1, '
        '"job_type": "A3C", "home_region": "us-west"}]'
    )
    assert main(["jobs", "submit", str(nowhen), "--db", str(tmp_warehouse)]) == 1
    assert "submitted_at: is required" in capsys.readouterr().out
    assert main(["jobs", "submit", str(nowhen), "--db", str(tmp_warehouse), "--as-of", "2021-07-15T12:00Z"]) == 0


def test_intake_staging_command(tmp_warehouse, data_dir, capsys):
    import duckdb

    assert main(["jobs", "intake-staging", "--db", str(tmp_warehouse)]) == 0  # creates the tables
    capsys.readouterr()
    with duckdb.connect(str(tmp_warehouse)) as con:
        con.execute(
            "INSERT INTO queue.submissions (tenant, job_id, gpus, cpu_milli, memory_mib, job_type, home_region) "
            "VALUES ('ml', 's1', 1, 4000, 16384, 'A3C', 'eu-north')"
        )
    assert main(["jobs", "intake-staging", "--db", str(tmp_warehouse), "--as-of", "2021-07-15T12:00Z", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["accepted"] == 1


def test_from_trace_writes_a_file_the_intake_accepts(tmp_warehouse, tmp_path, data_dir, capsys):
    n = 12
    out = tmp_path / "demo.yaml"
    assert main(["jobs", "from-trace", "--day", "2021-07-15", "--n", str(n), "--out", str(out), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["jobs"] == n and meta["seed"] == 20210715 and out.exists()
    jobs = yaml.safe_load(out.read_text())["jobs"]
    assert {j["tenant"] for j in jobs} == {"demo"} and all(j["image"] == "registry.example/train:latest" for j in jobs)
    assert all(j["job_id"].startswith("20210715-job-") and j["deadline"] > j["submitted_at"] for j in jobs)
    assert main(["jobs", "submit", str(out), "--db", str(tmp_warehouse), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["accepted"] == n
    assert main(["jobs", "from-trace", "--day", "2021-07-15", "--n", "0", "--out", str(out)]) == 2
