"""Start a real Airflow (standalone) on a free localhost port in a temporary home, drive it through the REST
API, and stop exactly the processes it started (its own process group)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "admin", "e2e-password"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class AirflowServer:
    home: Path
    warehouse: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    token: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = str(Path(sys.executable).parent)
        passwords = self.home / "passwords.json"
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(REPO_ROOT / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            # Paused until a test triggers them: no scheduled runs of other DAGs competing for the pool.
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="True",
            AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USER}:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
            AIRFLOW__COSMOS__ENABLE_TELEMETRY="False",
            AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            WAREHOUSE_PATH=str(self.warehouse),
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "dags")]),
            PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
            OMP_NUM_THREADS="1",
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 240) -> "AirflowServer":
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
        env = self.env()
        airflow = str(Path(sys.executable).parent / "airflow")
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
        subprocess.run([airflow, "pools", "set", "warehouse", "1", "DuckDB single writer"],
                       env=env, check=True, capture_output=True, timeout=120)
        log = open(self.home / "standalone.log", "wb")
        # Its own session/process group, so stopping it stops every child it started and nothing else.
        self.process = subprocess.Popen([airflow, "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=self.home)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"airflow standalone exited early: {self.log_tail()}")
            try:
                health = requests.get(f"{self.base}/api/v2/monitor/health", timeout=5)
                if health.ok and health.json().get("scheduler", {}).get("status") == "healthy":
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        else:
            raise TimeoutError(f"airflow not healthy in {timeout_s} s: {self.log_tail()}")
        reply = requests.post(f"{self.base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=30)
        reply.raise_for_status()
        self.token = reply.json()["access_token"]
        return self

    def log_tail(self, chars: int = 4000) -> str:
        path = self.home / "standalone.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, f"{self.base}/api/v2{path}", headers=headers, timeout=60, **kwargs)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self.api("GET", f"/dags/{dag_id}")
            if reply.ok:
                if reply.json().get("is_paused"):
                    self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
                return
            time.sleep(3)
        raise TimeoutError(f"DAG {dag_id} not parsed in {timeout_s} s: {self.log_tail()}")

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        self.wait_for_dag(dag_id)
        reply = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        assert reply.ok, reply.text
        return reply.json()["dag_run_id"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            reply = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            state = reply.json().get("state") if reply.ok else None
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        raise TimeoutError(f"{dag_id} run {run_id} still {state} after {timeout_s} s")

    def failed_task_logs(self, dag_id: str, run_id: str) -> str:
        out = []
        tasks = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json().get("task_instances", [])
        for ti in tasks:
            if ti.get("state") == "failed":
                log = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/1")
                out.append(f"--- {ti['task_id']}\n{log.text[-3000:]}")
        return "\n".join(out)

    def stop(self, grace_s: float = 20) -> None:
        if not self.process or self.process.poll() is not None:
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.5)  # the children shut down on their own after SIGTERM
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    """True while a non-zombie process of the group exists."""
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    return any(not stat.startswith("Z") for stat in out)
