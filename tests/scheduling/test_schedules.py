"""Schedule files: layout and content (Kubernetes, Slurm, per-cluster JSON, index), byte-identical re-runs, and
atomic replacement: a writer killed or failing midway leaves the previous plan directory intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from scheduling.output import schedules
from scheduling.output.schedules import recover, schedule_dirname, tree_digest, verify_schedule_dir, write_schedules
from tests.scheduling.test_plan_store import sample_plan

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_dirname_is_filesystem_safe():
    assert schedule_dirname("2021-07-15T12:00:00Z") == "2021-07-15T12-00Z"
    assert schedule_dirname("2021-07-15T14:00:00+02:00") == "2021-07-15T12-00Z"
    assert schedule_dirname("2021-07-15T12:00:30Z") == "2021-07-15T12-00-30Z"


def test_layout_index_and_byte_identical_rerun(tmp_path):
    res = write_schedules(sample_plan(), tmp_path)
    assert res.path == tmp_path / "2021-07-15T12-00Z"
    files = set(res.files)
    assert {
        "plan.json",
        "index.json",
        "clusters/usw-v100m32.json",
        "clusters/eun-g2.json",
        "k8s/usw-v100m32/job-00000.yaml",
        "slurm/eun-g2/job-00001.sbatch",
    } <= files
    assert len([f for f in files if f.startswith("k8s/")]) == 6
    assert len([f for f in files if f.startswith("slurm/")]) == 6
    index = verify_schedule_dir(res.path)
    assert index["plan_id"] == "priority@2021-07-15T12:00:00Z" and index["n_files"] == len(files) - 1
    first = tree_digest(res.path)
    write_schedules(sample_plan(), tmp_path)  # same planning time again: replaced by identical bytes
    assert tree_digest(res.path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "2021-07-15T12-00Z"]  # no leftovers
    for path in res.path.rglob("*"):  # no wall-clock stamp inside
        if path.is_file():
            assert "2026" not in path.read_text() and "2025" not in path.read_text()


def test_cluster_json_and_plan_json(tmp_path):
    res = write_schedules(sample_plan(), tmp_path)
    doc = json.loads((res.path / "clusters/eun-g2.json").read_text())
    assert doc["plan"]["plan_id"] == "priority@2021-07-15T12:00:00Z"
    assert doc["cluster"] == "eun-g2" and doc["regions"] == ["eu-north"]
    assert {a["job_id"] for a in doc["assignments"]} == {"job-00001", "job-00003", "job-00005"}
    starts = [a["start_time"] for a in doc["assignments"]]
    assert starts == sorted(starts)
    plan = json.loads((res.path / "plan.json").read_text())
    assert plan["n_jobs"] == 7 and plan["unplaced"] == [{"job_id": "job-09999", "reason": "capacity"}]


def test_kubernetes_manifest(tmp_path):
    res = write_schedules(sample_plan(), tmp_path)
    shared = yaml.safe_load((res.path / "k8s/usw-v100m32/job-00000.yaml").read_text())
    whole = yaml.safe_load((res.path / "k8s/eun-g2/job-00001.yaml").read_text())
    ann = shared["metadata"]["annotations"]
    assert shared["kind"] == "Pod" and shared["metadata"]["name"] == "job-00000"
    assert ann["alibabacloud.com/gpu-milli"] == "500" and ann["alibabacloud.com/gpu-count"] == "1"
    assert ann["alibabacloud.com/gpu-index"] == "0" and ann["alibabacloud.com/gpu-card-model"] == "V100M32"
    assert ann["carbonplanner.io/power-limit-w"] == "250"
    assert ann["carbonplanner.io/plan-id"] == "priority@2021-07-15T12:00:00Z"
    spec = shared["spec"]
    assert spec["schedulingGates"] == [{"name": "carbonplanner.io/start-time"}]
    assert ann["carbonplanner.io/start-time"].endswith("Z")
    assert "nodeName" not in spec  # not allowed together with schedulingGates
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "openb-node-0000"}
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["initContainers"][0]["name"] == "wait-for-start"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["GPU_POWER_LIMIT_W"] == "250"
    # a share asks for a whole GPU a stock device plugin really gives (never no GPU at all)
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert whole["metadata"]["annotations"]["alibabacloud.com/gpu-index"] == "0-1"
    assert whole["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_slurm_header(tmp_path):
    res = write_schedules(sample_plan(), tmp_path)
    shared = (res.path / "slurm/usw-v100m32/job-00000.sbatch").read_text()
    whole = (res.path / "slurm/eun-g2/job-00001.sbatch").read_text()
    assert shared.startswith("#!/bin/bash\n")
    for needle in (
        "#SBATCH --begin=2021-07-15T",
        "#SBATCH --time=",
        "#SBATCH --deadline=2021-07-",
        "#SBATCH --nodelist=openb-node-0000",
        "#SBATCH --gres=shard:5",
        '#SBATCH --comment="plan=priority@2021-07-15T12:00:00Z',
        "GPU_POWER_LIMIT_W=250",
    ):
        assert needle in shared, needle
    assert "#SBATCH --gres=gpu:2" in whole


def test_names_are_made_safe(tmp_path):
    plan = sample_plan(n_jobs=2)
    plan.assignments.loc[0, "job_id"] = "Job/With Odd:Chars"
    plan.explanations[0]["job_id"] = "Job/With Odd:Chars"
    res = write_schedules(plan, tmp_path)
    k8s = [f for f in res.files if f.startswith("k8s/usw-v100m32/")]
    assert len(k8s) == 1 and "/" not in k8s[0].split("/", 2)[2]
    name = yaml.safe_load((res.path / k8s[0]).read_text())["metadata"]["name"]
    assert len(name) <= 63 and name == name.lower() and all(c.isalnum() or c == "-" for c in name)


def test_failure_after_half_the_files_keeps_the_previous_dir(tmp_path):
    old = write_schedules(sample_plan(), tmp_path)
    before = tree_digest(old.path)
    count = {"n": 0}

    def boom(stage, path):
        if stage == "file":
            count["n"] += 1
            if count["n"] == 8:
                raise OSError("disk full (injected)")

    with pytest.raises(OSError, match="injected"):
        write_schedules(sample_plan(kg_offset=3.0), tmp_path, _fault=boom)
    assert tree_digest(old.path) == before
    new = write_schedules(sample_plan(kg_offset=3.0), tmp_path)  # the next run cleans up and replaces
    assert tree_digest(new.path) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "2021-07-15T12-00Z"]


_KILLED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.scheduling.test_plan_store import sample_plan
    from scheduling.output.schedules import write_schedules
    marker = Path({marker!r})
    seen = []
    def hang(stage, path):
        seen.append(stage)
        if stage == {stage!r} and (stage != "file" or seen.count("file") == {nfile}):
            marker.write_text(stage)
            time.sleep(600)
    write_schedules(sample_plan(kg_offset=3.0), {root_dir!r}, _fault=hang)
""")


def _kill_writer_at(tmp_path: Path, stage: str, env_extra: dict | None = None, nfile: int = 7) -> None:
    marker = tmp_path / f"marker-{stage}"
    script = _KILLED.format(
        root=str(REPO_ROOT), marker=str(marker), stage=stage, nfile=nfile, root_dir=str(tmp_path / "schedules")
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, "writer exited before the kill point"
            assert time.monotonic() < deadline, "writer never reached the kill point"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    "stage, env_extra",
    [
        ("file", None),  # half the files written
        ("built", None),  # complete, not yet renamed
        ("swapped", {"SCHEDULES_NO_EXCHANGE": "1"}),  # fallback: old renamed aside, new not yet in
    ],
)
def test_sigkill_midway_leaves_the_previous_plan_dir(tmp_path, stage, env_extra):
    root = tmp_path / "schedules"
    old = write_schedules(sample_plan(), root)
    before = tree_digest(old.path)
    _kill_writer_at(tmp_path, stage, env_extra)
    if stage == "swapped":
        assert not old.path.exists()  # killed between the two renames ...
        assert schedules.resolve_schedule_dir("2021-07-15T12:00Z", root).name == ".old-2021-07-15T12-00Z"
        assert "restored 2021-07-15T12-00Z" in recover(root)  # ... the aside copy goes back
    else:
        assert tree_digest(old.path) == before  # readers see the old plan meanwhile
    recover(root)
    assert tree_digest(old.path) == before
    verify_schedule_dir(old.path)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "2021-07-15T12-00Z"]


def test_exchange_or_fallback_both_replace(tmp_path, monkeypatch):
    write_schedules(sample_plan(), tmp_path / "a")
    a = write_schedules(sample_plan(kg_offset=1.0), tmp_path / "a")
    monkeypatch.setenv("SCHEDULES_NO_EXCHANGE", "1")
    write_schedules(sample_plan(), tmp_path / "b")
    b = write_schedules(sample_plan(kg_offset=1.0), tmp_path / "b")
    assert tree_digest(a.path) == tree_digest(b.path)


def test_verify_detects_tampering(tmp_path):
    res = write_schedules(sample_plan(), tmp_path)
    target = res.path / "slurm/eun-g2/job-00001.sbatch"
    os.chmod(target, 0o644)
    target.write_text(target.read_text() + "# edited\n")
    with pytest.raises(ValueError, match="job-00001.sbatch"):
        verify_schedule_dir(res.path)


def test_default_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDULES_DIR", str(tmp_path / "elsewhere"))
    assert schedules.schedule_dir_for("2021-07-15T12:00Z") == tmp_path / "elsewhere" / "2021-07-15T12-00Z"


def test_job_files_follow_each_clusters_executor(tmp_path):
    """A cluster whose executor reads no per-job files (replay) gets its cluster JSON only; the others keep the
    kinds they name; clusters not named get every kind."""
    full = write_schedules(sample_plan(), tmp_path / "full")
    part = write_schedules(sample_plan(), tmp_path / "part", job_files={"usw-v100m32": (), "eun-g2": ("slurm",)})
    files = set(part.files)
    assert "clusters/usw-v100m32.json" in files and "clusters/eun-g2.json" in files
    assert not [f for f in files if f.startswith(("k8s/usw-v100m32/", "slurm/usw-v100m32/", "k8s/eun-g2/"))]
    kept = {f for f in full.files if f.startswith("slurm/eun-g2/")}
    assert kept and kept <= files
    # what is written is the same bytes either way
    for rel in files - {"index.json"}:
        assert (part.path / rel).read_bytes() == (full.path / rel).read_bytes(), rel
    verify_schedule_dir(part.path)
