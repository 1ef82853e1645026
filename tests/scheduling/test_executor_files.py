"""The files executor: the same files as write_schedules, one atomic directory per plan whatever the chunking,
lookup from the index, `unconfirmed` once per job, planned jobs kept as (unconfirmed) running, cancel requests."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scheduling.domain.plan import Plan
from scheduling.executors.base import DuplicateDispatchError
from scheduling.executors.dispatch_log import dispatch
from scheduling.executors.files import FilesExecutor
from scheduling.executors.items import check_items
from scheduling.output.schedules import tree_digest, verify_schedule_dir, write_schedules
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items

H = pd.Timedelta(hours=1)
PLAN_ID = plan_id_at()


def _reference(items: pd.DataFrame, root: Path) -> dict[str, str]:
    plan = Plan(plan_time=PLAN_TIME, policy="priority", assignments=check_items(items))
    return tree_digest(write_schedules(plan, root, plan_id=PLAN_ID).path)


def test_writes_the_same_files_as_write_schedules(tmp_warehouse, tmp_path):
    items = sample_items(9)
    executor = FilesExecutor(root=tmp_path / "one")
    records = executor.dispatch(PLAN_ID, items)
    directory = tmp_path / "one" / "2021-07-15T12-00Z"
    assert tree_digest(directory) == _reference(items, tmp_path / "ref")
    verify_schedule_dir(directory)
    for ref in records["executor_ref"]:
        k8s, slurm = ref.split(";")
        assert Path(k8s).is_file() and k8s.endswith(".yaml") and Path(slurm).is_file() and slurm.endswith(".sbatch")
    # dispatched in chunks through the log: the same directory as one call
    chunked = FilesExecutor(root=tmp_path / "chunked")
    result = dispatch(PLAN_ID, items, chunked, db_path=tmp_warehouse, batch_size=4)
    assert len(result.sent) == 9
    assert tree_digest(tmp_path / "chunked" / "2021-07-15T12-00Z") == tree_digest(directory)
    pod = (directory / "k8s" / "usw-t4").glob("*.yaml")
    assert any("registry.example/train:1.0" in p.read_text() for p in pod)  # the job's image


def test_lookup_answers_from_the_index(tmp_path):
    executor = FilesExecutor(root=tmp_path)
    assert executor.lookup(PLAN_ID, "acme/job-0000") is None
    records = executor.dispatch(PLAN_ID, sample_items(3)).set_index("job_id")
    assert executor.lookup(PLAN_ID, "acme/job-0000") == records.loc["acme/job-0000", "executor_ref"]
    assert executor.lookup(PLAN_ID, "acme/job-0099") is None
    assert executor.lookup(plan_id_at(PLAN_TIME + H), "acme/job-0000") is None
    with pytest.raises(DuplicateDispatchError, match="acme/job-0000"):
        executor.dispatch(PLAN_ID, sample_items(1))
    with pytest.raises(ValueError, match="holds plan 'priority@2021-07-15T12:00:00Z', not 'rolling-lp@"):
        executor.dispatch(plan_id_at(policy="rolling-lp"), sample_items(1, prefix="other"))


def test_sync_reports_unconfirmed_once_and_running_keeps_the_plan(tmp_path):
    executor = FilesExecutor(root=tmp_path)
    first = sample_items(4)
    first.loc[3, ["start_time", "end_time"]] = [PLAN_TIME + 2 * H, PLAN_TIME + 5 * H]
    executor.dispatch(PLAN_ID, first)
    later = PLAN_TIME + 3 * H
    executor.dispatch(plan_id_at(later), sample_items(2, plan_time=later, prefix="late"))
    a, c = PLAN_TIME - H, PLAN_TIME + 10 * H
    whole = executor.sync(c, since=a)
    hourly = pd.concat([executor.sync(a + (k + 1) * H, since=a + k * H) for k in range(11)], ignore_index=True)
    pd.testing.assert_frame_equal(whole, hourly)
    per_job = whole.groupby("planner_job_id")["event"].apply(list).to_dict()
    assert len(per_job) == 6 and all(v == ["dispatched", "unconfirmed"] for v in per_job.values())
    unconfirmed = whole[whole["event"] == "unconfirmed"].set_index("planner_job_id")["event_time"]
    assert unconfirmed["globex/job-0003"] == PLAN_TIME + 2 * H  # at the planned start
    assert not whole["event"].isin(["started", "finished", "failed"]).any()  # never assumed
    row = whole[whole["planner_job_id"] == "acme/late-0000"].iloc[0]
    assert (row["tenant"], row["job_id"], row["attempt"], row["plan_id"]) == ("acme", "late-0000", 1, plan_id_at(later))
    running = executor.running(PLAN_TIME + 2.5 * H)
    assert set(running["job_id"]) == {"acme/job-0002", "globex/job-0003"}  # planned until 15:00 and 17:00
    assert not running["confirmed"].any() and running["node"].notna().all()


def test_cancel_hands_off_a_request_and_reports_it(tmp_path):
    executor = FilesExecutor(root=tmp_path)
    items = sample_items(3)
    items.loc[2, ["start_time", "end_time"]] = [PLAN_TIME + 2 * H, PLAN_TIME + 4 * H]
    executor.dispatch(PLAN_ID, items)
    assert executor.cancel("acme/job-0002", PLAN_TIME + H)  # before its planned start
    assert executor.cancel("globex/job-0001", PLAN_TIME + 0.5 * H)
    assert not executor.cancel("globex/job-0001", PLAN_TIME + 0.6 * H)  # already requested
    assert not executor.cancel("acme/job-0000", PLAN_TIME + 5 * H)  # planned end passed
    request = json.loads(next((tmp_path / "cancel").rglob("acme_job-0002*.json")).read_text())
    assert request["plan_id"] == PLAN_ID and request["at"] == "2021-07-15T13:00:00Z"
    assert request["kubernetes"]["namespace"] == "gpu-jobs" and request["slurm"]["job_name"].startswith("acme_job-0002")
    events = executor.sync(PLAN_TIME + 10 * H)
    by_job = events.groupby("planner_job_id")["event"].apply(list).to_dict()
    assert by_job["acme/job-0002"] == ["dispatched", "cancelled"]
    assert by_job["globex/job-0001"] == ["dispatched", "unconfirmed", "cancelled"]
    assert set(executor.running(PLAN_TIME + 0.75 * H)["job_id"]) == {"acme/job-0000"}
    verify_schedule_dir(tmp_path / "2021-07-15T12-00Z")  # the plan directory itself is untouched


def test_the_job_command_goes_into_the_pod_and_the_slurm_script(tmp_path):
    items = sample_items(2)
    items.loc[1, "command"] = None
    items.loc[0, "command"] = "python train.py --lr '0.1'"
    FilesExecutor(root=tmp_path).dispatch(PLAN_ID, items)
    directory = tmp_path / "2021-07-15T12-00Z"
    pod = yaml.safe_load(next((directory / "k8s" / "usw-t4").glob("acme_job-0000*.yaml")).read_text())
    assert pod["spec"]["containers"][0]["command"] == ["/bin/sh", "-c", "python train.py --lr '0.1'"]
    sbatch = next((directory / "slurm" / "usw-t4").glob("acme_job-0000*.sbatch")).read_text()
    assert sbatch.rstrip().endswith("srun /bin/sh -c 'python train.py --lr '\"'\"'0.1'\"'\"''")
    other = yaml.safe_load(next((directory / "k8s" / "eun-v100m32").glob("globex_job-0001*.yaml")).read_text())
    assert "command" not in other["spec"]["containers"][0]  # the image's own entry point
    plain = next((directory / "slurm" / "eun-v100m32").glob("globex_job-0001*.sbatch")).read_text()
    # JOB_COMMAND set by whoever submits it is split into words by the shell, never run as one word
    assert plain.rstrip().endswith('srun /bin/sh -c "${JOB_COMMAND:?set JOB_COMMAND to the job command}"')


def test_a_queued_command_list_runs_word_by_word(tmp_path):
    items = sample_items(1)
    items.loc[0, "command"] = json.dumps(["python", "train.py", "--name", "a b"])  # as queue.jobs keeps it
    FilesExecutor(root=tmp_path).dispatch(PLAN_ID, items)
    directory = tmp_path / "2021-07-15T12-00Z"
    pod = yaml.safe_load(next((directory / "k8s").glob("*/*.yaml")).read_text())
    assert pod["spec"]["containers"][0]["command"] == ["python", "train.py", "--name", "a b"]
    sbatch = next((directory / "slurm").glob("*/*.sbatch")).read_text()
    assert sbatch.rstrip().endswith("srun python train.py --name 'a b'")


def test_check_items_fills_defaults_and_names_the_first_bad_job():
    items = sample_items(4).drop(columns=["tenant", "queue_job_id", "attempt", "est_duration_h"], errors="ignore")
    items.loc[1, "job_id"] = "no-tenant-job"
    out = check_items(items).set_index("job_id")
    assert out.loc["acme/job-0000", "tenant"] == "acme" and out.loc["acme/job-0000", "queue_job_id"] == "job-0000"
    assert pd.isna(out.loc["no-tenant-job", "tenant"]) and out.loc["no-tenant-job", "queue_job_id"] == "no-tenant-job"
    assert (out["attempt"] == 1).all()
    assert out.loc["acme/job-0002", "est_duration_h"] == pytest.approx(3.0)  # the planned duration
    late = sample_items(4)
    late.loc[2, "end_time"] = late.loc[2, "start_time"]
    late.loc[3, "cluster"] = None
    with pytest.raises(ValueError, match=r"'acme/job-0002': field 'end_time' .* is not after start_time"):
        check_items(late)
    gone = sample_items(4)
    gone.loc[1, "start_time"] = pd.NaT
    with pytest.raises(ValueError, match=r"'globex/job-0001': field 'start_time' is empty"):
        check_items(gone)


def test_shared_jobs_ask_for_the_clusters_shards_per_gpu(tmp_path):
    items = sample_items(1)
    items.loc[0, ["gpu_count", "gpu_milli"]] = [1, 250]
    FilesExecutor(root=tmp_path, shards_per_gpu=8).dispatch(PLAN_ID, items)
    sbatch = next((tmp_path / "2021-07-15T12-00Z" / "slurm").glob("*/*.sbatch")).read_text()
    assert "#SBATCH --gres=shard:2\n" in sbatch  # a quarter of 8 shards, not of 10
    with pytest.raises(ValueError, match="shards_per_gpu"):
        FilesExecutor(root=tmp_path, shards_per_gpu=0)


def test_a_clock_puts_the_job_files_on_the_consumers_clock_and_keeps_the_plan_in_plan_time(tmp_path):
    wall0 = pd.Timestamp("2026-11-26T06:00Z")
    clock = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": wall0.isoformat(), "seconds_per_hour": 60}
    items = sample_items(2)
    items["deadline"] = PLAN_TIME + 6 * H
    executor = FilesExecutor(root=tmp_path / "mapped", clock=clock)
    executor.dispatch(PLAN_ID, items)
    FilesExecutor(root=tmp_path / "plain").dispatch(PLAN_ID, items)
    mapped, plain = tmp_path / "mapped" / "2021-07-15T12-00Z", tmp_path / "plain" / "2021-07-15T12-00Z"
    # plan hour 12:00 is 12 plan hours after the origin: 12 minutes after the wall origin; 1 plan hour = 60 s
    start, deadline = wall0 + pd.Timedelta(minutes=12), wall0 + pd.Timedelta(minutes=18)
    sbatch = next((mapped / "slurm" / "usw-t4").glob("acme_job-0000*.sbatch")).read_text()
    assert f"#SBATCH --begin={start:%Y-%m-%dT%H:%M:%S}" in sbatch
    assert "#SBATCH --time=00:01:00" in sbatch  # the one-hour job's minute of wall clock
    assert f"#SBATCH --deadline={deadline:%Y-%m-%dT%H:%M:%S}" in sbatch
    assert "--begin=2021-07-15T12:00:00" in next((plain / "slurm" / "usw-t4").glob("acme_job-0000*.sbatch")).read_text()
    pod = yaml.safe_load(next((mapped / "k8s" / "usw-t4").glob("acme_job-0000*.yaml")).read_text())
    assert pod["metadata"]["annotations"]["carbonplanner.io/start-time"] == "2026-11-26T06:12:00Z"
    assert pod["spec"]["activeDeadlineSeconds"] == 360
    # the plan and cluster files, the events and the running jobs stay in plan time
    for rel in ("plan.json", "clusters/usw-t4.json", "clusters/eun-v100m32.json"):
        assert (mapped / rel).read_bytes() == (plain / rel).read_bytes()
    verify_schedule_dir(mapped)
    assert set(executor.sync(PLAN_TIME + 2 * H)["event_time"]) == {PLAN_TIME}
    assert len(executor.running(PLAN_TIME + 0.5 * H)) == 2


def test_a_bad_clock_setting_names_the_executor_and_the_key():
    with pytest.raises(ValueError, match="executor 'drop': clock: unknown key"):
        FilesExecutor(name="drop", clock={"plan_origin": "2021-07-15T00:00Z", "wall": "x"})
    with pytest.raises(ValueError, match="'plan_origin' and 'wall_origin' go together"):
        FilesExecutor(name="drop", clock={"plan_origin": "2021-07-15T00:00Z"})
