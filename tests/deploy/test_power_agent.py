"""The GPU power-limit node agent (deploy/kubernetes/power_agent.py) against the local recording API server, with a
stand-in for nvidia-smi that records its calls (no GPU exists here): it sets each running Pod's limit on the GPUs
of the Pod's assignment on its own node only, follows a change the executor makes mid-run, holds a shared GPU at
the highest limit of its Pods, gives a GPU back its default limit once its Pods ended, records what it applied on
the Pods, and retries a failed call at the next poll."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys

import pandas as pd
import pytest

from scheduling.executors.k8s_pods import ITEM_ANNOTATION, POWER_APPLIED, POWER_LIMIT, watts_text
from scheduling.executors.registry import make_executor
from tests.conftest import REPO_ROOT
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.k8s_api_server import KubeApiServer

SCRIPT = REPO_ROOT / "deploy" / "kubernetes" / "power_agent.py"
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}
NS = "gpu-jobs"
H = pd.Timedelta(hours=1)
STAND_IN = """#!{python}
import json, sys
log = {log!r}
with open(log, "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\\n")
try:
    open(log + ".fail").close()
    sys.stderr.write("Failed to set power limit: insufficient permissions\\n")
    sys.exit(4)
except OSError:
    pass
if "--query-gpu=index,power.default_limit" in sys.argv:
    for index in sys.argv[sys.argv.index("-i") + 1].split(","):
        print(f"{{index}}, 300.00")
"""


def _agent():
    spec = importlib.util.spec_from_file_location("power_agent", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tool(tmp_path):
    """(path of the stand-in GPU tool, a function returning and clearing the calls it recorded)."""
    log = tmp_path / "gpu-tool.log"
    path = tmp_path / "nvidia-smi"
    path.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def calls() -> list[list[str]]:
        if not log.exists():
            return []
        out = [json.loads(line) for line in log.read_text().splitlines()]
        log.unlink()
        return out

    return str(path), calls


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The recording API server with four sample jobs dispatched at 12:00 (plan = wall 2026-11-26T12:00Z):
    job 1 (GPUs 0,1, 201 W) runs on node-a, where job 2 (GPUs 0,1) is bound but pending; jobs 0 and 3 (200 and
    203 W) share GPU 0 of node-b. Returns (server, executor, job -> Pod name)."""
    monkeypatch.setenv("K8S_TOKEN", "t")
    (tmp_path / "token").write_text("t\n")
    with KubeApiServer(token="t") as api:
        executor = make_executor("kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK})
        records = executor.dispatch(plan_id_at(PLAN_TIME), sample_items(4)).set_index("job_id")
        names = {job.split("-")[-1]: ref.split("/")[-1] for job, ref in records["executor_ref"].items()}
        api.run_pod(NS, names["0001"], "2026-11-26T12:01:00Z", node="node-a")
        api.pods[(NS, names["0002"])]["spec"]["nodeName"] = "node-a"
        api.run_pod(NS, names["0000"], "2026-11-26T12:01:00Z", node="node-b")
        api.run_pod(NS, names["0003"], "2026-11-26T12:01:00Z", node="node-b")
        yield api, executor, names


def _applied(api, name) -> str | None:
    return api.pods[(NS, name)]["metadata"]["annotations"].get(POWER_APPLIED)


def test_the_agent_sets_the_limit_of_each_running_pod_on_its_gpus(cluster, tool, tmp_path):
    api, executor, names = cluster
    path, calls = tool
    agent = _agent()
    client = agent.Api(api.url, "t", None)
    applied: dict[int, float] = {}
    # node-a: the running Pod's dispatch limit on its GPUs 0 and 1; the pending one asks nothing yet
    assert agent.poll(client, NS, "node-a", applied, path) == [f"{path} -i 0,1 -pl 201"]
    assert calls() == [["-i", "0,1", "-pl", "201"]]
    assert _applied(api, names["0001"]) == "201" and _applied(api, names["0002"]) is None
    listing = [r for r in api.requests if r["method"] == "GET"][-1]
    assert listing["query"]["fieldSelector"] == "spec.nodeName=node-a"
    # nothing changed: no call, no patch
    patches = sum(r["method"] == "PATCH" for r in api.requests)
    assert agent.poll(client, NS, "node-a", applied, path) == [] and calls() == []
    assert sum(r["method"] == "PATCH" for r in api.requests) == patches
    # a later plan changes the limit mid-run: the agent follows
    executor.set_power_limit("globex/job-0001", 250.5, PLAN_TIME + H, plan_id=plan_id_at(PLAN_TIME + H))
    agent.poll(client, NS, "node-a", applied, path)
    assert calls() == [["-i", "0,1", "-pl", "250.5"]] and _applied(api, names["0001"]) == "250.5"
    # the run ends: its GPUs go back to their default limit
    api.run_pod(NS, names["0001"], "2026-11-26T12:01:00Z", "2026-11-26T13:30:00Z", node="node-a")
    agent.poll(client, NS, "node-a", applied, path)
    assert calls() == [
        ["-i", "0,1", "--query-gpu=index,power.default_limit", "--format=csv,noheader,nounits"],
        ["-i", "0,1", "-pl", "300"],
    ]
    assert applied == {}
    # node-b: GPU 0 shared by two Pods runs at the higher of their limits, and both record it
    assert agent.poll(client, NS, "node-b", {}, path) == [f"{path} -i 0 -pl 203"]
    assert calls() == [["-i", "0", "-pl", "203"]]
    assert _applied(api, names["0000"]) == _applied(api, names["0003"]) == "203"


def test_a_failed_call_is_retried_and_a_bad_pod_does_not_stop_the_others(cluster, tool, capsys):
    api, _, names = cluster
    path, calls = tool
    agent = _agent()
    client = agent.Api(api.url, "t", None)
    fail = path.replace("nvidia-smi", "gpu-tool.log.fail")
    open(fail, "w").close()
    applied: dict[int, float] = {}
    assert agent.poll(client, NS, "node-a", applied, path) == []
    assert "insufficient permissions" in capsys.readouterr().err
    assert applied == {} and _applied(api, names["0001"]) is None  # nothing recorded: the job runs on (fail-open)
    calls()
    os.unlink(fail)
    assert agent.poll(client, NS, "node-a", applied, path) == [f"{path} -i 0,1 -pl 201"]
    assert calls() == [["-i", "0,1", "-pl", "201"]]
    # a Pod whose limit cannot be read is reported by name; the Pod beside it on the GPU is served
    api.pods[(NS, names["0000"])]["metadata"]["annotations"]["carbonplanner.io/power-limit-w"] = "lots"
    assert agent.poll(client, NS, "node-b", {}, path) == [f"{path} -i 0 -pl 203"]
    assert f"Pod {names['0000']}: annotation carbonplanner.io/power-limit-w" in capsys.readouterr().err


def test_limit_commands_group_gpus_by_limit():
    agent = _agent()
    wanted = {0: 250.0, 1: 250.0, 2: 180.0, 3: 300.0}
    assert agent.limit_commands(wanted, {3: 300.0}) == [
        ["nvidia-smi", "-i", "0,1", "-pl", "250"],
        ["nvidia-smi", "-i", "2", "-pl", "180"],
    ]
    asks = {"a": (200.0, [0, 1]), "b": (240.0, [1])}
    assert agent.wanted_limits(asks) == {0: 200.0, 1: 240.0}


def test_the_script_runs_one_round_as_its_daemonset_runs_it(cluster, tool, tmp_path):
    api, _, names = cluster
    path, calls = tool
    env = {"KUBERNETES_API": api.url, "TOKEN_FILE": str(tmp_path / "token"), "NAMESPACE": NS, "NODE_NAME": "node-a",
           "GPU_TOOL": path, "PATH": "/usr/bin:/bin"}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{path} -i 0,1 -pl 201\n"
    assert calls() == [["-i", "0,1", "-pl", "201"]] and _applied(api, names["0001"]) == "201"


def test_the_agent_reads_the_annotations_the_executor_writes():
    agent = _agent()
    assert (agent.LIMIT, agent.APPLIED, agent.ITEM) == (POWER_LIMIT, POWER_APPLIED, ITEM_ANNOTATION)
    assert [agent.watts_text(w) for w in (250.0, 212.5, 233.25, 199.999)] == [watts_text(w) for w in
            (250.0, 212.5, 233.25, 199.999)] == ["250", "212.5", "233.25", "200"]  # fmt: skip
