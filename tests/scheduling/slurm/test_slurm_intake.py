"""The Slurm intake convention on squeue records (no Slurm needed): which jobs are the planner's, and each as a
queue submission."""

from __future__ import annotations

import pandas as pd

from scheduling.executors.clock import PlanClock
from scheduling.executors.slurm_intake import (
    comment_words,
    gpus_of,
    is_held,
    is_marked,
    latest_wall_start,
    planner_id,
    script_of,
    submission_of,
)
from scheduling.queue.spec import parse_job

WALL = pd.Timestamp("2026-11-26T08:00:00Z")


def _job(**over) -> dict:
    job = {
        "job_id": 42, "name": "train", "cluster": "hpc", "user_name": "Ada.L", "partition": "gpu",
        "job_state": "PENDING", "state_reason": "JobHeldUser", "tres_per_node": "gres:gpu:2", "cpus": 8,
        "memory_per_node": 4096, "time_limit": 120, "submit_time": int(WALL.timestamp()),
        "deadline": int((WALL + pd.Timedelta(hours=10)).timestamp()), "current_working_directory": "/home/ada",
        "comment": "carbon-aware job_type='ResNet-50 (batch size 64)' allowed_regions=us-west|eu-north",
    }  # fmt: skip
    return {**job, **over}


def test_only_held_marked_user_jobs_are_imported():
    assert is_marked(_job()) and is_held(_job())
    assert not is_marked(_job(comment="carbon aware"))  # the first word is the mark
    assert not is_marked(_job(name="cp|rolling-lp@2021-07-15T12:00:00Z|a/b|1|c"))  # the executor's own job
    assert not is_held(_job(state_reason="Resources")) and not is_held(_job(job_state="RUNNING"))
    assert comment_words("carbon-aware job_type='a b") == ["carbon-aware", "job_type='a", "b"]  # bad quotes: as typed


def test_a_held_job_becomes_a_submission_the_queue_accepts():
    clock = PlanClock.from_settings("2021-07-15T12:00Z", WALL, 60)  # a plan hour per wall minute
    job = _job()
    out = submission_of(job, "#!/bin/bash\n#SBATCH --hold\n#SBATCH -H\nsrun python train.py\n", 0, clock)
    assert planner_id(job) == "ada-l/hpc-42"
    assert out["tenant"] == "ada-l" and out["job_id"] == "hpc-42"
    assert (out["gpus"], out["gpu_milli"], out["cpu_milli"], out["memory_mib"]) == (2, 1000, 8000, 4096)
    assert (
        out["submitted_at"] == "2021-07-15T12:00:00Z" and out["deadline"] == "2021-08-09T12:00:00Z"
    )  # 600 plan hours on
    assert out["est_duration_h"] == 120.0  # the time limit in plan hours (120 wall minutes)
    assert out["script"] == "#!/bin/bash\n#SBATCH --chdir=/home/ada\nsrun python train.py\n"
    spec = parse_job({**out, "home_region": "us-west"})
    assert spec.allowed_regions == ("eu-north", "us-west") and spec.job_type == "ResNet-50 (batch size 64)"


def test_shards_are_a_share_of_one_gpu_and_slurm_fields_win_over_the_comment():
    assert gpus_of(_job(tres_per_node="gres:shard:3"), 8) == (1, 375)
    assert gpus_of(_job(tres_per_node="gres:shard:3"), 0) == (0, 1000)  # no shards configured: no GPUs (refused)
    assert gpus_of(_job(tres_per_node=None), 8) == (0, 1000)
    job = _job(comment="carbon-aware gpus=64 tenant=ml est_duration_h=1.5")
    out = submission_of(job, "#!/bin/sh\n", 8, PlanClock())
    assert (out["gpus"], out["tenant"], out["est_duration_h"]) == (2, "ml", "1.5")
    assert script_of("true", {}) == "true\n"


def test_an_adopted_job_starts_by_the_earlier_of_the_planners_and_slurms_latest_start():
    clock = PlanClock()
    job = _job()  # deadline WALL + 10 h, time limit 2 h: Slurm's latest start WALL + 8 h
    assert latest_wall_start(job, WALL + pd.Timedelta(hours=9), clock) == WALL + pd.Timedelta(hours=8)
    assert latest_wall_start(job, WALL + pd.Timedelta(hours=3), clock) == WALL + pd.Timedelta(hours=3)
    assert latest_wall_start(_job(deadline=0), WALL + pd.Timedelta(hours=9), clock) == WALL + pd.Timedelta(hours=9)
