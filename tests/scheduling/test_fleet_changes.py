"""Fleet changes while jobs run: a node drained (`drain: true`) or removed from the fleet file never crashes a plan.
Its running jobs are reported and warned of, naming the node and the jobs; its capacity takes no new job (a drained
node's running jobs keep their GPUs until they end). The fleet loader, the planner's binding of running jobs
(`apply_running`) and the operating loop hour by hour on the replay executor, the fleet file edited between hours."""

from __future__ import annotations

import logging

import pandas as pd
import pytest
import yaml

from scheduling import loop
from scheduling.domain.fleet import fleet_from_spec
from scheduling.domain.jobs import generate_jobs
from scheduling.executors.replay import ReplayExecutor
from scheduling.executors.slurm_cli import drain_reasons
from scheduling.planning.session import HourlyPlanner, apply_running, off_fleet_running, plan_hour
from scheduling.queue.intake import submit_mappings

T = pd.Timestamp("2021-07-15T12:00Z")
HOUR = pd.Timedelta(hours=1)


def _spec(nodes: list[dict]) -> dict:
    return {
        "regions": {"us-west": {"zone": "CISO"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [
            {
                "name": "usw",
                "region": "us-west",
                "gpu_model": "V100",
                "nodes": nodes,
                "executor": {"kind": "replay", "sigma": 0.0, "failure_rate": 0.0},
            }
        ],
    }


def _node(name: str, gpus: int = 8, **extra) -> dict:
    return {"name": name, "gpus": gpus, "cpus": 64, "memory_gib": 512, **extra}


# ------------------------------------------------------------------------------------------------ the fleet file


def test_drained_nodes_leave_the_clusters_nodes_and_capacity():
    spec = _spec([_node("a", drain=True), _node("b"), _node("c", gpus=4, drain=False)])
    spec["clusters"][0]["node_groups"] = [{"count": 2, "name_prefix": "g", "gpus": 2, "cpus": 8, "memory_gib": 64}]
    spec["clusters"][0]["node_groups"].append(
        {"count": 3, "name_prefix": "d", "gpus": 4, "cpus": 8, "memory_gib": 64, "drain": True}
    )
    fleet = fleet_from_spec(spec)
    (cluster,) = fleet.clusters
    assert list(cluster.drained) == ["a", "usw-d-1", "usw-d-2", "usw-d-3"]
    assert set(cluster.drained.values()) == {"drain: true in the fleet file"}
    # still the cluster's nodes (the intake takes jobs only they can hold); a plan leaves them out
    assert cluster.n_gpus == 8 + 8 + 4 + 2 + 2 + 3 * 4 == cluster.config.gpus
    (planned,) = fleet.schedulable().clusters
    assert list(planned.nodes["sn"]) == ["b", "c", "usw-g-1", "usw-g-2"] and planned.drained == cluster.drained
    assert fleet.schedulable().capacity_milli.tolist() == [16_000]
    assert fleet.schedulable().cpu_capacity.tolist() == [(64 + 64 + 8 + 8) * 1000]
    assert fleet.schedulable().schedulable().capacity_milli.tolist() == [16_000]


def test_the_intake_still_takes_a_job_only_a_drained_node_holds(data_dir):
    """A drain is for a while: a job that needs the drained 8-GPU node is queued, not refused."""
    from scheduling.queue.checks import FleetFacts, check_jobs
    from scheduling.queue.spec import parse_job

    fleet = fleet_from_spec(_spec([_node("a", drain=True), _node("b", gpus=4)]))
    job = {
        "tenant": "ops",
        "job_id": "eight",
        "submitted_at": T.isoformat(),
        "gpus": 8,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "job_type": "ResNet-50 (batch size 64)",
        "est_duration_h": 2.0,
        "flexibility": 1.0,
        "home_region": "us-west",
    }
    ((_, errors),) = check_jobs([parse_job(job)], FleetFacts.of(fleet, data_dir=data_dir))
    assert errors == []


def test_every_node_drained_leaves_a_cluster_without_capacity():
    (cluster,) = fleet_from_spec(_spec([_node("a", drain=True)])).schedulable().clusters
    assert list(cluster.drained) == ["a"] and cluster.n_gpus == 0 and cluster.nodes.empty


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_drain_must_be_true_or_false(value):
    with pytest.raises(ValueError, match=r"clusters\[0\] \(usw\)\.nodes\[1\]\.drain: must be true or false"):
        fleet_from_spec(_spec([_node("a"), _node("b", drain=value)]))


def test_a_fleet_with_nodes_an_executor_drains():
    fleet = fleet_from_spec(_spec([_node("a", drain=True), _node("b"), _node("c", gpus=4)]))
    why = "Slurm state MIXED+DRAIN, reason 'gpu swap'"
    more = fleet.with_drained({"usw": {"c": why, "a": "again", "elsewhere": why}, "other-cluster": {"b": why}})
    (cluster,) = more.schedulable().clusters
    assert list(cluster.nodes["sn"]) == ["b"]
    assert cluster.drained == {"a": "drain: true in the fleet file", "c": why}
    assert more.schedulable().capacity_milli.tolist() == [8000]
    assert fleet.schedulable().capacity_milli.tolist() == [12_000]  # `fleet` itself is left as it was
    off = off_fleet_running(more.schedulable(), _running(("t/on-c", "usw/c", "1", 1)))  # as schedule files name it
    assert off[["node_state", "reason"]].values.tolist() == [["drained", f"the node is drained ({why})"]]


def test_slurm_drain_states_of_both_sinfo_formats():
    nodes = [
        {"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "disk swap"},  # Slurm 22.05
        {"name": "n2", "state": ["MIXED", "DRAIN"], "reason": ""},  # later versions
        {"name": "n3", "state": "mixed", "state_flags": ["NOT_RESPONDING"], "reason": "late"},
        {"name": "n4", "state": ["IDLE"]},
    ]
    assert drain_reasons(nodes) == {"n1": "Slurm state IDLE+DRAIN, reason 'disk swap'", "n2": "Slurm state MIXED+DRAIN"}


# ------------------------------------------------------------------------------------------------ the planner


def _running(*rows) -> pd.DataFrame:
    keys = ("job_id", "node", "gpu_devices", "num_gpu")
    return pd.DataFrame(
        [
            {**dict(zip(keys, r)), "cluster": "usw", "gpu_milli": 1000, "cpu_milli": 1000, "memory_mib": 1024}
            | {"end_time": T + 5 * HOUR}
            for r in rows
        ]
    )


def test_jobs_on_drained_or_removed_nodes_are_reported_not_bound():
    fleet = fleet_from_spec(_spec([_node("a", drain=True), _node("b")]))
    running = _running(
        ("t/on-drained", "a", "0", 1),
        ("t/on-removed", "gone", "0,1", 2),
        ("t/on-b", "b", "3", 1),
        ("t/nodeless", "", "", 1),
    )
    off = off_fleet_running(fleet, running)
    assert off[["job_id", "node", "node_state"]].values.tolist() == [
        ["t/on-drained", "a", "drained"],
        ["t/on-removed", "gone", "removed"],
    ]
    hp = HourlyPlanner(fleet, generate_jobs(2, T, 1, fleet, seed=1, arrival="all-at-start"), forecasts=None)
    unbound = apply_running(hp, running, T)
    assert unbound["job_id"].tolist() == ["t/on-drained", "t/on-removed"]
    (agent,) = hp.agents
    assert set(agent.cluster.bindings) == {"t/on-b"} and agent.cluster.names == ["b"]
    # the cluster's capacity view holds the jobs on its own nodes (and the one without a node), not the others
    usage = hp.usage(int(T.value // 3_600_000_000_000), 2)
    assert usage[0, :, 0].tolist() == [2000, 2000]


def test_a_node_reported_with_its_cluster_prefix_is_bound():
    """Slurm reports a job it started itself on `<cluster>/<host>`; the fleet file names the node `<host>`."""
    fleet = fleet_from_spec(_spec([_node("b")]))
    hp = HourlyPlanner(fleet, generate_jobs(2, T, 1, fleet, seed=1, arrival="all-at-start"), forecasts=None)
    assert apply_running(hp, _running(("t/own", "usw/b", "2,5", 2)), T).empty
    binding = hp.agents[0].cluster.bindings["t/own"]
    assert hp.agents[0].cluster.names[binding.node] == "b" and binding.gpus == (2, 5)


def test_a_job_whose_devices_no_longer_fit_its_node_is_reported():
    """The fleet file now declares node b with 4 GPUs; a job runs on its device 6."""
    fleet = fleet_from_spec(_spec([_node("b", gpus=4)]))
    hp = HourlyPlanner(fleet, generate_jobs(2, T, 1, fleet, seed=1, arrival="all-at-start"), forecasts=None)
    unbound = apply_running(hp, _running(("t/on-6", "b", "6", 1)), T)
    assert unbound["node_state"].tolist() == ["not_fitting"] and "does not fit" in unbound["reason"].iloc[0]
    assert hp.agents[0].cluster.bindings == {}


def _urgent_jobs(fleet, n: int, gpus: int) -> pd.DataFrame:
    """`n` jobs of `gpus` GPUs each that must start at T to meet their deadlines (15 min of slack)."""
    jobs = generate_jobs(n, T, 1, fleet, seed=1, arrival="all-at-start")
    jobs[["num_gpu", "gpu_milli", "cpu_milli", "memory_mib"]] = [gpus, 1000, 1000, 1024]
    jobs["gpu_spec"] = ""
    jobs["deadline"] = jobs["submit_time"] + pd.to_timedelta(jobs["duration_h_home"] + 0.25, unit="h")
    return jobs


@pytest.mark.parametrize("drain", [False, True])
def test_a_drained_node_takes_no_new_job_and_a_removed_nodes_job_takes_no_capacity(data_dir, drain):
    """Two 8-GPU nodes; node a runs a 1-GPU job, node "gone" (no longer in the file) an 8-GPU one; three 4-GPU jobs
    must start now. Free now: node b's 8 GPUs and, unless drained, node a's 7: 4-GPU jobs that fit = 8 // 4 + 7 // 4
    (3), or 8 // 4 (2) with node a drained."""
    fleet = fleet_from_spec(_spec([_node("a", drain=drain), _node("b")]))
    running = _running(("t/on-a", "a", "0", 1), ("t/on-gone", "gone", ",".join(map(str, range(8))), 8))
    plan = plan_hour(T, _urgent_jobs(fleet, 3, 4), fleet=fleet, forecasts="naive", running=running, data_dir=data_dir)
    now = plan.assignments[plan.assignments["status"] == "dispatched"]
    assert len(now) == (8 // 4 if drain else 8 // 4 + 7 // 4)
    assert set(now["node"]) == ({"b"} if drain else {"a", "b"})
    assert len(plan.unplaced) == (1 if drain else 0)


# ------------------------------------------------------------------------------------------------ the loop


def _job(job_id: str, gpus: int, at: pd.Timestamp, hours: float = 8.0, slack_h: float = 0.5) -> dict:
    return {
        "tenant": "ops",
        "job_id": job_id,
        "submitted_at": at.isoformat(),
        "gpus": gpus,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "job_type": "ResNet-50 (batch size 64)",
        "est_duration_h": hours,
        "deadline": (at + pd.Timedelta(hours=hours + slack_h)).isoformat(),
        "home_region": "us-west",
    }


def test_the_loop_plans_on_when_a_node_is_removed_or_drained_under_running_jobs(
    tmp_warehouse, tmp_path, data_dir, monkeypatch, caplog
):
    """Three 4-GPU nodes. Hour T must start `whole` and `fill` (4 GPUs each: a node of their own) and `one` (1 GPU,
    on the third node); `waiter` (4 GPUs, no hurry) waits for a free node, so every later hour plans around the
    running jobs. At T+1 the node of `whole` is removed from the fleet file; at T+2 the node of `one` is drained and
    `c` (3 GPUs) arrives and must start at once: only the drained node has 3 GPUs free, so it does not start. Every
    hour plans, and names the node and its job (summary and warning); the jobs run on until they end."""
    path = tmp_path / "fleet.yaml"
    names = ["n1", "n2", "n3"]

    def write(nodes):
        path.write_text(yaml.safe_dump(_spec(nodes), sort_keys=False))

    write([_node(n, gpus=4) for n in names])
    monkeypatch.setenv("FLEET_PATH", str(path))
    jobs = [_job("whole", 4, T), _job("fill", 4, T), _job("one", 1, T), _job("c", 3, T + 2 * HOUR)]
    jobs.append(_job("waiter", 4, T, hours=2.0, slack_h=48.0))
    report = submit_mappings(jobs, source="test", as_of=T, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 5, report.to_dict()
    settings = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}

    first = loop.run_hour(T, **settings)
    assert first.dispatch["sent"] == 3 and first.plan["running_off_fleet"] == []
    executor = ReplayExecutor(db_path=tmp_warehouse)
    running = executor.running(T)
    node_of = dict(zip(running["job_id"], running["node"]))
    assert set(node_of) == {"ops/whole", "ops/fill", "ops/one"} and len(set(node_of.values())) == 3

    write([_node(n, gpus=4) for n in names if n != node_of["ops/whole"]])  # the node of `whole` is removed
    removed = {"cluster": "usw", "node": node_of["ops/whole"], "node_state": "removed", "jobs": ["ops/whole"]}
    caplog.set_level(logging.WARNING)
    second = loop.run_hour(T + HOUR, **settings)
    assert second.plan["n_jobs"] == 1 and second.dispatch["sent"] == 0  # the waiter, planned around the runs
    assert [{k: e[k] for k in removed} for e in second.plan["running_off_fleet"]] == [removed]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(node_of["ops/whole"] in m and "ops/whole" in m and "not in the fleet file" in m for m in warned)

    drained = node_of["ops/one"]
    write([_node(n, gpus=4, drain=n == drained) for n in names if n != node_of["ops/whole"]])
    caplog.clear()
    for h in (2, 3):
        out = loop.run_hour(T + h * HOUR, **settings)
        entries = sorted(({k: e[k] for k in removed} for e in out.plan["running_off_fleet"]), key=lambda e: e["node"])
        expected = [removed, {"cluster": "usw", "node": drained, "node_state": "drained", "jobs": ["ops/one"]}]
        assert entries == sorted(expected, key=lambda e: e["node"])
        assert out.plan["n_jobs"] == 2 and out.dispatch["sent"] == 0  # `c` fits only the drained node's 3 free GPUs
        assert set(executor.running(T + h * HOUR)["job_id"]) == set(node_of)  # the jobs run on
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(drained in m and "ops/one" in m and "drained" in m for m in warned)


def test_hours_in_a_row_read_the_fleet_file_every_hour(tmp_warehouse, tmp_path, data_dir, monkeypatch):
    """`loop.run_hours` (the command line's `loop --hours N`) sees a node removed between two of its hours."""
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_spec([_node(n, gpus=4) for n in ("n1", "n2")]), sort_keys=False))
    monkeypatch.setenv("FLEET_PATH", str(path))
    report = submit_mappings([_job("whole", 4, T)], source="test", as_of=T, db_path=tmp_warehouse, data_dir=data_dir)
    assert report.counts["accepted"] == 1, report.to_dict()
    placed = {}

    def remove_its_node(result):
        if result.plan_time == T:
            placed.update(zip(*ReplayExecutor(db_path=tmp_warehouse).running(T)[["job_id", "node"]].T.to_numpy()))
            kept = [n for n in ("n1", "n2") if n != placed["ops/whole"]]
            path.write_text(yaml.safe_dump(_spec([_node(n, gpus=4) for n in kept]), sort_keys=False))

    settings = {"db_path": tmp_warehouse, "data_dir": data_dir, "schedule_root": tmp_path / "schedules"}
    first, second = loop.run_hours(T, 2, progress=remove_its_node, **settings)
    assert first.dispatch["sent"] == 1 and first.plan["running_off_fleet"] == []
    off = [(e["node"], e["node_state"], e["jobs"]) for e in second.plan["running_off_fleet"]]
    assert off == [(placed["ops/whole"], "removed", ["ops/whole"])]
