"""Schedule files for executors, versioned by plan time and written atomically.

    from scheduling.output.schedules import write_schedules, schedule_dir_for, verify_schedule_dir

    result = write_schedules(plan, root="var/schedules")   # -> ScheduleResult(path, files, plan_id)
    verify_schedule_dir(result.path)                       # re-hashes every file against index.json

Layout of `<root>/<plan time>/` (plan time filesystem-safe, e.g. ``2021-07-15T12-00Z``)::

    plan.json                         plan metadata, clusters, unplaced jobs
    clusters/<cluster>.json           one per cluster: plan metadata + that cluster's assignments
    k8s/<cluster>/<job>.yaml          one Pod per job
    slurm/<cluster>/<job>.sbatch      one Slurm batch header per job
    index.json                        every other file with its sha256 and size (written last)

The per-job files (`JOB_FILES`) are written for every cluster by default; `job_files` (cluster -> kinds) limits
them to what each cluster's executor reads (the replay executor reads none).

Kubernetes manifests follow the GPU-sharing annotations of the openb trace's simulator (hkust-adsl/
kubernetes-scheduler-simulator, `pod_csv_to_yaml.py`; the openb README itself names none):
``alibabacloud.com/gpu-milli`` (share per device, 1000 = whole GPU), ``alibabacloud.com/gpu-count``,
``alibabacloud.com/gpu-index`` (the planned device indexes joined by ``-``) and ``alibabacloud.com/gpu-card-model``
(when the plan knows the GPU model). Every GPU job also requests ``nvidia.com/gpu`` (its GPU count), so that a stock
NVIDIA device plugin runs it: a share then gets whole GPUs, since files cannot know how the cluster shares GPUs (the
`kubernetes` executor requests the share its cluster's `sharing` names, `executors.k8s_sharing`).

Start gate (the choice): every Pod carries a ``schedulingGates`` entry ``carbonplanner.io/start-time`` and the
planned start in the annotation of the same name. A gate controller (or ``kubectl patch`` by a cron job) removes
the gate when the time comes; until then the Pod stays Pending and holds no resources. Because a Pod with
``schedulingGates`` may not set ``nodeName`` (the API rejects it), the planned node is pinned with
``nodeSelector: kubernetes.io/hostname``. As a second guard an init container sleeps until the planned start, so
a gate removed too early still does not start the job early. ``activeDeadlineSeconds`` is set to the time from
the planned start to the job's deadline when the plan carries one. The GPU power limit is the annotation
``carbonplanner.io/power-limit-w`` and the container env ``GPU_POWER_LIMIT_W`` (applied by the node's agent, e.g.
``nvidia-smi -pl``, which needs privileges a job does not have).

The job's command, when the assignment carries one (`command`, from the job's payload: a list of arguments, or a
shell string run through ``/bin/sh -c``), is the Pod's container command and the Slurm script's ``srun`` line, each
argument quoted (otherwise ``srun /bin/sh -c "$JOB_COMMAND"``, set by whoever submits the script).

Slurm headers: ``--begin`` (planned start, UTC), ``--time`` (planned duration, rounded up to a minute),
``--deadline`` (when the plan carries a deadline), ``--nodelist`` (the planned node), ``--gres=gpu:<n>`` for whole
GPUs or ``--gres=shard:<n>`` for shares (the assignment's ``shards_per_gpu``, the files executor's setting, else
``SHARDS_PER_GPU`` = 10 shards per GPU; n rounded up), ``--comment`` with the plan id. Slurm reads times in
slurmctld's time zone: run it with TZ=UTC. The times are plan times unless `to_wall` maps them onto the clock of
whoever starts the jobs (the `files` executor's `clock` setting: a replayed plan handed to a live cluster); the plan
and cluster files always hold plan times.

Atomicity: everything is built in a temporary sibling directory (``.tmp-<name>-<pid>``), each file and directory
fsynced, then renamed into place. An older version of the same plan time is swapped out atomically with
``renameat2(RENAME_EXCHANGE)`` where the kernel and filesystem support it; otherwise the old directory is renamed
aside (``.old-<name>``), the new one renamed in, and the old one removed. A run killed at any point leaves either
the previous or the new complete directory at ``<root>/<name>``: leftovers are cleaned up (and an aside copy put
back if the final name is missing) by `recover`, which every write runs first under the root's lock file.
Output is byte-identical for the same plan: sorted keys, no wall-clock timestamps.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from common.jsonutil import canonical_json, to_jsonable
from common.timeutil import iso_z, utc
from scheduling.output.plan_store import plan_fields, plan_id_for, summary_of
from warehouse.config import var_dir

DOMAIN = "carbonplanner.io"
GATE_NAME = f"{DOMAIN}/start-time"
NAMESPACE = "gpu-jobs"
WAIT_IMAGE = "busybox:1.36"
DEFAULT_IMAGE = "registry.invalid/gpu-jobs/REPLACE-ME:latest"  # the job's own image when the plan carries one
SHARDS_PER_GPU = 10
ToWall = Callable[[pd.Timestamp], pd.Timestamp]  # plan time -> the clock of whoever starts the jobs
# libyaml's emitter writes the same bytes as the pure-Python one for these manifests, about 5x faster
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
ANN_GPU_MILLI = "alibabacloud.com/gpu-milli"
ANN_GPU_COUNT = "alibabacloud.com/gpu-count"
ANN_GPU_INDEX = "alibabacloud.com/gpu-index"
ANN_GPU_MODEL = "alibabacloud.com/gpu-card-model"
INDEX = "index.json"
JOB_FILES = ("k8s", "slurm")


# ------------------------------------------------------------------------------------------------ names


def schedule_dirname(plan_time) -> str:
    """The plan time as a directory name: 2021-07-15T12-00Z (seconds added only when not zero)."""
    ts = utc(plan_time).floor("s")
    return ts.strftime("%Y-%m-%dT%H-%M-%SZ") if ts.second else ts.strftime("%Y-%m-%dT%H-%MZ")


def default_root() -> Path:
    """SCHEDULES_DIR, else var/schedules."""
    raw = os.environ.get("SCHEDULES_DIR")
    if raw:
        return Path(raw)

    return var_dir() / "schedules"


def schedule_dir_for(plan_time, root: str | Path | None = None) -> Path:
    return Path(root or default_root()) / schedule_dirname(plan_time)


def resolve_schedule_dir(plan_time, root: str | Path | None = None) -> Path | None:
    """The directory a reader should use for `plan_time`: the final one, else the aside copy a writer killed
    between its two renames left behind (fallback path only), else None."""
    final = schedule_dir_for(plan_time, root)
    if final.exists():
        return final
    aside = final.with_name(f".old-{final.name}")
    return aside if aside.exists() else None


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def file_stem(name: str) -> str:
    """A file-name-safe form of a job or cluster name (a short hash added when characters had to change)."""
    safe = _SAFE.sub("_", str(name)).strip("._") or "x"
    if safe != str(name):
        safe = f"{safe}-{_short_hash(str(name))}"
    return safe[:120]


def dns_label(name: str, prefix: str = "") -> str:
    """An RFC 1123 label (lowercase alphanumerics and '-', at most 63 characters)."""
    raw = f"{prefix}{name}"
    label = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-") or "x"
    if label != raw or len(label) > 63:
        h = _short_hash(raw)
        label = f"{label[: 63 - len(h) - 1].rstrip('-')}-{h}"
    return label


def node_hostname(node: str | None, cluster: str | None) -> str | None:
    """The node's name inside its cluster: the fleet names nodes ``<cluster>/<node>[#copy]``."""
    if node is None:
        return None
    text = str(node)
    if cluster and text.startswith(f"{cluster}/"):
        text = text[len(cluster) + 1 :]
    text = text.replace("#", "-c")
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return text[:63] or None


# ------------------------------------------------------------------------------------------------ rendering


def _value(row: dict, key: str) -> Any:
    v = row.get(key)
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    try:
        if v is pd.NaT or (not isinstance(v, (str, list, tuple, dict)) and pd.isna(v)):
            return None
    except (TypeError, ValueError):
        pass
    return v


def _devices(row: dict) -> list[int]:
    text = _value(row, "gpu_devices")
    if text is None:
        return []
    return [int(x) for x in str(text).split(",") if x.strip() != ""]


def _deadline(row: dict, record: dict | None) -> pd.Timestamp | None:
    for source in (row, record or {}):
        v = _value(source, "deadline") if isinstance(source, dict) else None
        if v is not None:
            try:
                return utc(v)
            except (TypeError, ValueError):
                continue
    return None


def _plan_meta(fields: dict, plan_id: str) -> dict:
    return {
        "plan_id": plan_id,
        "plan_time": iso_z(fields["plan_time"]),
        "policy": fields["policy"],
        "forecast_version": fields["forecast_version"],
    }


def _assignment_records(frame: pd.DataFrame) -> list[dict]:
    rows = []
    for row in frame.to_dict(orient="records"):
        rows.append({k: to_jsonable(_value(row, k)) for k in row})
    return rows


def k8s_manifest(row: dict, meta: dict, record: dict | None = None) -> dict:
    """The Pod for one assignment (see the module doc for the start gate and annotations)."""
    job_id, cluster = str(row["job_id"]), _value(row, "cluster")
    start, end = utc(row["start_time"]), utc(row["end_time"])
    count = int(_value(row, "gpu_count") or 0)
    milli = int(_value(row, "gpu_milli") or (1000 if count else 0))
    devices = _devices(row)
    power = _value(row, "power_limit_w")
    deadline = _deadline(row, record)
    annotations = {
        f"{DOMAIN}/plan-id": meta["plan_id"],
        f"{DOMAIN}/plan-time": meta["plan_time"],
        f"{DOMAIN}/policy": meta["policy"],
        f"{DOMAIN}/job-id": job_id,
        f"{DOMAIN}/cluster": str(cluster),
        f"{DOMAIN}/region": str(_value(row, "region")),
        f"{DOMAIN}/node": str(_value(row, "node")),
        GATE_NAME: iso_z(start),
        f"{DOMAIN}/end-time": iso_z(end),
        f"{DOMAIN}/expected-kgco2e": _fmt(_value(row, "expected_kgco2e"), 6),
        f"{DOMAIN}/expected-energy-kwh": _fmt(_value(row, "expected_energy_kwh"), 6),
        f"{DOMAIN}/priority": _fmt(_value(row, "priority"), 6),
        f"{DOMAIN}/forecast-version": str(meta.get("forecast_version")),
    }
    if power is not None:
        annotations[f"{DOMAIN}/power-limit-w"] = _fmt(power, 0)
    if deadline is not None:
        annotations[f"{DOMAIN}/deadline"] = iso_z(deadline)
    for key in ("status", "workload_class", "checkpointing"):
        if _value(row, key) is not None:
            annotations[f"{DOMAIN}/{key.replace('_', '-')}"] = str(_value(row, key)).lower()
    if count:
        annotations[ANN_GPU_MILLI] = str(max(0, min(1000, milli)))
        annotations[ANN_GPU_COUNT] = str(count)
        if devices:
            annotations[ANN_GPU_INDEX] = "-".join(str(d) for d in devices)
        model = _value(row, "gpu_model")
        if model is not None:
            annotations[ANN_GPU_MODEL] = str(model)
    requests: dict[str, str] = {}
    if _value(row, "cpu_milli") is not None:
        requests["cpu"] = f"{int(_value(row, 'cpu_milli'))}m"
    if _value(row, "memory_mib") is not None:
        requests["memory"] = f"{int(_value(row, 'memory_mib'))}Mi"
    limits = dict(requests)
    if count:  # a share too: a stock device plugin gives it whole GPUs (the kubernetes executor asks for the share)
        limits["nvidia.com/gpu"] = str(count)
    env = [
        {"name": "PLAN_ID", "value": meta["plan_id"]},
        {"name": "PLANNED_START", "value": iso_z(start)},
        {"name": "PLANNED_END", "value": iso_z(end)},
    ]
    if power is not None:
        env.append({"name": "GPU_POWER_LIMIT_W", "value": _fmt(power, 0)})
    if devices:
        env.append({"name": "PLANNED_GPU_DEVICES", "value": ",".join(str(d) for d in devices)})
    start_epoch = int(start.timestamp())
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": GATE_NAME}],
        "restartPolicy": "OnFailure",
        "initContainers": [
            {
                "name": "wait-for-start",
                "image": WAIT_IMAGE,
                "command": ["sh", "-c", f'while [ "$(date -u +%s)" -lt {start_epoch} ]; do sleep 30; done'],
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": str(_value(row, "image") or DEFAULT_IMAGE),
                "env": env,
                "resources": {"requests": requests, "limits": limits},
            }
        ],
    }
    if _value(row, "command") is not None:
        spec["containers"][0]["command"] = command_args(_value(row, "command"))
    host = node_hostname(_value(row, "node"), cluster)
    if host:
        spec["nodeSelector"] = {"kubernetes.io/hostname": host}
    if deadline is not None and deadline > start:
        spec["activeDeadlineSeconds"] = int((deadline - start).total_seconds())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": dns_label(job_id),
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/managed-by": "carbon-planner",
                f"{DOMAIN}/plan-time": schedule_dirname(meta["plan_time"]),
                f"{DOMAIN}/policy": dns_label(meta["policy"]),
                f"{DOMAIN}/cluster": dns_label(str(cluster)),
            },
            "annotations": annotations,
        },
        "spec": spec,
    }


def _fmt(value: Any, digits: int) -> str:
    if value is None:
        return "null"
    f = float(value)
    if math.isnan(f):
        return "null"
    return f"{f:.{digits}f}" if digits else str(int(round(f)))


def command_args(command) -> list[str] | None:
    """A job's command as arguments: the queue keeps it as JSON text, a list of arguments (run as given) or one shell
    string (run through ``/bin/sh -c``); text that is not JSON is a shell string."""
    if command is None:
        return None
    try:
        value = json.loads(command) if isinstance(command, str) else command
    except ValueError:
        value = command
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return ["/bin/sh", "-c", str(value)]


def srun_line(command) -> str | None:
    """The batch script's ``srun`` line of a job's command, each argument quoted (never the whole line as one word)."""
    args = command_args(command)
    return None if args is None else "srun " + shlex.join(args)


def _slurm_time(ts: pd.Timestamp) -> str:
    return utc(ts).strftime("%Y-%m-%dT%H:%M:%S")


def _slurm_duration(seconds: float) -> str:
    minutes = max(1, int(math.ceil(seconds / 60.0)))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def slurm_header(row: dict, meta: dict, record: dict | None = None) -> str:
    """The batch script header for one assignment."""
    job_id = str(row["job_id"])
    start, end = utc(row["start_time"]), utc(row["end_time"])
    count = int(_value(row, "gpu_count") or 0)
    milli = int(_value(row, "gpu_milli") or (1000 if count else 0))
    devices = _devices(row)
    power = _value(row, "power_limit_w")
    deadline = _deadline(row, record)
    cluster = _value(row, "cluster")
    comment = (
        f"plan={meta['plan_id']} job={job_id} region={_value(row, 'region')} cluster={cluster} "
        f"kgco2e={_fmt(_value(row, 'expected_kgco2e'), 6)}"
    )
    lines = [
        "#!/bin/bash",
        f"# Carbon-aware plan {meta['plan_id']} (forecast {meta.get('forecast_version')}); job {job_id}.",
        "# Times are UTC: run slurmctld with TZ=UTC.",
        f"#SBATCH --job-name={file_stem(job_id)}",
        f"#SBATCH --begin={_slurm_time(start)}",
        f"#SBATCH --time={_slurm_duration((end - start).total_seconds())}",
    ]
    if deadline is not None:
        lines.append(f"#SBATCH --deadline={_slurm_time(deadline)}")
    host = node_hostname(_value(row, "node"), cluster)
    if host:
        lines.append(f"#SBATCH --nodelist={host}")
    lines.append("#SBATCH --nodes=1")
    if count:
        if milli >= 1000:
            lines.append(f"#SBATCH --gres=gpu:{count}")
        else:
            per_gpu = int(_value(row, "shards_per_gpu") or SHARDS_PER_GPU)
            shards = int(math.ceil(milli * count * per_gpu / 1000.0))
            lines.append(f"#SBATCH --gres=shard:{max(1, shards)}")
    if _value(row, "cpu_milli") is not None:
        lines.append(f"#SBATCH --cpus-per-task={max(1, int(math.ceil(int(_value(row, 'cpu_milli')) / 1000)))}")
    if _value(row, "memory_mib") is not None:
        lines.append(f"#SBATCH --mem={int(_value(row, 'memory_mib'))}M")
    lines.append(f'#SBATCH --comment="{comment}"')
    lines += [
        "",
        f"export PLAN_ID='{meta['plan_id']}'",
        f"export PLANNED_START='{iso_z(start)}'",
        f"export PLANNED_END='{iso_z(end)}'",
    ]
    if power is not None:
        lines.append(f"export GPU_POWER_LIMIT_W={_fmt(power, 0)}")
        lines.append(
            '# The prolog applies the limit (needs root): nvidia-smi -i "$CUDA_VISIBLE_DEVICES" -pl '
            '"$GPU_POWER_LIMIT_W"'
        )
    if devices:
        lines.append(f"export PLANNED_GPU_DEVICES={','.join(str(d) for d in devices)}")
    run = srun_line(_value(row, "command"))
    lines.append(run or 'srun /bin/sh -c "${JOB_COMMAND:?set JOB_COMMAND to the job command}"')
    return "\n".join(lines) + "\n"


def render(
    plan: Any, plan_id: str | None = None, job_files: dict | None = None, to_wall: ToWall | None = None
) -> dict[str, bytes]:
    """Every file of the schedule directory (relative path -> bytes), except index.json. Pure: no I/O.
    `job_files`: cluster -> the per-job file kinds (`JOB_FILES`) it gets; None = all of them everywhere.
    `to_wall`: plan time -> the time on the clock of whoever starts the jobs (None: the same), for the start, end
    and deadline in the per-job Pod and batch files; the plan and cluster files stay in plan time."""
    return _render(plan_fields(plan), plan_id, job_files, to_wall)


def _on_wall_clock(row: dict, record: dict | None, to_wall: ToWall | None) -> dict:
    """The assignment with its start, end and deadline mapped by `to_wall` (unchanged without one)."""
    if to_wall is None:
        return row
    deadline = _deadline(row, record)
    return {
        **row,
        "start_time": to_wall(utc(row["start_time"])),
        "end_time": to_wall(utc(row["end_time"])),
        "deadline": None if deadline is None else to_wall(deadline),
    }


def _render(
    fields: dict, plan_id: str | None, job_files: dict | None, to_wall: ToWall | None = None
) -> dict[str, bytes]:
    plan_id = plan_id or plan_id_for(fields["policy"], fields["plan_time"])
    meta = _plan_meta(fields, plan_id)
    records = {str(e.get("job_id")): e for e in fields["explanations"]}
    a = fields["assignments"]
    files: dict[str, bytes] = {}
    clusters = sorted({str(c) for c in a["cluster"].dropna()}) if len(a) else []
    summary = summary_of(fields)
    plan_doc = dict(meta)
    plan_doc.update(summary)
    plan_doc["clusters"] = [
        {"cluster": c, "file": f"clusters/{file_stem(c)}.json", "n_assignments": int((a["cluster"] == c).sum())}
        for c in clusters
    ]
    plan_doc["unplaced"] = _assignment_records(fields["unplaced"])
    plan_doc["start_gate"] = {
        "kubernetes": f"schedulingGates[{GATE_NAME}] + init container wait-for-start",
        "slurm": "--begin",
    }
    files["plan.json"] = (canonical_json(plan_doc, indent=2) + "\n").encode()
    for cluster in clusters:
        part = a[a["cluster"] == cluster].sort_values(["start_time", "job_id"], kind="mergesort")
        regions = sorted({str(r) for r in part["region"].dropna()})
        doc = {"plan": meta, "cluster": cluster, "regions": regions, "assignments": _assignment_records(part)}
        stem = file_stem(cluster)
        files[f"clusters/{stem}.json"] = (canonical_json(doc, indent=2) + "\n").encode()
        kinds = JOB_FILES if job_files is None else tuple(job_files.get(cluster, JOB_FILES))
        if not kinds:
            continue
        for row in part.to_dict(orient="records"):
            job = file_stem(str(row["job_id"]))
            record = records.get(str(row["job_id"]))
            row = _on_wall_clock(row, record, to_wall)
            if "k8s" in kinds:
                manifest = k8s_manifest(row, meta, record)
                files[f"k8s/{stem}/{job}.yaml"] = yaml.dump(
                    manifest,
                    Dumper=YAML_DUMPER,
                    sort_keys=True,
                    default_flow_style=False,
                    allow_unicode=True,
                    width=1000,
                ).encode()
            if "slurm" in kinds:
                files[f"slurm/{stem}/{job}.sbatch"] = slurm_header(row, meta, record).encode()
    if len(a) and a["cluster"].isna().any():
        raise ValueError("assignments: every assignment needs a cluster")
    return files


def index_document(files: dict[str, bytes], meta: dict) -> bytes:
    entries = [{"path": p, "sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for p, b in sorted(files.items())]
    doc = dict(meta)
    doc["files"] = entries
    doc["n_files"] = len(entries)
    return (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode()


# ------------------------------------------------------------------------------------------------ atomic writing


@dataclass
class ScheduleResult:
    path: Path
    plan_id: str
    files: list[str]  # relative paths, index.json included

    def as_dict(self) -> dict:
        return {"path": str(self.path), "plan_id": self.plan_id, "files": list(self.files)}


@contextlib.contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if os.environ.get("SCHEDULES_NO_EXCHANGE"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    rc = fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


def recover(root: str | Path) -> list[str]:
    """Clean up after a killed writer (call with the root's lock held, as `write_schedules` does): put an aside
    copy back where the final directory is missing, drop other asides and all temporary directories. Returns
    what it did."""
    root = Path(root)
    actions = []
    if not root.exists():
        return actions
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".old-") and entry.is_dir():
            final = root / entry.name[len(".old-") :]
            if not final.exists():
                os.rename(entry, final)
                actions.append(f"restored {final.name}")
            else:
                shutil.rmtree(entry)
                actions.append(f"removed {entry.name}")
        elif entry.name.startswith(".tmp-") and entry.is_dir():
            shutil.rmtree(entry)
            actions.append(f"removed {entry.name}")
    if actions:
        _fsync_dir(root)
    return actions


def _noop(stage: str, path: str | None = None) -> None:
    return None


def write_schedules(
    plan: Any,
    root: str | Path | None = None,
    *,
    plan_id: str | None = None,
    job_files: dict | None = None,
    to_wall: ToWall | None = None,
    _fault: Callable[[str, str | None], None] = _noop,
) -> ScheduleResult:
    """Write the schedule directory of `plan` under `root` atomically (see the module doc; `job_files` and
    `to_wall` as `render`).

    `_fault(stage, path)` is a test hook: called after each file ("file", path), then ("built", None) before the
    swap, ("swapped", None) between renames (fallback path only) and ("done", None)."""
    root = Path(root or default_root())
    fields = plan_fields(plan)
    plan_id = plan_id or plan_id_for(fields["policy"], fields["plan_time"])
    name = schedule_dirname(fields["plan_time"])
    files = _render(fields, plan_id, job_files, to_wall)
    files[INDEX] = index_document(files, _plan_meta(fields, plan_id))
    final = root / name
    with _root_lock(root):
        recover(root)
        tmp = root / f".tmp-{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        # index.json goes last: a directory with an index is complete.
        order = sorted(p for p in files if p != INDEX) + [INDEX]
        dirs = set()
        for rel in order:
            target = tmp / rel
            _write_file(target, files[rel])
            dirs.add(target.parent)
            _fault("file", rel)
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(d)
        _fsync_dir(tmp)
        _fault("built", None)
        if final.exists():
            if _exchange(tmp, final):
                _fsync_dir(root)
                _fault("swapped", None)
                shutil.rmtree(tmp)  # now holds the old version
            else:
                aside = root / f".old-{name}"
                if aside.exists():
                    shutil.rmtree(aside)
                os.rename(final, aside)
                _fsync_dir(root)
                _fault("swapped", None)
                os.rename(tmp, final)
                _fsync_dir(root)
                shutil.rmtree(aside)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
        _fault("done", None)
    return ScheduleResult(path=final, plan_id=plan_id, files=sorted(files))


def verify_schedule_dir(path: str | Path) -> dict:
    """Check every file listed in index.json against its sha256; raises ValueError naming the first mismatch."""
    path = Path(path)
    index = json.loads((path / INDEX).read_text())
    for entry in index["files"]:
        data = (path / entry["path"]).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise ValueError(f"{path / entry['path']}: sha256 {digest} != index {entry['sha256']}")
    listed = {e["path"] for e in index["files"]} | {INDEX}
    present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    extra = sorted(present - listed)
    if extra:
        raise ValueError(f"{path}: files not in index.json: {extra[:5]}")
    return index


def tree_digest(path: str | Path) -> dict[str, str]:
    """sha256 of every file under `path` (relative path -> hex)."""
    path = Path(path)
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }
