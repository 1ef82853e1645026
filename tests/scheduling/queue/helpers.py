"""Helpers of the job-queue tests: a valid job mapping, job files, the stored rows and the quarantine."""

from __future__ import annotations

from pathlib import Path

import duckdb
import yaml

AS_OF = "2021-07-15T12:00:00Z"


def good_job(**over) -> dict:
    """A job valid against the default fleet; `over` replaces fields (None removes one)."""
    job = {
        "tenant": "ml",
        "job_id": "j1",
        "submitted_at": "2021-07-15T11:30:00Z",
        "gpus": 1,
        "cpu_milli": 4000,
        "memory_mib": 16384,
        "job_type": "ResNet-50 (batch size 64)",
        "est_duration_h": 4.0,
        "flexibility": 0.5,
        "home_region": "us-west",
        "input_gb": 20.0,
        "image": "registry.example/train:latest",
        "command": ["python", "train.py"],
    }
    job.update(over)
    return {k: v for k, v in job.items() if v is not None}


def write_yaml(path: Path, jobs: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"jobs": jobs}, sort_keys=False, allow_unicode=True))
    return path


def quarantine(db: Path) -> list[dict]:
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute(
            "SELECT batch_id, file, row_number, field, value, reason, record FROM quarantine.rejected_rows "
            "WHERE table_name = 'queue.jobs' ORDER BY row_number, field"
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def stored(db: Path) -> dict[str, dict]:
    with duckdb.connect(str(db), read_only=True) as con:
        cur = con.execute("SELECT * FROM queue.jobs ORDER BY tenant, job_id")
        names = [d[0] for d in cur.description]
        return {f"{r[0]}/{r[1]}": dict(zip(names, r)) for r in cur.fetchall()}
