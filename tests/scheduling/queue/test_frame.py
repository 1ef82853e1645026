"""Queued jobs -> the planner's job frame: run times, deadlines and home clusters as documented
(scheduling/queue/estimate.py, docs/data-contracts.md "Job queue"), and a job with allowed_regions is never planned
outside them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scheduling.domain.jobs import JOB_COLUMNS, SpeedModel, hostable, read_philly, validate_jobs
from scheduling.queue.estimate import DEFAULT_FLEXIBILITY, planner_job_type, spec_frame
from scheduling.queue.frame import EXECUTOR_COLUMNS, job_frame, pending_job_frame
from scheduling.queue.intake import submit_file, submit_mappings
from scheduling.queue.spec import parse_job
from scheduling.queue.trace import trace_jobs
from tests.scheduling.queue.helpers import AS_OF, good_job, write_yaml

SUB = pd.Timestamp("2021-07-15T11:30:00Z")


def _frame(fleet, data_dir, **over):
    return job_frame([parse_job(good_job(**over))], fleet, data_dir=data_dir)


def _speed(fleet, data_dir, job_type, cluster):
    return SpeedModel(data_dir).speed(job_type, fleet.model_of(fleet.index(cluster)))


def test_columns_and_identity(fleet, data_dir):
    f = _frame(fleet, data_dir, gpu_models=["V100M32", "V100M16"], checkpoint_interval_min=30, priority_class="high")
    assert list(f.columns) == list(JOB_COLUMNS) + list(EXECUTOR_COLUMNS)
    validate_jobs(f)
    r = f.iloc[0]
    assert r.job_id == "ml/j1" and r.tenant == "ml" and r.queue_job_id == "j1"
    assert r.submit_time == pd.Timestamp("2021-07-15T11:00Z") and r.submitted_at == SUB
    assert r.gpu_spec == "V100M16|V100M32" and r.num_gpu == 1 and r.gpu_milli == 1000
    assert bool(r.checkpointing) and r.checkpoint_interval_min == 30 and r.qos == "high"
    assert r.data_gb == 20.0 and r.home_cluster == "usw-v100m16" and r.allowed_regions == ""
    assert r.image == "registry.example/train:latest" and r.command == '["python", "train.py"]'


def test_run_time_given_is_on_the_home_cluster(fleet, data_dir):
    # us-east: P100 (Gavel p100 speeds), so the V100 reference differs from the given run time
    f = _frame(fleet, data_dir, home_region="us-east", est_duration_h=5.0)
    speed = _speed(fleet, data_dir, "ResNet-50 (batch size 64)", "use-p100")
    assert speed < 1.0
    r = f.iloc[0]
    assert r.home_cluster == "use-p100"
    assert r.duration_h_home == pytest.approx(5.0) and r.duration_h_ref == pytest.approx(5.0 * speed)
    assert r.deadline == SUB + pd.Timedelta(hours=5.0 * 1.5)
    assert r.flexibility == pytest.approx(0.5)


def test_home_region_that_cannot_host_the_job(fleet, data_dir):
    # 4 GPUs: us-east's P100 nodes have 2; the region's cluster stays the home (its grid prices the transfer), the
    # run time is read on the fastest cluster that can host the job
    f = _frame(fleet, data_dir, home_region="us-east", gpus=4, est_duration_h=5.0)
    r = f.iloc[0]
    assert r.home_cluster == "use-p100"
    assert r.duration_h_home == pytest.approx(5.0)


def test_run_time_estimated_from_the_philly_profile(fleet, data_dir):
    philly = read_philly(data_dir)
    for gpus, milli, bucket in ((1, 500, 1), (2, 1000, 2), (3, 1000, 4), (8, 1000, 8)):
        f = _frame(fleet, data_dir, est_duration_h=None, gpus=gpus, gpu_milli=milli, home_region="us-northeast")
        expected = np.clip(philly.loc[philly.num_gpus == bucket, "duration_s"].median() / 3600, 1, 48)
        assert f.loc[0, "duration_h_ref"] == pytest.approx(expected)
        assert f.loc[0, "duration_h_home"] == pytest.approx(expected)  # V100M32: the reference speed


def test_deadline_rules(fleet, data_dir):
    # an absolute deadline: kept; flexibility derived from it
    f = _frame(fleet, data_dir, flexibility=None, deadline="2021-07-15T23:30:00Z", est_duration_h=4.0)
    assert f.loc[0, "deadline"] == pd.Timestamp("2021-07-15T23:30Z")
    assert f.loc[0, "flexibility"] == pytest.approx(12.0 / 4.0 - 1.0)
    # neither: the class default (vision 0.40)
    f = _frame(fleet, data_dir, flexibility=None, est_duration_h=4.0)
    assert DEFAULT_FLEXIBILITY["vision"] == pytest.approx(0.40)
    assert f.loc[0, "flexibility"] == pytest.approx(0.40)
    assert f.loc[0, "deadline"] == SUB + pd.Timedelta(hours=4.0 * 1.4)


def test_unknown_job_type_uses_the_class_profile(fleet, data_dir):
    f = _frame(fleet, data_dir, job_type="MyNet (batch size 7)", workload_class="rl")
    assert f.loc[0, "job_type"] == planner_job_type("MyNet (batch size 7)", "rl") == "A3C"
    assert f.loc[0, "job_type_submitted"] == "MyNet (batch size 7)"


def test_the_trace_demo_jobs_keep_their_durations_and_deadlines(fleet, data_dir, tmp_warehouse, facts):
    """Trace jobs fed through the intake come out with the generator's run times and deadlines."""
    from scheduling.domain.jobs import generate_jobs

    jobs = trace_jobs("2021-07-15", 40, fleet, data_dir=data_dir)
    report = submit_mappings(jobs, source="test", facts=facts, db_path=tmp_warehouse)
    assert report.counts["accepted"] == len(jobs), report.rejected[:1]
    frame = pending_job_frame("2021-07-16T00:00Z", fleet, db_path=tmp_warehouse, data_dir=data_dir)
    trace = generate_jobs(40, pd.Timestamp("2021-07-15", tz="UTC"), 24, fleet, seed=20210715, data_dir=data_dir)
    trace["job_id"] = "demo/20210715-" + trace["job_id"]
    merged = frame.merge(trace, on="job_id", suffixes=("", "_trace"))
    assert len(merged) == len(trace)
    assert np.allclose(merged["duration_h_ref"], merged["duration_h_ref_trace"], rtol=1e-4)
    assert (abs(merged["deadline"] - merged["deadline_trace"]) <= pd.Timedelta(seconds=1)).all()
    assert (merged["submit_time"] == merged["submit_time_trace"]).all()
    assert (merged["home_cluster"] == merged["home_cluster_trace"]).all()


def test_pending_frame_selects_queued_and_planned_jobs_submitted_by_as_of(
    fleet, data_dir, tmp_warehouse, facts, tmp_path
):
    from scheduling.queue import store

    jobs = [
        good_job(job_id=j, submitted_at=t)
        for j, t in (
            ("a", "2021-07-15T10:00Z"),
            ("b", "2021-07-15T11:00Z"),
            ("c", "2021-07-15T12:00Z"),
            ("d", "2021-07-15T13:00Z"),
        )
    ]
    submit_file(write_yaml(tmp_path / "j.yaml", jobs), facts=facts, db_path=tmp_warehouse)
    store.set_state("ml/a", "planned", at="2021-07-15T11:00Z", db_path=tmp_warehouse)
    store.set_state("ml/b", "cancelled", at="2021-07-15T11:00Z", db_path=tmp_warehouse)
    frame = pending_job_frame(AS_OF, fleet, db_path=tmp_warehouse, data_dir=data_dir)
    assert list(frame["job_id"]) == ["ml/a", "ml/c"] and list(frame["state"]) == ["planned", "queued"]
    empty = pending_job_frame(AS_OF, fleet, db_path=tmp_path / "none.duckdb")
    assert empty.empty and list(empty.columns) == list(JOB_COLUMNS) + list(EXECUTOR_COLUMNS)


@pytest.mark.parametrize("policy", ["priority", "rolling-lp", "greedy-carbon"])
def test_a_job_is_never_planned_outside_its_allowed_regions(fleet, data_dir, tmp_warehouse, facts, policy):
    from scheduling.planning.session import plan_hour

    plan_fleet = fleet.select(6)  # the six regions with forecasts
    rng = np.random.default_rng(5)
    jobs = trace_jobs("2021-07-15", 60, plan_fleet, data_dir=data_dir)
    host = hostable(spec_frame([parse_job(j) for j in jobs]), plan_fleet)
    names = np.array(plan_fleet.cluster_regions, dtype=object)
    for i, job in enumerate(jobs):
        if i % 3 == 2:
            continue  # a third may run anywhere
        # residency in one or two of the regions that can host the job, the home among them
        can = sorted(set(names[host[i]]))
        allowed = sorted(set(rng.choice(can, size=min(len(can), 1 + i % 2), replace=False)))
        job.update(allowed_regions=allowed, home_region=allowed[0], flexibility=2.0)
        job.pop("deadline")
    report = submit_mappings(jobs, source="test", facts=facts, db_path=tmp_warehouse, as_of=AS_OF)
    assert report.counts["rejected"] == 0, report.rejected[:1]
    frame = pending_job_frame("2021-07-15T23:00Z", plan_fleet, db_path=tmp_warehouse, data_dir=data_dir)
    frame["submit_time"] = pd.Timestamp(AS_OF)  # all pending at the plan time
    plan = plan_hour(AS_OF, frame, fleet=plan_fleet, policy=policy, forecasts="naive", data_dir=data_dir)
    a = plan.assignments
    assert len(a) > 10
    allowed = dict(zip(frame["job_id"], frame["allowed_regions"]))
    for job_id, region in zip(a["job_id"], a["region"]):
        assert not allowed[job_id] or region in allowed[job_id].split("|"), (job_id, region, allowed[job_id])
    restricted = [j for j, r in allowed.items() if r]
    assert set(a["job_id"]) & set(restricted)  # restricted jobs do get planned (inside their regions)
