"""A real one-node Slurm for tests: munged, slurmctld and slurmd with a generated configuration in a folder.

    cluster = LocalSlurm(tmp_dir).start()      # node `node-01` with 4 GPUs (40 shards), 16 CPUs, 64 GiB
    ...                                         # cluster.env: SLURM_CONF for clients
    cluster.stop_controller(); cluster.start_controller()   # an outage
    cluster.stop()                              # exactly the processes it started, then munged

GPU GRES need character devices, so the folder holds /dev/nvidia-like nodes made with mknod (root only). The
prolog runs with an `nvidia-smi` first on its PATH that only records its arguments (there are no GPUs here), so
the shipped power-limit prolog and the watcher it starts are checked as they are (the watcher polling every
second). The
scheduler runs every second (`sched_interval=1,bf_interval=1`) so a job starts within a second of its begin time.
Recipe and pitfalls: docs/operating.md, "Run it on your Slurm cluster".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODE = "node-01"
GPUS = 4
SHARDS_PER_GPU = 8  # not ten: the executor must read it from the cluster
CPUS = 16
MEMORY_MIB = 65536
PARTITIONS = ("gpu", "gpu-b")  # one node in both: two fleet clusters on one Slurm, one per partition

CONF = """\
ClusterName=cptest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
MessageTimeout=5
MinJobAge={min_job_age}
Prolog={prolog}
GresTypes=gpu,shard
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} \
ThreadsPerCore=1 RealMemory={memory} Gres=gpu:{gpus},shard:{shards} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu-b Nodes={node} Default=NO MaxTime=INFINITE State=UP
"""
GRES = "Name=gpu File={d}/dev/nvidia[0-{last}]\nName=shard Count={shards} File={d}/dev/nvidia[0-{last}]\n"


def missing_packages() -> list[str]:
    return [p for p in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(p) is None]


def leftover_processes(conf: Path) -> list[int]:
    """Pids of the processes started for the cluster of `conf` (their environment holds SLURM_CONF=`conf`)."""
    marker = f"SLURM_CONF={conf}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env:
            out.append(int(entry.name))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSlurm:
    """One node, one partition; every daemon's pid is kept and only those are stopped."""

    def __init__(self, folder: Path, prolog: Path | None = None, min_job_age_s: int = 600):
        self.dir = Path(folder)
        self.prolog = prolog
        self.min_job_age_s = min_job_age_s  # how long squeue lists an ended job (then only the jobcomp file has it)
        self.procs: dict[str, subprocess.Popen] = {}
        self.munged_pid: int | None = None

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "TZ": "UTC"}

    def write_config(self) -> None:
        d = self.dir
        os.chmod(d, 0o755)  # munged (user munge) must reach its socket folder: make `d` under a traversable parent
        for sub in ("munge", "dev", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(d / "munge", "munge", "munge")
        os.chmod(d / "munge", 0o755)
        (d / "bin").mkdir(exist_ok=True)
        recorder = d / "bin" / "nvidia-smi"
        recorder.write_text(f'#!/bin/sh\necho "$*" >> {d}/log/nvidia-smi.log\n')
        recorder.chmod(0o755)
        for i in range(GPUS):
            dev = d / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))
        host = socket.gethostname().split(".")[0]
        prolog = "/bin/true"
        if self.prolog is not None:  # slurmd gives prologs no PATH: the wrapper puts the recorder first
            prolog = d / "prolog.sh"  # and makes the power-limit watcher it starts poll every second
            prolog.write_text(
                f"#!/bin/sh\nPATH={d}/bin:/usr/sbin:/usr/bin:/sbin:/bin POWER_LIMIT_POLL_S=1 exec {self.prolog}\n"
            )
            prolog.chmod(0o755)
        self.conf.write_text(
            CONF.format(
                d=d,
                host=host,
                node=NODE,
                cpus=CPUS,
                memory=MEMORY_MIB,
                gpus=GPUS,
                shards=GPUS * SHARDS_PER_GPU,
                prolog=prolog,
                min_job_age=self.min_job_age_s,
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
            )
        )
        (d / "gres.conf").write_text(GRES.format(d=d, last=GPUS - 1, shards=GPUS * SHARDS_PER_GPU))

    def start(self) -> LocalSlurm:
        self.write_config()
        m = self.dir / "munge"
        subprocess.run(
            [
                "runuser", "-u", "munge", "--", "munged", f"--socket={m}/munge.socket.2",
                f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed",
            ],
            check=True,
        )  # fmt: skip
        self.munged_pid = int((m / "munged.pid").read_text().split()[0])
        self.start_controller()
        self._spawn("slurmd")
        self.wait_idle()
        return self

    def _spawn(self, name: str) -> None:
        out = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon keeps it
        self.procs[name] = subprocess.Popen([name, "-D"], env=self.env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def nvidia_smi_calls(self) -> list[str]:
        """The arguments the prolog gave `nvidia-smi` (a recorder first on the prolog's PATH: no GPUs here)."""
        log = self.dir / "log" / "nvidia-smi.log"
        return log.read_text().splitlines() if log.exists() else []

    def start_controller(self) -> None:
        self._spawn("slurmctld")

    def stop_controller(self) -> None:
        self._stop("slurmctld")

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until the node answers idle (or mixed/allocated) to sinfo."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            res = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=20
            )
            last = (res.stdout + res.stderr).strip()
            if res.returncode == 0 and last.split() and last.split()[0].rstrip("*") in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"local Slurm not ready after {timeout_s:.0f} s: {last!r}; logs in {self.dir / 'log'}")

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons, then every job step and script they left (slurmstepd outlives slurmd):
        the processes whose environment names this cluster's SLURM_CONF, then munged."""
        if "slurmctld" in self.procs:
            for partition in PARTITIONS:
                subprocess.run(["scancel", f"--partition={partition}"], env=self.env, capture_output=True, timeout=20)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                res = subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=20)
                if res.returncode != 0 or not res.stdout.strip():
                    break
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld"):
            self._stop(name)
        for pid in leftover_processes(self.conf):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.munged_pid is not None:
            try:
                os.kill(self.munged_pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # it writes its seed file on the way out: wait for it
                    os.kill(self.munged_pid, 0)
                    time.sleep(0.05)
            except ProcessLookupError:
                pass
            self.munged_pid = None


def write_fleet(path: Path, settings: dict) -> None:
    """A fleet file with one V100 cluster, `slurm-v100`, whose nodes are the test Slurm's and whose executor is
    `slurm` with `settings`."""
    import yaml

    from scheduling.executors.registry import make_executor

    nodes = make_executor("slurm", {"conf": settings["conf"]}).nodes()
    spec = {
        "version": 1,
        "regions": {"us-west": {"zone": "CISO"}},
        "gpu_models": {"V100": {"idle_w": 40, "peak_w": 300, "gavel": "v100"}},
        "clusters": [
            {
                "name": "slurm-v100",
                "region": "us-west",
                "gpu_model": "V100",
                "nodes": [{k: n[k] for k in ("name", "gpus", "cpus", "memory_mib")} for n in nodes],
                "executor": {"kind": "slurm", **settings},
            }
        ],
    }
    path.write_text(yaml.safe_dump(spec))


def wait_for(predicate, timeout_s: float = 30.0, what: str = ""):
    """`predicate()`'s first value that is neither None nor False, polled until `timeout_s` (then AssertionError
    naming `what`): the Slurm tests wait on what they need, never a fixed time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None and value is not False:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
