"""The intake: submitted jobs (a file, the DAG form, rows of `queue.submissions`) into `queue.jobs`.

    report = submit_file("jobs.yaml", tenant="ml", as_of="2021-07-15T12:00Z")   # -> IntakeReport
    report = submit_mappings([{...}], source="airflow:submit_jobs", as_of=...)
    report = intake_staging(as_of=...)                                           # queue.submissions -> queue.jobs

Each job is parsed (`scheduling.queue.spec`) and checked against the fleet (`scheduling.queue.checks`); a job id
given twice in one submission is refused for every occurrence (which one was meant is not ours to guess). Then,
per (tenant, job_id): a new job is inserted `queued` (**accepted**); the same spec again (same `spec_hash`) is a
no-op (**unchanged**); a different spec is refused unless `replace=True` and the stored job is still `queued`
(**replaced**). Every refused job is **rejected**: one row per bad field goes to `quarantine.rejected_rows`
(table_name `queue.jobs`, the submission's batch id, file, row, field, value, the message naming the job and the
field, the job's record), through the warehouse's quarantine helper; good jobs land all the same, and nothing
stored is lost or changed by a rejected one. Everything happens in one transaction.

Idempotence: a submission's batch id hashes its source, content and options, so submitting the same file again
finds every job unchanged and the same rejections, and rewrites nothing: the warehouse stays identical. The staging
table's rows are batches of their own (a rejected row stays in `queue.submissions` until it is fixed or deleted).
Times come from the submission (`submitted_at`, else `as_of`); `_loaded_at` of quarantined rows is `as_of`, else
the time the intake ran (it is bookkeeping, not planning).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from common.timeutil import iso_z, utc
from scheduling.domain.fleet import load_fleet
from scheduling.queue import store
from scheduling.queue.checks import FleetFacts, check_jobs
from scheduling.queue.files import RawJob, read_job_file, read_text
from scheduling.queue.spec import (
    USER_FIELDS,
    FieldError,
    JobSpec,
    JobSpecError,
    is_missing,
    job_label,
    parse_job,
)
from warehouse.db import Rejection, rejection_rows, replace_rejections, table_exists, writer

STATUSES = ("accepted", "unchanged", "replaced", "rejected")


@dataclass
class Outcome:
    """What became of one submitted job."""

    job: str  # planner id tenant/job_id, or the best label of a job that has none
    status: str  # accepted | unchanged | replaced | rejected
    where: str
    row_number: int | None = None
    flags: list[str] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)  # {field, value, reason, message}


@dataclass
class IntakeReport:
    source: str
    batch_id: str
    outcomes: list[Outcome]

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(o.status == s for o in self.outcomes) for s in STATUSES}

    @property
    def rejected(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "rejected"]

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "batch_id": self.batch_id,
            "counts": self.counts,
            "jobs": [o.__dict__ for o in self.outcomes],
        }


def fleet_facts(fleet=None, fleet_path=None, data_dir=None) -> FleetFacts:
    """The facts the checks need, of `fleet` or the fleet file `fleet_path` (default scheduling/domain/fleet.yaml)."""
    if fleet is None:
        fleet = load_fleet(fleet_path, data_dir=data_dir)
    return FleetFacts.of(fleet, data_dir=data_dir)


def submit_file(
    path,
    *,
    tenant: str | None = None,
    replace: bool = False,
    as_of=None,
    facts: FleetFacts | None = None,
    fleet_path=None,
    created_from: str | None = None,
    db_path=None,
    data_dir=None,
) -> IntakeReport:
    """Submit every job of a YAML/JSON/CSV file (`scheduling.queue.files`); JobFileError when the file as a whole
    cannot be read (nothing is written then)."""
    path = Path(path)
    raws = read_job_file(path)
    content = read_text(path)
    return submit_raw(
        raws,
        source=str(path.resolve()),
        content=content,
        file=str(path),
        tenant=tenant,
        replace=replace,
        as_of=as_of,
        facts=facts,
        fleet_path=fleet_path,
        created_from=created_from or f"file:{path.name}",
        db_path=db_path,
        data_dir=data_dir,
    )


def submit_mappings(
    jobs: Sequence[dict],
    *,
    source: str,
    tenant: str | None = None,
    replace: bool = False,
    as_of=None,
    facts: FleetFacts | None = None,
    fleet_path=None,
    created_from: str | None = None,
    db_path=None,
    data_dir=None,
) -> IntakeReport:
    """Submit jobs given as mappings (the DAG form, a caller's own list); rows are numbered from 1."""
    raws = [RawJob(i + 1, f"{source} job #{i + 1}", job) for i, job in enumerate(jobs)]
    content = json.dumps(list(jobs), sort_keys=True, default=str)
    return submit_raw(
        raws,
        source=source,
        content=content,
        file=None,
        tenant=tenant,
        replace=replace,
        as_of=as_of,
        facts=facts,
        fleet_path=fleet_path,
        created_from=created_from or source,
        db_path=db_path,
        data_dir=data_dir,
    )


def submit_raw(
    raws: Sequence[RawJob],
    *,
    source: str,
    content: str,
    file: str | None,
    tenant: str | None,
    replace: bool,
    as_of,
    facts: FleetFacts | None,
    fleet_path,
    created_from: str,
    db_path,
    data_dir,
) -> IntakeReport:
    """The intake of already-read jobs (see the module doc), in one writer transaction."""
    as_of_ts = None if as_of is None or str(as_of).strip() == "" else _as_of(as_of)
    facts = facts or fleet_facts(fleet_path=fleet_path, data_dir=data_dir)
    batch_id = _batch_id(source, content, tenant, replace, as_of_ts)
    with writer(db_path) as con:
        store.ensure(con)
        con.execute("BEGIN TRANSACTION")
        try:
            report = _intake(con, raws, source, batch_id, file, tenant, replace, as_of_ts, facts, created_from)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return report


def intake_staging(
    *,
    as_of=None,
    facts: FleetFacts | None = None,
    fleet_path=None,
    replace: bool = False,
    db_path=None,
    data_dir=None,
) -> IntakeReport:
    """Move the rows of `queue.submissions` into queue.jobs with the same checks, in one transaction: the rows that
    land (or were there already) are deleted from the staging table; a rejected row stays there, to be fixed
    (UPDATE) or removed (DELETE), and its reasons go to the quarantine under a batch id that hashes the row, so
    running the intake again re-quarantines nothing. A row without `submitted_at` takes `as_of`; without either
    it is rejected."""
    as_of_ts = None if as_of is None or str(as_of).strip() == "" else _as_of(as_of)
    facts = facts or fleet_facts(fleet_path=fleet_path, data_dir=data_dir)
    with writer(db_path) as con:
        store.ensure(con)
        con.execute("BEGIN TRANSACTION")
        try:
            rows = store.read_submissions(con)
            # no row number: a row's position changes as rows leave the table; its batch id names it
            raws = [RawJob(None, store.SUBMISSIONS, data) for _, data in rows]
            batches = [
                _batch_id(store.SUBMISSIONS, json.dumps(data, sort_keys=True, default=str), None, replace, as_of_ts)
                for _, data in rows
            ]
            report = _intake(
                con, raws, store.SUBMISSIONS, batches, None, None, replace, as_of_ts, facts, f"sql:{store.SUBMISSIONS}"
            )
            moved = [rowid for (rowid, _), o in zip(rows, report.outcomes) if o.status != "rejected"]
            store.delete_submissions(con, moved)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return report


# ------------------------------------------------------------------------------------------------ the core
def _as_of(value) -> pd.Timestamp:
    try:
        return utc(value)
    except (ValueError, TypeError):
        raise ValueError(f"as_of must be an ISO date/time such as 2021-07-15T12:00Z, got {value!r}") from None


def _batch_id(source: str, content: str, tenant, replace: bool, as_of) -> str:
    key = json.dumps([source, tenant, bool(replace), None if as_of is None else iso_z(as_of)])
    digest = hashlib.sha256((key + "\n" + content).encode()).hexdigest()[:16]
    return f"{source}#{digest}"


def _raw_key(data, tenant: str | None) -> tuple[str, str] | None:
    if not isinstance(data, dict) or is_missing(data.get("job_id")):
        return None
    t = data.get("tenant")
    t = tenant if is_missing(t) else t
    return (str(t).strip() if t is not None else "", str(data["job_id"]).strip())


def _intake(con, raws, source, batch_id, file, tenant, replace, as_of, facts, created_from) -> IntakeReport:
    """The intake of `raws` on an open transaction. `batch_id`: the submission's quarantine batch, or one per raw
    job (a list; the staging table's rows)."""
    n = len(raws)
    specs: list[JobSpec | None] = [None] * n
    errors: list[list[FieldError]] = [[] for _ in range(n)]
    wheres: list[str] = []
    for i, raw in enumerate(raws):
        data = raw.data
        labelled = {**data, "tenant": tenant} if isinstance(data, dict) and is_missing(data.get("tenant")) else data
        where = job_label(labelled, raw.where)
        wheres.append(where)
        if raw.error:
            errors[i].append(FieldError(None, None, raw.error))
            continue
        try:
            specs[i] = parse_job(data, default_tenant=tenant, default_submitted_at=as_of, where=where)
        except JobSpecError as exc:
            errors[i].extend(exc.errors)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, raw in enumerate(raws):
        key = _raw_key(raw.data, tenant)
        if key is not None:
            groups[key].append(i)
    for (_, job_id), rows in groups.items():
        if len(rows) > 1:
            places = ", ".join(str(raws[r].row_number) for r in rows if raws[r].row_number is not None)
            reason = f"appears {len(rows)} times in this submission" + (f" (rows {places})" if places else "")
            for r in rows:
                errors[r].append(FieldError("job_id", job_id, reason))
                specs[r] = None
    ok = [i for i in range(n) if specs[i] is not None and not errors[i]]
    for i, (spec, errs) in zip(ok, check_jobs([specs[i] for i in ok], facts)):
        specs[i] = spec
        errors[i].extend(errs)

    ok = [i for i in range(n) if not errors[i]]
    stored = store.fetch(con, [(specs[i].tenant, specs[i].job_id) for i in ok])
    outcomes: list[Outcome] = []
    status: dict[int, str] = {}
    for i in ok:
        spec = specs[i]
        row = stored.get((spec.tenant, spec.job_id))
        if row is None:
            store.insert_job(con, spec, created_from)
            status[i] = "accepted"
        elif row["spec_hash"] == spec.spec_hash():
            status[i] = "unchanged"
        else:
            differ = _differing(store.spec_of(row), spec)
            if not replace:
                reason = (
                    f"a different spec is stored under this id (fields {', '.join(differ)} differ; state "
                    f"{row['state']}); pass --replace to replace it while it is queued"
                )
                errors[i].append(FieldError(differ[0] if differ else "job_id", spec.job_id, reason))
            elif row["state"] != "queued":
                reason = f"cannot replace: the stored job is {row['state']} (replace is allowed only while queued)"
                errors[i].append(FieldError("job_id", spec.job_id, reason))
            else:
                at = (as_of if as_of is not None else pd.Timestamp(spec.submitted_at)).to_pydatetime()
                store.replace_job(con, spec, at, created_from)
                status[i] = "replaced"
    per_row = isinstance(batch_id, list)
    rejections: dict[str, list[Rejection]] = defaultdict(list)
    if not per_row:
        rejections[batch_id] = []
    for i, raw in enumerate(raws):
        spec = specs[i]
        job = spec.planner_id if spec is not None else _label_id(raw.data, tenant)
        if errors[i]:
            record = raw.data if isinstance(raw.data, dict) else {"value": raw.data}
            for e in errors[i]:
                rejections[batch_id[i] if per_row else batch_id].append(
                    Rejection(
                        reason=e.message(wheres[i]),
                        file=file,
                        row_number=raw.row_number,
                        field=e.field,
                        value=None if e.value is None else str(e.value),
                        record=record,
                    )
                )
            detail = [
                {"field": e.field, "value": e.value, "reason": e.reason, "message": e.message(wheres[i])}
                for e in errors[i]
            ]
            outcomes.append(Outcome(job, "rejected", raw.where, raw.row_number, [], detail))
        else:
            outcomes.append(Outcome(job, status[i], raw.where, raw.row_number, list(spec.flags)))
    for batch, rows in rejections.items():
        _quarantine(con, batch, source, rows, as_of)
    return IntakeReport(source, f"{source}#<row hash>" if per_row else batch_id, outcomes)


def _label_id(data, tenant) -> str:
    key = _raw_key(data, tenant)
    if key is None:
        return "(no job_id)"
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def _differing(old: JobSpec, new: JobSpec) -> list[str]:
    a, b = old.user_values(), new.user_values()
    return [k for k in USER_FIELDS if k != "submitted_at" and a[k] != b[k]]


def _quarantine(con, batch_id: str, source: str, rejections: list[Rejection], as_of, table: str = store.JOBS) -> None:
    """Replace the batch's quarantined rows of `table`, unless the same rows are there already (a re-run rewrites
    nothing)."""
    new = rejection_rows(table, batch_id, source, rejections)
    cols = list(new[0]) if new else ["table_name"]
    old = []
    if table_exists(con, "quarantine.rejected_rows"):
        cur = con.execute(
            f"SELECT {', '.join(cols)} FROM quarantine.rejected_rows WHERE table_name = ? AND batch_id = ?",
            [table, batch_id],
        )
        old = [dict(zip(cols, r)) for r in cur.fetchall()]
    if sorted(old, key=_row_key) == sorted(new, key=_row_key):
        return
    stamp = as_of if as_of is not None else pd.Timestamp.now(tz="UTC")
    replace_rejections(con, table, batch_id, source, rejections, stamp)


def _row_key(row: dict) -> tuple:
    return tuple("" if row.get(k) is None else str(row.get(k)) for k in ("row_number", "field", "reason", "value"))
