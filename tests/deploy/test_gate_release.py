"""The fail-open gate release (deploy/kubernetes/gate_release.py), run as its CronJob runs it, against the local
recording API server: with the planner gone, a gated Pod is released once its latest timely start has passed;
a Pod not yet due, a cancelled Pod and a deleted one keep their gate."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from scheduling.executors.registry import make_executor
from scheduling.output.schedules import GATE_NAME
from tests.conftest import REPO_ROOT
from tests.scheduling.executor_samples import PLAN_TIME, plan_id_at, sample_items
from tests.scheduling.k8s_api_server import KubeApiServer

SCRIPT = REPO_ROOT / "deploy" / "kubernetes" / "gate_release.py"
CLOCK = {"plan_origin": "2021-07-15T00:00Z", "wall_origin": "2026-11-26T00:00Z"}


def _run(api, token_file, now: str) -> str:
    env = {"KUBERNETES_API": api.url, "TOKEN_FILE": str(token_file), "NAMESPACE": "gpu-jobs", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), "--now", now], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_releases_due_pods_without_the_planner(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("t\n")
    monkeypatch.setenv("K8S_TOKEN", "t")
    with KubeApiServer(token="t") as api:
        executor = make_executor(
            "kubernetes", {"host": api.url, "token_env": "K8S_TOKEN", "clock": CLOCK, "fail_open_after_min": 30}
        )
        items = sample_items(4)  # job 3 starts with job 0 but is deleted by hand first
        items["start_time"] += pd.Timedelta(hours=2)  # 14:00 plan time: 2026-11-26T14:00Z on the cluster
        items["end_time"] += pd.Timedelta(hours=2)
        items.loc[2, ["start_time", "end_time"]] += pd.Timedelta(hours=3)  # job 2 starts at 17:00
        records = executor.dispatch(plan_id_at(PLAN_TIME), items).set_index("job_id")
        executor.cancel("globex/job-0001", PLAN_TIME + pd.Timedelta(hours=1))
        names = {job: ref.split("/")[-1] for job, ref in records["executor_ref"].items()}
        gated = lambda: {n for (_, n), p in api.pods.items() if p["spec"].get("schedulingGates")}  # noqa: E731
        api.delete_pod("gpu-jobs", names["globex/job-0003"], at="2026-11-26T13:00:00Z")  # held by its finalizer
        assert _run(api, token, "2026-11-26T14:29:00Z") == ""  # at the planned start: the planner's turn
        assert _run(api, token, "2026-11-26T14:30:00Z") == f"released gpu-jobs/{names['acme/job-0000']}\n"
        assert gated() == {names["globex/job-0001"], names["acme/job-0002"], names["globex/job-0003"]}
        patch = [r for r in api.requests if r["method"] == "PATCH"][-1]
        assert patch["content_type"] == "application/json-patch+json" and patch["authorization"] == "Bearer t"
        assert patch["body"][0] == {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE_NAME}
        _run(api, token, "2026-11-26T18:00:00Z")
        assert gated() == {names["globex/job-0001"], names["globex/job-0003"]}  # cancelled, deleted: never released
