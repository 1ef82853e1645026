"""Preemption on a real slurmctld: a job script that follows the checkpoint contract (docs/operating.md, "Run it on
your Slurm cluster") runs in one partition (one fleet cluster), is preempted at its checkpoint (SIGTERM, then
cancelled; the name marks it, so `sync` reports `preempted`, also from the jobcomp file), and resumes in the other
partition (a move to another cluster: a new Slurm job, never two at once) from the step its checkpoint kept; it
finishes with its work kept, its output written once, and `sync` reports `resumed`. The preemption's plan id is its
idempotency key."""

from __future__ import annotations

import pandas as pd

from scheduling.executors.registry import make_executor
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.slurm.cluster import NODE, wait_for

H = pd.Timedelta(hours=1)
STEPS = 40  # the job's work: 40 half-second steps
SCRIPT = """#!/bin/bash
ck="{dir}/$(echo "$PLANNER_JOB_ID" | tr / _).ck"
step=0
[ -f "$ck" ] && step=$(cat "$ck")
echo "start $step work_done=${{CHECKPOINT_WORK_DONE:-0}}" >> "{dir}/progress.txt"
trap 'echo "$step" > "$ck"; echo "checkpoint $step" >> "{dir}/progress.txt"; exit 0' TERM
while [ "$step" -lt {steps} ]; do
  sleep 0.5
  step=$((step + 1))
  echo "step $step" >> "{dir}/progress.txt"
done
echo "output of the whole job" >> "{dir}/output.txt"
"""


def _executor(cluster, partition: str, wall0: pd.Timestamp):
    settings = {
        "conf": str(cluster.conf),
        "partition": partition,
        "output": str(cluster.dir / "out-%j.txt"),
        "plan_origin": PLAN_TIME.isoformat(),
        "wall_origin": wall0.isoformat(),
        "seconds_per_hour": 60,
        "timeout_s": 20,
        "name": f"slurm-{partition}",
    }
    return make_executor("slurm", settings)


def _item(cluster: str, start: pd.Timestamp, attempt: int, work_done: float, folder) -> pd.DataFrame:
    items = sample_items(1, plan_time=start, prefix="ck")
    items["cluster"], items["node"] = cluster, f"{cluster}/{NODE}"
    items["end_time"], items["est_duration_h"] = start + H, 1.0
    items["cpu_milli"], items["memory_mib"], items["gpu_count"], items["gpu_milli"] = 1000, 1024, 1, 1000
    items["gpu_devices"], items["attempt"], items["work_done"] = "0", attempt, work_done
    items["script"], items["command"] = SCRIPT.format(dir=folder, steps=STEPS), None
    return items


def _steps(folder) -> list[str]:
    path = folder / "progress.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_job_preempted_at_its_checkpoint_resumes_in_the_other_cluster(slurm_cluster, tmp_path):
    folder = slurm_cluster.dir / "ck"
    folder.mkdir(exist_ok=True)
    wall0 = pd.Timestamp.now(tz="UTC").floor("s")
    west, north = _executor(slurm_cluster, "gpu", wall0), _executor(slurm_cluster, "gpu-b", wall0)
    first = _item("cluster-a", PLAN_TIME, 1, 0.0, folder)
    job = first["job_id"].iloc[0]
    records = west.dispatch(plan_id_at(PLAN_TIME), first)
    assert records["error"].isna().all(), records["error"].tolist()
    steps = lambda: sum(line.startswith("step") for line in _steps(folder))  # noqa: E731
    wait_for(lambda: steps() >= 6, timeout_s=60, what="six steps of work")

    decided = plan_id_at(PLAN_TIME + H)
    now = west.clock.to_plan(pd.Timestamp.now(tz="UTC"))
    ref = west.preempt(job, now, plan_id=decided, save_h=5 / 60)
    assert ref is not None and west.preempt(job, now, plan_id=decided, save_h=5 / 60) == ref  # once
    assert west.preemption_ref(decided, job) == ref and north.preemption_ref(decided, job) is None

    def preempted():
        events = west.sync(PLAN_TIME + 48 * H)
        return events if (events["event"] == "preempted").any() else None

    events = wait_for(preempted, what="the preempted event", timeout_s=60)
    assert list(events["event"]) == ["dispatched", "started", "preempted"]
    kept = int(next(line for line in _steps(folder) if line.startswith("checkpoint")).split()[1])
    assert kept >= 6 and west.running(PLAN_TIME + 48 * H).empty  # stopped: nothing of it runs

    # resumed in the other partition (another fleet cluster), from the plan's share of the job done, at once
    later = north.clock.to_plan(pd.Timestamp.now(tz="UTC")).ceil("min")
    second = _item("cluster-b", later, 2, kept / STEPS, folder)
    records = north.dispatch(plan_id_at(later), second)
    assert records["error"].isna().all(), records["error"].tolist()

    def finished():
        events = north.sync(PLAN_TIME + 48 * H)
        return events if (events["event"] == "finished").any() else None

    events = wait_for(finished, timeout_s=120, what="the resumed run's end")
    assert list(events["event"]) == ["dispatched", "resumed", "finished"]
    lines = _steps(folder)
    starts = [line for line in lines if line.startswith("start")]
    assert starts == ["start 0 work_done=0", f"start {kept} work_done={round(kept / STEPS, 6)}"]
    # every step done once: the first run's up to its checkpoint, then the rest
    done = [int(line.split()[1]) for line in lines if line.startswith("step")]
    assert done[done.index(kept + 1) :] == list(range(kept + 1, STEPS + 1))
    assert (folder / "output.txt").read_text() == "output of the whole job\n"  # written once
