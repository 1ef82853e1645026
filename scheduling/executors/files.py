"""`files`: the hand-off executor. Dispatching writes schedule files for another system to start the jobs: one
JSON per cluster, a gated Kubernetes Pod and a Slurm batch header per job (`scheduling.output.schedules`).

Layout: ``<root>/<plan time>/`` exactly as `write_schedules` writes it, holding the plan's *dispatched* jobs (the
items of every dispatch under that plan_id so far); root is the setting ``root``, default ``$VAR_DIR/dispatch``
(apart from ``var/schedules``, where the hourly plan writes every assignment, tentative ones included). Each
dispatch rewrites the directory atomically with the earlier items plus the new ones, so after a call either all of
its jobs' files are there or none; `lookup` answers from ``index.json``. The `executor_ref` of a job is its two
files, ``<k8s yaml>;<slurm sbatch>`` (absolute paths).

Fail-open: the files carry the start (Pod scheduling gate + init-container wait, Slurm ``--begin``); whoever
applies them starts the job at its planned time without the planner.

What ran is not visible from files, so `sync` reports what it can: ``dispatched`` at the plan time, and
``unconfirmed`` at the planned start of every dispatched job (each once: the windows partition the events).
An executor that went silent is reported, not assumed; nothing here claims a job started or finished.

`running(now)`, the safe choice: the jobs whose *planned* window covers `now` (start_time <= now < end_time), with
``confirmed = False``. Reporting nothing would let the planner hand their GPUs to other jobs while they may well
be running; reporting the plan keeps those GPUs committed until the planned end (a job that overruns its plan is
not seen). Cancelled jobs (below) are left out from their cancel time.

`cancel(job_id, now)` cannot stop a job it handed off: it hands off the request instead, a JSON file
``<root>/cancel/<plan time>/<cluster>/<job>.json`` (job, plan, time, Pod namespace/name, Slurm job name) for the
consumer to act on (``kubectl delete pod``, ``scancel``), and `sync` reports ``cancelled`` at that time (a job
cancelled before its planned start gets no ``unconfirmed``).

Clock: events, `running` and the plan and cluster files are in plan time. The per-job Pod and batch files carry the
start, end and deadline on the consumer's clock, ``clock.to_wall(plan time)`` (`clock.PlanClock`; identity without
the setting), so a replayed plan handed to a live cluster starts its jobs at the mapped times.

Settings: ``root``, ``shards_per_gpu`` (the Slurm cluster's shards per GPU, for the batch scripts'
``--gres=shard:N``: files cannot ask the cluster; default the schedule files' 10), ``lookback_h`` (default 168:
`sync`/`running` read the plan directories of the last `lookback_h` hours before the window; a job dispatched
longer before its start is not reported), ``clock`` (``plan_origin``, ``wall_origin``, ``seconds_per_hour``),
``name``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from common.jsonutil import canonical_json
from common.timeutil import iso_z, utc
from scheduling.domain.plan import Plan
from scheduling.executors.base import (
    EVENT_COLUMNS,
    RECORD_COLUMNS,
    RUNNING_COLUMNS,
    DuplicateDispatchError,
    Executor,
    check_window,
    in_window,
    plan_time_of,
    sort_events,
    typed_frame,
)
from scheduling.executors.clock import PlanClock
from scheduling.executors.items import check_items, split_job_id
from scheduling.output.plan_store import parse_plan_id
from scheduling.output.schedules import (
    INDEX,
    NAMESPACE,
    dns_label,
    file_stem,
    resolve_schedule_dir,
    schedule_dir_for,
    write_schedules,
)
from warehouse.config import var_dir

CANCEL_DIR = "cancel"
DEFAULT_LOOKBACK_H = 168.0
_DIR_FORMATS = ("%Y-%m-%dT%H-%MZ", "%Y-%m-%dT%H-%M-%SZ")


def default_root() -> Path:
    return var_dir() / "dispatch"


def job_files(cluster: str, job_id: str) -> tuple[str, str]:
    """The Kubernetes and Slurm files of one job, relative to its plan directory."""
    stem, job = file_stem(str(cluster)), file_stem(str(job_id))
    return f"k8s/{stem}/{job}.yaml", f"slurm/{stem}/{job}.sbatch"


def _dir_time(name: str) -> pd.Timestamp | None:
    for fmt in _DIR_FORMATS:
        try:
            return pd.Timestamp(pd.to_datetime(name, format=fmt, utc=True))
        except ValueError:
            continue
    return None


def _val(row: dict, key: str):
    """row[key], with NaN / NA (a column some plan directories lack) as None."""
    value = row.get(key)
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else value


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class FilesExecutor(Executor):
    """Writes schedule files (see the module doc). Settings: `root`, `shards_per_gpu`, `lookback_h`, `clock`,
    `name`."""

    kind = "files"
    SETTINGS = ("name", "root", "lookback_h", "shards_per_gpu", "clock")

    def __init__(
        self,
        *,
        db_path=None,
        name: str | None = None,
        root: str | Path | None = None,
        lookback_h: float = DEFAULT_LOOKBACK_H,
        shards_per_gpu: int | None = None,
        clock: Mapping | None = None,
    ):
        super().__init__(name)
        self.clock = PlanClock.from_setting(clock, f"executor {self.name!r}: clock")
        if shards_per_gpu is not None and not (
            isinstance(shards_per_gpu, int) and not isinstance(shards_per_gpu, bool) and shards_per_gpu >= 1
        ):
            raise ValueError(f"executor {self.name!r}: setting 'shards_per_gpu' must be an integer >= 1")
        self.shards_per_gpu = shards_per_gpu
        self.db_path = db_path  # unused: the files are the executor's whole state
        self.root = Path(root) if root else default_root()
        self.lookback = pd.Timedelta(hours=float(lookback_h))
        if self.lookback <= pd.Timedelta(0):
            raise ValueError(f"executor {self.name!r}: setting 'lookback_h' must be > 0, got {lookback_h!r}")

    # ------------------------------------------------------------------------------------------- dispatch

    def _ref(self, directory: Path, cluster: str, job_id: str) -> str:
        return ";".join(str((directory / rel).resolve()) for rel in job_files(cluster, job_id))

    def _index(self, plan_id: str) -> tuple[Path | None, dict | None]:
        """The plan's directory and index (None, None when nothing was dispatched under its time); ValueError when
        the directory belongs to another plan of the same time."""
        directory = resolve_schedule_dir(plan_time_of(plan_id), self.root)
        if directory is None or not (directory / INDEX).exists():
            return None, None
        index = _read_json(directory / INDEX)
        if index.get("plan_id") != plan_id:
            raise ValueError(
                f"executor {self.name!r}: {directory} holds plan {index.get('plan_id')!r}, not {plan_id!r}; one plan "
                "per plan time can be dispatched to one files root"
            )
        return directory, index

    def dispatched(self, plan_id: str) -> pd.DataFrame:
        """The assignments dispatched under `plan_id` so far, as written (object columns, JSON values)."""
        directory, index = self._index(plan_id)
        if directory is None:
            return pd.DataFrame()
        return self._assignments(directory, index)

    def _assignments(self, directory: Path, index: dict) -> pd.DataFrame:
        records = []
        for entry in index.get("files", []):
            if entry["path"].startswith("clusters/"):
                records += _read_json(directory / entry["path"]).get("assignments", [])
        if not records:
            return pd.DataFrame()
        return pd.DataFrame(records, dtype=object)

    def dispatch(self, plan_id: str, items: pd.DataFrame) -> pd.DataFrame:
        """Rewrite the plan's directory with the earlier dispatched jobs plus `items` (one atomic write);
        DuplicateDispatchError when one of them is there already."""
        policy, plan_time, _ = parse_plan_id(plan_id)
        plan_time_of(plan_id)
        items = check_items(items)
        early = items["start_time"] < plan_time
        records = [
            {"job_id": job, "executor_ref": None, "error": f"start_time {start} is before the plan's time {plan_time}"}
            for job, start in zip(items.loc[early, "job_id"], items.loc[early, "start_time"])
        ]
        items = items[~early]
        if items.empty:
            return pd.DataFrame(records, columns=list(RECORD_COLUMNS))
        earlier = self.dispatched(plan_id)
        if len(earlier):
            dup = sorted(set(earlier["job_id"].astype(str)) & set(items["job_id"]))
            if dup:
                raise DuplicateDispatchError(
                    f"executor {self.name!r}, plan {plan_id}: job(s) {dup[:5]} were dispatched already"
                )
        forecast_version = None
        if "forecast_version" in items.columns and items["forecast_version"].notna().any():
            forecast_version = str(items["forecast_version"].dropna().iloc[0])
        else:
            directory, _ = self._index(plan_id)
            if directory is not None:
                forecast_version = _read_json(directory / "plan.json").get("forecast_version")
        if self.shards_per_gpu is not None:  # the .sbatch files' --gres=shard:N (else the files' default)
            items = items.assign(shards_per_gpu=self.shards_per_gpu)
        union = pd.concat([earlier, items], ignore_index=True) if len(earlier) else items
        plan = Plan(plan_time=plan_time, policy=policy, forecast_version=forecast_version, assignments=union)
        result = write_schedules(plan, self.root, plan_id=plan_id, to_wall=self.clock.to_wall)
        for row in items.to_dict(orient="records"):
            records.append(
                {"job_id": row["job_id"], "executor_ref": self._ref(result.path, row["cluster"], row["job_id"])}
            )
        return pd.DataFrame(records, columns=list(RECORD_COLUMNS))

    def lookup(self, plan_id: str, job_id: str) -> str | None:
        directory, index = self._index(plan_id)
        if directory is None:
            return None
        listed = {e["path"] for e in index.get("files", [])}
        for row in self._assignments(directory, index).to_dict(orient="records"):
            if str(row["job_id"]) == str(job_id):
                k8s, slurm = job_files(row["cluster"], row["job_id"])
                if k8s in listed and slurm in listed:
                    return self._ref(directory, row["cluster"], row["job_id"])
        return None

    # ------------------------------------------------------------------------------------------- reading

    def _plan_dirs(self, earliest: pd.Timestamp | None, latest: pd.Timestamp) -> list[tuple[pd.Timestamp, Path]]:
        """Complete plan directories with earliest < plan time <= latest, oldest first."""
        if not self.root.exists():
            return []
        out = []
        for entry in self.root.iterdir():
            when = None if entry.name.startswith(".") else _dir_time(entry.name)
            if when is None or not entry.is_dir() or not (entry / INDEX).exists():
                continue
            if when <= latest and (earliest is None or when > earliest):
                out.append((when, entry))
        return sorted(out)

    def _jobs(self, earliest: pd.Timestamp | None, latest: pd.Timestamp) -> pd.DataFrame:
        """Dispatched assignments of the plan directories in (earliest, latest], with plan_id and dispatched_at."""
        frames = []
        for when, directory in self._plan_dirs(earliest, latest):
            index = _read_json(directory / INDEX)
            frame = self._assignments(directory, index)
            if frame.empty:
                continue
            frame = frame.copy()
            frame["plan_id"] = index["plan_id"]
            frame["dispatched_at"] = when
            frame["executor_ref"] = [self._ref(directory, c, j) for c, j in zip(frame["cluster"], frame["job_id"])]
            frames.append(frame)
        if not frames:
            return pd.DataFrame(columns=["job_id", "plan_id", "start_time", "end_time", "dispatched_at"])
        jobs = pd.concat(frames, ignore_index=True)
        for col in ("start_time", "end_time", "dispatched_at"):
            jobs[col] = pd.to_datetime(jobs[col], utc=True)
        return jobs

    def cancellations(self) -> dict[tuple[str, str], pd.Timestamp]:
        """(plan_id, job_id) -> the time its cancellation was handed off."""
        base = self.root / CANCEL_DIR
        out = {}
        if base.exists():
            for path in sorted(base.rglob("*.json")):
                doc = _read_json(path)
                out[(doc["plan_id"], doc["job_id"])] = utc(doc["at"])
        return out

    def sync(self, now, since=None) -> pd.DataFrame:
        since, now = check_window(since, now)
        jobs = self._jobs(None if since is None else since - self.lookback, now)
        cancels = self.cancellations()
        events = []
        for row in jobs.to_dict(orient="records"):
            tenant, queue_id = split_job_id(row["job_id"])
            base = {
                "tenant": _val(row, "tenant") or tenant,
                "job_id": _val(row, "queue_job_id") or queue_id,
                "planner_job_id": row["job_id"],
                "executor": self.name,
                "executor_ref": row["executor_ref"],
                "plan_id": row["plan_id"],
                "attempt": _val(row, "attempt"),
                "cluster": row["cluster"],
                "node": _val(row, "node"),
                "gpu_devices": _val(row, "gpu_devices"),
                "gpu_count": _val(row, "gpu_count"),
                "gpu_milli": _val(row, "gpu_milli"),
                "power_limit_w": _val(row, "power_limit_w"),
                "energy_kwh": None,
            }
            cancelled = cancels.get((row["plan_id"], row["job_id"]))
            events.append({**base, "event": "dispatched", "event_time": row["dispatched_at"]})
            if cancelled is None or cancelled > row["start_time"]:
                events.append({**base, "event": "unconfirmed", "event_time": row["start_time"]})
            if cancelled is not None:
                events.append({**base, "event": "cancelled", "event_time": cancelled})
        frame = typed_frame(events, EVENT_COLUMNS)
        return sort_events(frame[in_window(frame["event_time"], since, now)])

    def running(self, now) -> pd.DataFrame:
        now = utc(now)
        jobs = self._jobs(now - self.lookback, now)
        if len(jobs):
            jobs = jobs[(jobs["start_time"] <= now) & (jobs["end_time"] > now)]
        cancels = self.cancellations()
        rows = []
        for row in jobs.to_dict(orient="records"):
            cancelled = cancels.get((row["plan_id"], row["job_id"]))
            if cancelled is not None and cancelled <= now:
                continue
            tenant, queue_id = split_job_id(row["job_id"])
            rows.append(
                {
                    **{k: _val(row, k) for k in RUNNING_COLUMNS if k in row},
                    "tenant": _val(row, "tenant") or tenant,
                    "queue_job_id": _val(row, "queue_job_id") or queue_id,
                    "executor": self.name,
                    "confirmed": False,
                }
            )
        return typed_frame(rows, RUNNING_COLUMNS).sort_values("job_id", kind="mergesort").reset_index(drop=True)

    # ------------------------------------------------------------------------------------------- cancel

    def cancel(self, job_id: str, now) -> bool:
        """Hand off a cancellation request for every dispatched, not yet ended (planned), not yet cancelled job."""
        now = utc(now)
        jobs = self._jobs(now - self.lookback, now)
        if jobs.empty:
            return False
        jobs = jobs[(jobs["job_id"].astype(str) == str(job_id)) & (jobs["end_time"] > now)]
        cancels = self.cancellations()
        done = False
        for row in jobs.to_dict(orient="records"):
            if (row["plan_id"], row["job_id"]) in cancels:
                continue
            plan_dir = schedule_dir_for(row["dispatched_at"], self.root).name
            path = self.root / CANCEL_DIR / plan_dir / file_stem(row["cluster"]) / f"{file_stem(row['job_id'])}.json"
            doc = {
                "job_id": row["job_id"],
                "plan_id": row["plan_id"],
                "at": iso_z(now),
                "cluster": row["cluster"],
                "node": _val(row, "node"),
                "kubernetes": {"namespace": NAMESPACE, "pod": dns_label(str(row["job_id"]))},
                "slurm": {"job_name": file_stem(str(row["job_id"]))},
            }
            _write_atomic(path, (canonical_json(doc, indent=2) + "\n").encode())
            done = True
        return done


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
