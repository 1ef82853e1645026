"""A node Slurm drains (`scontrol update state=drain`) while a job runs on it, on a real slurmctld: the executor
reports it with Slurm's state and the operator's reason, and the next loop hour plans without it. The running job
is reported and warned of, naming the node and the job, and keeps its GPUs; a job that must start at once does not
start there (the cluster's only node), although the node has GPUs free."""

from __future__ import annotations

import logging
import subprocess
import time

import pandas as pd
import yaml

from scheduling import loop
from scheduling.executors.clock import PlanClock
from scheduling.executors.registry import make_executor
from scheduling.queue.intake import submit_mappings
from tests.scheduling.slurm.cluster import GPUS, NODE

T0 = pd.Timestamp("2021-07-15T12:00:00Z")
HOUR = pd.Timedelta(hours=1)
SECONDS_PER_HOUR = 6
REASON = "gpu swap"


def _job(job_id: str, at: pd.Timestamp, hours: float, command: str) -> dict:
    return {
        "tenant": "lab",
        "job_id": job_id,
        "submitted_at": at.isoformat(),
        "gpus": 1,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "job_type": "ResNet-50 (batch size 64)",
        "est_duration_h": hours,
        "deadline": (at + pd.Timedelta(hours=hours + 0.25)).isoformat(),
        "home_region": "us-west",
        "command": command,
    }


def _wait(predicate, timeout_s: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _scontrol(cluster, *args: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={NODE}", *args], env=cluster.env, check=True, timeout=20)


def test_a_node_slurm_drains_under_a_running_job(slurm_cluster, tmp_warehouse, tmp_path, data_dir, monkeypatch, caplog):
    wall0 = pd.Timestamp.now(tz="UTC").ceil("s") + pd.Timedelta(seconds=2)
    clock = PlanClock.from_settings(T0, wall0, SECONDS_PER_HOUR)
    settings = {
        "conf": str(slurm_cluster.conf),
        "output": str(slurm_cluster.dir / "drain-%j.txt"),
        "plan_origin": T0.isoformat(),
        "wall_origin": wall0.isoformat(),
        "seconds_per_hour": SECONDS_PER_HOUR,
    }
    executor = make_executor("slurm", settings)
    nodes = [{k: n[k] for k in ("name", "gpus", "cpus", "memory_mib")} for n in executor.nodes()]
    assert [n["name"] for n in nodes] == [NODE] and nodes[0]["gpus"] == GPUS
    spec = {
        "regions": {"us-west": {"zone": "CISO"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [
            {
                "name": "slurm-v100",
                "region": "us-west",
                "gpu_model": "V100",
                "nodes": nodes,
                "executor": {"kind": "slurm", **settings},
            }
        ],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("FLEET_PATH", str(tmp_path / "fleet.yaml"))
    jobs = [_job("long", T0, 2.0, "sleep 120"), _job("urgent", T0 + HOUR, 1.0, "sleep 1")]
    report = submit_mappings(jobs, source="test", as_of=T0, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 2, report.to_dict()
    run = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}
    assert executor.drained_nodes(T0) == {}

    time.sleep(max(0.0, (wall0 - pd.Timestamp.now(tz="UTC")).total_seconds()))
    first = loop.run_hour(T0, **run)
    assert first.dispatch["sent"] == 1 and first.plan["running_off_fleet"] == []
    _wait(
        lambda: any(r["confirmed"] for _, r in executor.running(T0 + 0.5 * HOUR).iterrows()),
        what="Slurm to start the long job",
    )
    try:
        _scontrol(slurm_cluster, "state=drain", f"reason={REASON}")
        drained = executor.drained_nodes(T0 + HOUR)
        assert list(drained) == [NODE] and "DRAIN" in drained[NODE] and REASON in drained[NODE], drained
        time.sleep(max(0.0, (clock.to_wall(T0 + HOUR) - pd.Timestamp.now(tz="UTC")).total_seconds() + 0.5))
        caplog.set_level(logging.WARNING)
        second = loop.run_hour(T0 + HOUR, **run)
        (entry,) = second.plan["running_off_fleet"]
        assert {k: entry[k] for k in ("cluster", "node", "node_state", "jobs")} == {
            "cluster": "slurm-v100",
            "node": NODE,
            "node_state": "drained",
            "jobs": ["lab/long"],
        }
        assert REASON in entry["reason"]
        # `urgent` must start now; the only node is drained (GPUS - 1 of its GPUs free): nothing is sent
        assert second.plan["n_jobs"] == 1 and second.dispatch["sent"] == 0
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(NODE in m and "lab/long" in m and REASON in m for m in warned), warned
        assert "lab/long" in set(executor.running(T0 + HOUR)["job_id"])  # it keeps running
    finally:
        _scontrol(slurm_cluster, "state=resume")
