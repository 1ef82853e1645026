"""Slurm's command-line clients as Python calls: what the `slurm` executor sends and reads.

    cli = SlurmCli(conf="/etc/slurm/slurm.conf", timeout_s=30)
    job_id = cli.sbatch(args, script)          # -> Slurm job id; SlurmRefused (the job) or SlurmUnavailable (Slurm)
    cli.jobs()                                 # squeue --json jobs[] (also recently finished ones)
    cli.finished()                             # the jobcomp/filetxt file: one dict per finished job
    cli.nodes()                                # sinfo --json nodes[]
    drained_nodes(cli)                         # node -> why Slurm drains it (DRAIN state)
    cli.update(job_id, StartTime=...); cli.cancel(job_id); cli.release(job_id); cli.batch_script(job_id)

Every call runs with TZ=UTC (Slurm's clients parse and print local times), SLURM_CONF when `conf` is set, and
SLURM_JWT from the variable `token_env` names (for clusters with AuthAltTypes=auth/jwt; never the token itself).
`squeue --json` answers 0 with an `errors` list when slurmctld is down, so its errors are checked too: a Slurm
that cannot be reached raises `SlurmUnavailable` naming the command and Slurm's own message.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd

DEFAULT_TIMEOUT_S = 30.0
# Slurm's messages when the controller cannot be reached (as opposed to a refused job)
_UNREACHABLE = ("unable to contact slurm controller", "connect failure", "connection refused", "socket timed out")


class SlurmUnavailable(RuntimeError):
    """slurmctld (or the clients) could not be reached: nothing was decided about any job."""


class SlurmRefused(RuntimeError):
    """Slurm answered and refused this one job (bad resources, bad time, ...)."""


class SlurmCli:
    def __init__(
        self,
        conf: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        jobcomp: str | None = None,
        token_env: str | None = None,
    ):
        self.conf = conf
        self.timeout_s = float(timeout_s)
        self._jobcomp = jobcomp
        self.token_env = token_env
        self.unreachable = False  # whether the last call found Slurm unreachable (SlurmUnavailable)

    def env(self) -> dict[str, str]:
        """The clients' environment: TZ=UTC, SLURM_CONF, and SLURM_JWT from `token_env` (auth/jwt clusters)."""
        env = {**os.environ, "TZ": "UTC"}
        if self.conf:
            env["SLURM_CONF"] = str(self.conf)
        if self.token_env:
            token = os.environ.get(self.token_env)
            if not token:
                raise SlurmUnavailable(f"environment variable {self.token_env} (setting token_env) holds no Slurm JWT")
            env["SLURM_JWT"] = token
        return env

    def run(self, args: list[str], stdin: str | None = None) -> str:
        """stdout of `args`; SlurmUnavailable when Slurm cannot be reached, SlurmRefused for another error."""
        try:
            out = self._run(args, stdin)
        except SlurmUnavailable:
            self.unreachable = True
            raise
        self.unreachable = False
        return out

    def _run(self, args: list[str], stdin: str | None) -> str:
        try:
            res = subprocess.run(
                args, input=stdin, env=self.env(), capture_output=True, text=True, timeout=self.timeout_s
            )
        except FileNotFoundError as exc:
            raise SlurmUnavailable(f"{args[0]}: Slurm's clients are not installed ({exc})") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{args[0]}: no answer from Slurm within {self.timeout_s:.0f} s") from None
        message = (res.stderr or "").strip()
        if res.returncode != 0:
            if any(text in message.lower() for text in _UNREACHABLE):
                raise SlurmUnavailable(f"{args[0]}: slurmctld unreachable: {message}")
            raise SlurmRefused(f"{args[0]}: {message or f'exit status {res.returncode}'}")
        return res.stdout

    def _json(self, args: list[str]) -> dict:
        doc = json.loads(self.run(args))
        errors = [e for e in doc.get("errors", []) if e]
        if errors:
            shown = "; ".join(f"{e.get('source')}: {e.get('description')}" for e in errors)
            self.unreachable = True
            raise SlurmUnavailable(f"{' '.join(args)}: slurmctld unreachable or failing: {shown}")
        return doc

    def sbatch(self, args: list[str], script: str) -> str:
        out = self.run(["sbatch", "--parsable", *args], stdin=script).strip()
        return out.split(";")[0]

    def jobs(self) -> list[dict]:
        """squeue --json jobs (it ignores filters; callers filter)."""
        return self._json(["squeue", "--json"]).get("jobs", [])

    def nodes(self) -> list[dict]:
        return self._json(["sinfo", "--json"]).get("nodes", [])

    def update(self, job_id: str, **fields) -> None:
        self.run(["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())])

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", str(job_id)])

    def release(self, job_id: str) -> None:
        self.run(["scontrol", "release", str(job_id)])

    def batch_script(self, job_id: str) -> str:
        """The batch script Slurm keeps for a job (``scontrol write batch_script <id> -``)."""
        return self.run(["scontrol", "write", "batch_script", str(job_id), "-"])

    def jobcomp_path(self) -> Path | None:
        """The jobcomp/filetxt file (setting `jobcomp`, else JobCompLoc of `scontrol show config`)."""
        if self._jobcomp is None:
            loc, kind = None, None
            for line in self.run(["scontrol", "show", "config"]).splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "JobCompLoc":
                    loc = value.strip()
                elif key.strip() == "JobCompType":
                    kind = value.strip()
            self._jobcomp = loc if kind == "jobcomp/filetxt" and loc else ""
        return Path(self._jobcomp) if self._jobcomp else None

    def finished(self) -> list[dict]:
        """The finished jobs of the jobcomp file (Key=Value per line; times in slurmctld's zone, run it in UTC)."""
        path = self.jobcomp_path()
        if path is None or not path.exists():
            return []
        out = []
        for line in path.read_text(errors="replace").splitlines():
            record = dict(part.split("=", 1) for part in line.split() if "=" in part)
            if "JobId" in record:
                out.append(record)
        return out


def epoch(value) -> pd.Timestamp | None:
    """A Slurm time (epoch seconds from --json, or a jobcomp ISO local time) as UTC; None when unset."""
    if value in (None, "", "Unknown", "None", 0, "0"):
        return None
    if isinstance(value, (int, float)):
        return pd.Timestamp(int(value), unit="s", tz="UTC")
    return pd.Timestamp(value, tz="UTC")


def gres_count(gres: str | None, name: str) -> int:
    """How many `name` units a GRES string holds: ``gpu:4,shard:40`` -> shard 40 (``gpu:a100:4(S:0)`` too)."""
    total = 0
    for part in str(gres or "").split(","):
        fields = part.split("(")[0].split(":")
        if fields and fields[0].removeprefix("gres/") == name and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def discover_nodes(cli: SlurmCli) -> list[dict]:
    """The cluster's nodes as the fleet declares them: name, gpus, cpus, memory_mib (and shards_per_gpu)."""
    out = []
    for node in cli.nodes():
        gpus = gres_count(node.get("gres"), "gpu")
        shards = gres_count(node.get("gres"), "shard")
        out.append(
            {
                "name": node["name"],
                "gpus": gpus,
                "cpus": int(node.get("cpus") or 0),
                "memory_mib": int(node.get("real_memory") or 0),
                "shards_per_gpu": shards // gpus if gpus and shards else 0,
            }
        )
    return sorted(out, key=lambda n: n["name"])


def drained_nodes(cli: SlurmCli) -> dict[str, str]:
    """Node name -> why Slurm starts no new job there (`drain_reasons` of ``sinfo --json``)."""
    return drain_reasons(cli.nodes())


def drain_reasons(nodes: list[dict]) -> dict[str, str]:
    """Of sinfo's node records, those with DRAIN among their states (sinfo shows `draining` while jobs still run,
    `drained` once idle) -> Slurm's states and the reason the operator gave. Slurm 22.05 gives the base state in
    `state` and DRAIN in `state_flags`; later versions list every state in `state`."""
    out = {}
    for node in nodes:
        states = node.get("state")
        words = [str(w).upper() for w in ([states] if isinstance(states, str) else list(states or []))]
        words += [str(w).upper() for w in node.get("state_flags") or [] if str(w).upper() not in words]
        if not any(w in ("DRAIN", "DRAINING", "DRAINED") for w in words):
            continue
        reason = str(node.get("reason") or "").strip()
        out[str(node["name"])] = f"Slurm state {'+'.join(words)}" + (f", reason {reason!r}" if reason else "")
    return out
