"""Airflow as the scale-out deployment runs it, on one machine: api-server, scheduler and dag-processor as separate
processes with the CeleryExecutor, the metadata database on PostgreSQL, Redis as the broker, and two Celery workers
(concurrency 1 each, told apart by the hostname their tasks record). Driven through the REST API like
tests/e2e/harness.py's AirflowServer, whose client methods it keeps; it starts and stops its own processes: each in its
own session, stopped by group, plus whatever task process still carries this home in its environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.e2e.harness import PASSWORD, USER, AirflowServer, free_port

WORKERS = ("worker-a", "worker-b")
COMPONENTS = ("api-server", "scheduler", "dag-processor")


def worker_hostname() -> str:
    """Airflow's hostname_callable in the stack: the worker's name (STACK_WORKER_NAME), else the machine's."""
    import socket

    return os.environ.get("STACK_WORKER_NAME") or socket.getfqdn()


@dataclass
class CeleryStack(AirflowServer):
    postgres_port: int = 0
    postgres_password: str = ""
    broker_url: str = ""
    children: dict[str, subprocess.Popen] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = super().env()
        database = f"airflow@127.0.0.1:{self.postgres_port}/airflow"
        env.update(
            AIRFLOW__CORE__EXECUTOR="CeleryExecutor",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"postgresql+psycopg2://{database}",
            AIRFLOW__CELERY__RESULT_BACKEND=f"db+postgresql+psycopg2://{database}",
            AIRFLOW__CELERY__BROKER_URL=self.broker_url,
            AIRFLOW__CELERY__WORKER_CONCURRENCY="1",
            AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER="1",
            PGPASSWORD=self.postgres_password,
            # identical in every component, or the workers' tokens are refused by the Execution API
            AIRFLOW__API_AUTH__JWT_SECRET="celery-stack-jwt-secret-0123456789abcdef",
            AIRFLOW__API__SECRET_KEY="celery-stack-api-secret",
            AIRFLOW__CORE__HOSTNAME_CALLABLE="tests.deploy.celery_stack.worker_hostname",
        )
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "wb")
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopping it stops its children and nothing else
            cwd=self.home,
        )
        log.close()
        self.children[name] = process
        return process

    def start(self, timeout_s: float = 300) -> CeleryStack:
        import json

        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
        env = self.env()
        airflow = str(Path(sys.executable).parent / "airflow")
        for args in (["db", "migrate"], ["pools", "set", "warehouse", "1", "DuckDB single writer"]):
            out = subprocess.run([airflow, *args], env=env, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, f"airflow {' '.join(args)}: {out.stdout[-2000:]}{out.stderr[-3000:]}"
        try:
            for name in COMPONENTS:
                self._spawn(name, [name], env)
            self.process = self.children["api-server"]
            self.pgid = self.process.pid
            for name in WORKERS:
                worker_env = {
                    **env,
                    "STACK_WORKER_NAME": name,
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                }
                self._spawn(name, ["celery", "worker", "--celery-hostname", f"{name}@%h"], worker_env)
            self._wait_healthy(timeout_s)
            reply = requests.post(f"{self.base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=30)
            reply.raise_for_status()
            self.token = reply.json()["access_token"]
            for name, process in self.children.items():
                assert process.poll() is None, f"{name} exited: {self.log_tail(name=name)}"
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, chars: int = 4000, name: str | None = None) -> str:
        names = [name] if name else list(self.children)
        out = []
        for each in names:
            path = self.home / f"{each}.log"
            if path.exists():
                out.append(f"--- {each}:\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def task_hosts(self, dag_id: str, run_id: str) -> dict[str, str]:
        """task id -> the hostname its (last) try ran on."""
        reply = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        assert reply.ok, reply.text
        return {ti["task_id"]: ti.get("hostname") for ti in reply.json()["task_instances"]}

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM every component's group (workers first: they finish or hand back their task), then SIGKILL what is
        left of ours: the groups and every process whose environment has this home."""
        order = [n for n in WORKERS if n in self.children] + [n for n in self.children if n not in WORKERS]
        for name in order:
            if self.children[name].poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.children[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.leftovers():
            time.sleep(0.5)
        for process in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for line in self.leftovers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        for process in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.leftovers():
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """Live processes of this stack (`pid args`): the components' groups and every process with its home."""
        marker = f"AIRFLOW_HOME={self.home}".encode() + b"\0"
        groups = {p.pid for p in self.children.values()}
        found = {}
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                if os.getpgid(int(proc.name)) in groups or marker in (proc / "environ").read_bytes():
                    found[int(proc.name)] = (
                        (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    )
            except (OSError, IndexError):
                continue
        found.pop(os.getpid(), None)
        return [f"{pid} {args}" for pid, args in sorted(found.items())]
