"""Start a real Airflow (standalone) on a free localhost port in a temporary home, drive it through the REST
API, and stop exactly the processes it started: its process group, plus the task and dbt processes that leave
that group, recognised by this server's AIRFLOW_HOME in their environment (`leftovers()` lists what is left)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    pgid: int | None = None
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
            AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO_ROOT / "plugins"),
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
            # Each DAG file is parsed at start-up and again when it changes (the folder is listed every 5 s); the
            # default re-parse of all 13 files every 30 s only takes CPU from the tasks on 2 cores.
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="600",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            WAREHOUSE_PATH=str(self.warehouse),
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "dags")]),
            PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
            OMP_NUM_THREADS="1",
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 240) -> AirflowServer:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
        env = self.env()
        airflow = str(Path(sys.executable).parent / "airflow")
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
        subprocess.run(
            [airflow, "pools", "set", "warehouse", "1", "DuckDB single writer"],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        log = open(self.home / "standalone.log", "wb")
        # Its own session/process group, so stopping it stops every child it started and nothing else.
        self.process = subprocess.Popen(
            [airflow, "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.home,
        )
        self.pgid = os.getpgid(self.process.pid)  # == its pid (new session); kept for the leftover check
        if threading.current_thread() is threading.main_thread():
            # a SIGTERM to the test run unwinds it like Ctrl-C, so the caller's `finally: stop()` still runs
            self._sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:  # a start that fails half-way must not leave its processes behind
            self._wait_healthy(timeout_s)
            reply = requests.post(f"{self.base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=30)
            reply.raise_for_status()
            self.token = reply.json()["access_token"]
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"airflow standalone exited early: {self.log_tail()}")
            try:
                health = requests.get(f"{self.base}/api/v2/monitor/health", timeout=5)
                if health.ok and health.json().get("scheduler", {}).get("status") == "healthy":
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise TimeoutError(f"airflow not healthy in {timeout_s} s: {self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        path = self.home / "standalone.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def api(self, method: str, path: str, headers: dict | None = None, **kwargs) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        return requests.request(method, f"{self.base}/api/v2{path}", headers=headers, timeout=60, **kwargs)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> dict:
        """The DAG's REST record, once the DAG processor has parsed it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self.api("GET", f"/dags/{dag_id}")
            if reply.ok:
                return reply.json()
            time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} not parsed in {timeout_s} s: {self.log_tail()}")

    def dag_ids(self) -> list[str]:
        reply = self.api("GET", "/dags", params={"limit": 100})
        assert reply.ok, reply.text
        return sorted(d["dag_id"] for d in reply.json()["dags"])

    def wait_for_parsing(self, quiet_s: float = 8, timeout_s: float = 180) -> list[str]:
        """The DAG ids, once no new DAG has appeared for `quiet_s`: the DAG processor's first pass over the folder
        is done, so it no longer writes to the metadata database (on SQLite, each of its writes can make a
        concurrent request fail as locked)."""
        deadline = time.monotonic() + timeout_s
        seen, since = None, time.monotonic()
        while time.monotonic() < deadline:
            reply = self.api("GET", "/dags", params={"limit": 100})
            dag_ids = sorted(d["dag_id"] for d in reply.json().get("dags", [])) if reply.ok else []
            if dag_ids != seen:
                seen, since = dag_ids, time.monotonic()
            elif dag_ids and time.monotonic() - since >= quiet_s:
                return dag_ids
            time.sleep(1)
        raise TimeoutError(f"DAG list still changing after {timeout_s} s: {seen}")

    def pause(self, dag_id: str, paused: bool = True) -> None:
        reply = self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})
        assert reply.ok, reply.text

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """A manual run, then the DAG unpaused (the scheduler runs nothing of a paused DAG).

        A DAG with a time schedule is triggered for the logical date its next scheduled run would have, while that
        run is due: the scheduler does not create a run for a date that already has one, so unpausing it does not
        add a scheduled run for the wall-clock hour (outside the 2020-2021 data) beside ours. Once the next run lies
        in the future (the scheduler would hold a run there until then), the run has no logical date. The planning
        time comes from `conf`."""
        deadline = time.monotonic() + 120
        while True:
            dag = self.wait_for_dag(dag_id)
            run_after = dag.get("next_dagrun_run_after")
            due = run_after is None or _utc(run_after) <= datetime.now(UTC)
            body = {"logical_date": dag.get("next_dagrun_logical_date") if due else None, "conf": conf or {}}
            reply = self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)
            if reply.ok:
                break
            # at a wall-clock hour the scheduler creates the hour's runs: the metadata database may be busy for an
            # instant (5xx), or the run of that logical date may exist now (409); read the DAG again and retry
            retry = reply.status_code == 409 or reply.status_code >= 500
            assert retry and time.monotonic() < deadline, reply.text
            time.sleep(1)
        if dag.get("is_paused"):
            self.pause(dag_id, False)
        return reply.json()["dag_run_id"]

    def run_info(self, dag_id: str, run_id: str) -> dict:
        reply = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        return reply.json() if reply.ok else {}

    def runs(self, dag_id: str) -> list[dict]:
        reply = self.api("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})
        assert reply.ok, reply.text
        return reply.json()["dag_runs"]

    def clear(self, dag_id: str, run_id: str) -> str | None:
        """Clear every task of a finished run (as "Clear" in the UI does), so the scheduler runs it again; returns
        the run's previous end date, to tell the new outcome from the old one."""
        before = self.run_info(dag_id, run_id).get("end_date")
        reply = self.api("POST", f"/dags/{dag_id}/dagRuns/{run_id}/clear", json={"dry_run": False})
        assert reply.ok, reply.text
        return before

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 600, not_ended_at: str | None = None) -> str:
        """Poll until the run is success or failed (and, after a clear, has a new end date)."""
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            info = self.run_info(dag_id, run_id)
            state = info.get("state")
            if state in ("success", "failed") and (not_ended_at is None or info.get("end_date") != not_ended_at):
                return state
            time.sleep(2)
        reply = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        tasks = {ti["task_id"]: ti["state"] for ti in reply.json().get("task_instances", [])} if reply.ok else {}
        raise TimeoutError(f"{dag_id} run {run_id} still {state} after {timeout_s} s; tasks: {tasks}")

    def backfill(
        self,
        dag_id: str,
        from_date: str,
        to_date: str,
        conf: dict | None = None,
        max_active_runs: int = 1,
        tries: int = 10,
    ) -> dict:
        """An Airflow backfill (`POST /backfills`): one run per schedule interval whose logical date lies in
        [from_date, to_date] (both included), started in logical-date order; returns the backfill's record. On
        SQLite, creating the runs fails (503) when another Airflow process writes meanwhile: it is created after the
        DAG processor's first pass, and tried again up to `tries` times. The scheduler starts backfill runs of
        unpaused DAGs only, so the DAG is unpaused afterwards."""
        self.wait_for_dag(dag_id)
        self.wait_for_parsing()
        body = {
            "dag_id": dag_id,
            "from_date": from_date,
            "to_date": to_date,
            "dag_run_conf": conf or {},
            "max_active_runs": max_active_runs,
            "run_backwards": False,
            "reprocess_behavior": "none",
        }
        for attempt in range(1, tries + 1):
            reply = self.api("POST", "/backfills", json=body)
            if reply.status_code != 503:
                break
            print(f"backfill of {dag_id}, try {attempt}: {reply.status_code} {reply.text[:200]}")
            time.sleep(2)  # SQLite busy: Airflow removed the partly created backfill; try again
        assert reply.ok, reply.text
        self.pause(dag_id, False)
        return reply.json()

    def backfill_runs(self, dag_id: str) -> list[dict]:
        """The DAG's backfill runs, in logical-date order."""
        reply = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns",
            params={"run_type": "backfill", "order_by": "logical_date", "limit": 100},
        )
        assert reply.ok, reply.text
        return reply.json()["dag_runs"]

    def wait_for_backfill(self, backfill: dict, timeout_s: float = 1800) -> list[dict]:
        """Poll until the backfill has completed, then return its runs (logical-date order). The first failed run
        cancels the backfill (the runs after it would plan on a warehouse that already differs) and fails, with its
        failed tasks' logs."""
        deadline = time.monotonic() + timeout_s
        dag_id, path = backfill["dag_id"], f"/backfills/{backfill['id']}"
        while time.monotonic() < deadline:
            failed = [r for r in self.backfill_runs(dag_id) if r["state"] == "failed"]
            if failed:
                self.api("PUT", f"{path}/cancel")
                run_id = failed[0]["dag_run_id"]
                raise AssertionError(f"backfill run {run_id} failed:\n{self.failed_task_logs(dag_id, run_id)}")
            reply = self.api("GET", path)
            assert reply.ok, reply.text
            if reply.json().get("completed_at"):
                return self.backfill_runs(dag_id)
            time.sleep(5)
        states = [r["state"] for r in self.backfill_runs(dag_id)]
        raise TimeoutError(f"backfill {backfill['id']} of {dag_id} not complete after {timeout_s} s: {states}")

    def failed_task_logs(self, dag_id: str, run_id: str, chars: int = 4000) -> str:
        """The end of the log of every failed task of the run (its last try), for the assertion message."""
        out = []
        reply = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        for ti in reply.json().get("task_instances", []) if reply.ok else []:
            if ti.get("state") in ("failed", "up_for_retry"):
                log = self.api(
                    "GET",
                    f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti['task_id']}/logs/"
                    f"{max(ti.get('try_number') or 1, 1)}",
                    params={"full_content": "true", "map_index": ti.get("map_index", -1)},
                    headers={"Accept": "application/json"},
                )
                out.append(f"--- failed task {ti['task_id']} (try {ti.get('try_number')}):\n{_log_text(log)[-chars:]}")
        return "\n".join(out) or f"(no failed task in {dag_id} {run_id}; reply {reply.status_code})"

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM standalone's process group, then SIGKILL whatever of ours is left. "Ours" = the group plus every
        process whose environment carries this server's AIRFLOW_HOME: task processes put themselves in their own
        process groups and Cosmos starts dbt in a new session, so the group alone does not cover them."""
        if self.process is None:
            return
        if getattr(self, "_sigterm", None) is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self.process.poll() is None:
            os.killpg(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (_group_alive(self.pgid) or self.leftovers()):
            time.sleep(0.5)  # the children shut down on their own after SIGTERM
        if _group_alive(self.pgid):
            os.killpg(self.pgid, signal.SIGKILL)
        for line in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_group_alive(self.pgid) or self.leftovers()):
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """Live processes started by this server (`pid args`): its process group and every process whose
        environment has its AIRFLOW_HOME (unique per test), zombies excluded."""
        marker = f"AIRFLOW_HOME={self.home}".encode() + b"\0"
        found = {}
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                in_group = self.pgid is not None and os.getpgid(int(proc.name)) == self.pgid
                if in_group or marker in (proc / "environ").read_bytes():
                    found[int(proc.name)] = (
                        (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    )
            except (OSError, IndexError):
                continue  # exited meanwhile, or not ours to read
        found.pop(os.getpid(), None)
        return [f"{pid} {args}" for pid, args in sorted(found.items())]


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _log_text(reply: requests.Response) -> str:
    """A task log from the REST API as text: Airflow 3 returns structured records (event, level, error_detail)."""
    try:
        content = reply.json()["content"]
    except (ValueError, KeyError, TypeError):
        return reply.text
    lines = []
    for item in content if isinstance(content, list) else [content]:
        if not isinstance(item, dict):
            lines.append(str(item))
            continue
        lines.append(" ".join(str(item[k]) for k in ("timestamp", "level", "event") if item.get(k)))
        if item.get("error_detail"):
            lines.append(json.dumps(item["error_detail"], default=str))
    return "\n".join(lines)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _group_alive(pgid: int) -> bool:
    """True while a non-zombie process of the group exists."""
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    return any(not stat.startswith("Z") for stat in out)
